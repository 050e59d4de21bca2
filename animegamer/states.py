"""Shot tags, game instructions and the character state: parse, render, validate, update.

A shot tag line (captioner and benchmark output, one shot per line)::

    <S>Girl</S><MD>run</MD><EV>Forest</EV><ML>3</ML><MA>slowly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>

A game instruction line::

    Character: Qiqi; Motion: gently lie down; Background: night bedroom.

Free text is also a valid instruction. Bad input raises :class:`TagError` naming the line and field.
"""

from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass

NUM_MOTION_LEVELS = 5
STATE_MIN, STATE_MAX, STATE_START, STATE_STEP = 0, 100, 50, 5
MAX_INSTRUCTION_CHARS = 400

# Tag order of a rendered shot line; ML is the motion level ("motion scope" in the paper).
TAG_ORDER = ("S", "MD", "EV", "ML", "MA", "SC", "ET", "ST")
_TAG_FIELDS = {
    "S": "subject",
    "MD": "motion",
    "EV": "environment",
    "ML": "motion_level",
    "MA": "adverb",
    "SC": "social",
    "ET": "entertainment",
    "ST": "stamina",
}
_TAG_RE = re.compile(r"<(\w+)>(.*?)</\1>", re.S)
_INSTRUCTION_RE = re.compile(
    r"^\s*Character\s*:\s*(?P<character>[^;]*?)\s*;\s*Motion\s*:\s*(?P<motion>[^;]*?)\s*;"
    r"\s*Background\s*:\s*(?P<background>.*?)\s*\.?\s*$",
    re.I | re.S,
)


class TagError(ValueError):
    """A tag line, instruction or state value is malformed; the message names the line and field."""

    def __init__(self, message: str, *, source: str = "", line: int | None = None, field: str | None = None):
        where = source or "<input>"
        if line is not None:
            where += f":{line}"
        prefix = f"{where}: " + (f"field {field!r}: " if field else "")
        super().__init__(prefix + message)
        self.source, self.line, self.field = source, line, field


@dataclass(frozen=True)
class StateValues:
    """What the MLLM predicts for one turn besides the shot: motion level and state deltas."""

    motion_level: int  # 1..5
    social: int  # 0 | 1 (the character interacts with someone)
    entertainment: int  # 0 | 1 (a leisure activity)
    stamina: int  # -1 | 0 | +1 (tiring / neutral / restoring)

    def __post_init__(self) -> None:
        validate_values(self)


VALUE_RANGES: dict[str, tuple[int, ...]] = {
    "motion_level": tuple(range(1, NUM_MOTION_LEVELS + 1)),
    "social": (0, 1),
    "entertainment": (0, 1),
    "stamina": (-1, 0, 1),
}


def validate_values(values: StateValues, *, source: str = "", line: int | None = None) -> None:
    for name, allowed in VALUE_RANGES.items():
        value = getattr(values, name)
        if not isinstance(value, int) or isinstance(value, bool) or value not in allowed:
            raise TagError(f"{value!r} is not one of {list(allowed)}", source=source, line=line, field=name)


@dataclass(frozen=True)
class ShotTags:
    """One captioned shot: who does what, where, how much motion, and the state effects."""

    subject: str
    motion: str
    environment: str
    adverb: str
    values: StateValues

    def render(self) -> str:
        """The canonical tag line."""
        v = self.values
        fields = {
            "S": self.subject,
            "MD": self.motion,
            "EV": self.environment,
            "ML": v.motion_level,
            "MA": self.adverb,
            "SC": v.social,
            "ET": v.entertainment,
            "ST": v.stamina,
        }
        return "".join(f"<{tag}>{fields[tag]}</{tag}>" for tag in TAG_ORDER)

    def instruction(self) -> Instruction:
        """The game instruction a player would type for this shot."""
        motion = f"{self.adverb} {self.motion}".strip() if self.adverb else self.motion
        return Instruction(character=self.subject, motion=motion, background=self.environment)

    def motion_text(self) -> str:
        """The motion description fed to T5 when encoding the shot (stage a)."""
        return self.instruction().render()

    def to_dict(self) -> dict:
        return {**{k: v for k, v in asdict(self).items() if k != "values"}, **asdict(self.values)}


def _int_field(text: str, name: str, source: str, line: int | None) -> int:
    try:
        return int(text.strip())
    except ValueError:
        raise TagError(f"{text!r} is not an integer", source=source, line=line, field=name) from None


def parse_tags(text: str, *, source: str = "", line: int | None = None) -> ShotTags:
    """Parse one shot tag line; every tag present exactly once, nothing outside the tags."""
    if not text or not text.strip():
        raise TagError("empty tag line", source=source, line=line)
    found: dict[str, str] = {}
    leftover = _TAG_RE.sub("", text).strip()
    if leftover:
        raise TagError(f"text outside tags: {leftover[:40]!r}", source=source, line=line)
    for tag, value in _TAG_RE.findall(text):
        if tag not in _TAG_FIELDS:
            raise TagError(f"unknown tag <{tag}>", source=source, line=line)
        if tag in found:
            raise TagError(f"tag <{tag}> appears twice", source=source, line=line, field=_TAG_FIELDS[tag])
        found[tag] = value.strip()
    for tag in TAG_ORDER:
        if tag not in found:
            raise TagError(f"missing tag <{tag}>", source=source, line=line, field=_TAG_FIELDS[tag])
    for tag in ("S", "MD", "EV"):
        if not found[tag]:
            raise TagError("must not be empty", source=source, line=line, field=_TAG_FIELDS[tag])
    ints = {_TAG_FIELDS[t]: _int_field(found[t], _TAG_FIELDS[t], source, line) for t in ("ML", "SC", "ET", "ST")}
    try:
        values = StateValues(**ints)
    except TagError as exc:
        raise TagError(str(exc).split(": ", 2)[-1], source=source, line=line, field=exc.field) from None
    return ShotTags(subject=found["S"], motion=found["MD"], environment=found["EV"], adverb=found["MA"], values=values)


@dataclass(frozen=True)
class Instruction:
    """A player's instruction: the structured form, or free text (``text`` only)."""

    character: str = ""
    motion: str = ""
    background: str = ""
    text: str = ""  # set for free-text instructions

    @property
    def structured(self) -> bool:
        return not self.text

    def render(self) -> str:
        if self.text:
            return self.text
        return f"Character: {self.character}; Motion: {self.motion}; Background: {self.background}."


def parse_instruction(
    text: str, *, source: str = "", line: int | None = None, max_chars: int = MAX_INSTRUCTION_CHARS
) -> Instruction:
    """Parse a game instruction. Lines starting with ``Character:`` must be complete; anything else is free text."""
    if text is None or not text.strip():
        raise TagError("empty instruction", source=source, line=line)
    text = " ".join(text.split())
    if len(text) > max_chars:
        raise TagError(f"instruction is {len(text)} characters, more than {max_chars}", source=source, line=line)
    if not text.isprintable():
        raise TagError("instruction contains control characters", source=source, line=line)
    if text.lower().startswith("character"):
        match = _INSTRUCTION_RE.match(text)
        if match is None:
            raise TagError(
                "expected 'Character: …; Motion: …; Background: ….'", source=source, line=line, field="format"
            )
        for name in ("character", "motion", "background"):
            if not match[name].strip():
                raise TagError("must not be empty", source=source, line=line, field=name)
        return Instruction(match["character"].strip(), match["motion"].strip(), match["background"].strip())
    return Instruction(text=text)


def read_game_file(path: str) -> list[Instruction]:
    """Read a game file: one instruction per line; blank lines and ``#`` comments skipped.

    A UTF-8 byte-order mark at the start (as some Windows editors write) is dropped. FileNotFoundError when
    nothing is there; TagError for a directory, a named pipe or a device (never opened: a pipe would block).
    """
    if not os.path.isfile(path):
        if os.path.lexists(path):
            kind = "a directory" if os.path.isdir(path) else "not a regular file"
            raise TagError(f"{kind}, expected a text file with one instruction per line", source=str(path))
        raise FileNotFoundError(path)
    instructions = []
    with open(path, encoding="utf-8-sig") as fh:
        for number, raw in enumerate(fh, start=1):
            stripped = raw.strip()
            if not stripped or stripped.startswith("#"):
                continue
            instructions.append(parse_instruction(stripped, source=str(path), line=number))
    if not instructions:
        raise TagError("no instructions in game file", source=str(path))
    return instructions


@dataclass
class CharacterState:
    """The character's bars: stamina, social, entertainment, each 0..100, starting at 50."""

    stamina: int = STATE_START
    social: int = STATE_START
    entertainment: int = STATE_START

    def update(self, values: StateValues) -> CharacterState:
        """The rule of the game, in one place; returns the new state (self is unchanged).

        Stamina moves by 5 per predicted delta (-1/0/+1). Social and entertainment rise by 5 on a
        turn that has them (1) and fall by 5 on a turn that does not (0): needs decay when neglected.
        Everything is clamped to 0..100.
        """
        validate_values(values)

        def clamp(x: int) -> int:
            return max(STATE_MIN, min(STATE_MAX, x))

        return CharacterState(
            stamina=clamp(self.stamina + STATE_STEP * values.stamina),
            social=clamp(self.social + STATE_STEP * (1 if values.social else -1)),
            entertainment=clamp(self.entertainment + STATE_STEP * (1 if values.entertainment else -1)),
        )

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> CharacterState:
        state = cls(**{k: int(data[k]) for k in ("stamina", "social", "entertainment")})
        for name, value in state.to_dict().items():
            if not STATE_MIN <= value <= STATE_MAX:
                raise TagError(f"{value} outside {STATE_MIN}..{STATE_MAX}", field=name)
        return state


def state_bar(name: str, value: int, width: int = 20) -> str:
    """A text bar for the terminal and the sheet: ``stamina  [#########-----------]  45``."""
    filled = round(width * max(0, min(100, value)) / 100)
    return f"{name:<13} [{'#' * filled}{'-' * (width - filled)}] {value:3d}"
