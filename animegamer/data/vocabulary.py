"""The world's vocabulary: the characters, adverbs, motions and backgrounds an MLLM checkpoint was trained on.

The games offer them as choices (browser), list them (``:help`` in the terminal) and warn before a turn runs about
words the model never saw in training: such a turn still plays, but the model can only guess what it means. A
checkpoint carries its vocabulary as ``vocabulary.json`` beside its weights, made from the shot tags of the
training films (:meth:`Vocabulary.from_shots`); a checkpoint without one plays without hints or warnings.

    vocab = load_vocabulary("checkpoints/spriteworld/stage_b")
    vocab.unknown_words("Character: Qiqi; Motion: gently lie down; Background: night bedroom.")
    # ["motion: 'lie', 'down' never seen in training"]
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from animegamer.io import atomic_write_json, resolve_checkpoint
from animegamer.states import ShotTags, TagError, parse_instruction

VOCABULARY_FILE = "vocabulary.json"
FIELDS = ("characters", "adverbs", "motions", "backgrounds")
MAX_ENTRIES = 10_000  # per field: a vocabulary file is read from a checkpoint folder, which may come from anyone
MAX_ENTRY_CHARS = 200
_WORD = re.compile(r"[\w']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


@dataclass(frozen=True)
class Vocabulary:
    characters: tuple[str, ...]
    adverbs: tuple[str, ...]
    motions: tuple[str, ...]
    backgrounds: tuple[str, ...]

    @classmethod
    def from_shots(cls, shots: Iterable[ShotTags], openers: Iterable[ShotTags] = ()) -> Vocabulary:
        """Every subject, adverb, motion and environment of ``shots``, the most frequent first. Backgrounds that
        open a film (``openers``: the films' first shots) come before the others: a background may refer to earlier
        shots (SpriteWorld's memory world says ``still here``), and the first one is the example a new game shows."""
        counts: dict[str, Counter] = {name: Counter() for name in FIELDS}
        for shot in shots:
            counts["characters"][shot.subject] += 1
            if shot.adverb:
                counts["adverbs"][shot.adverb] += 1
            counts["motions"][shot.motion] += 1
            counts["backgrounds"][shot.environment] += 1
        # a count of how often each entry opens a film ranks before its count overall (backgrounds only)
        first = {name: Counter() for name in FIELDS}
        first["backgrounds"].update(shot.environment for shot in openers)
        # most frequent first, ties in alphabetical order: the same shots always give the same file
        vocabulary = cls(**{name: tuple(sorted(c, key=lambda k, c=c, o=first[name]: (-o[k], -c[k], k)))
                            for name, c in counts.items()})
        vocabulary.check("shots")
        return vocabulary

    @classmethod
    def from_json(cls, data: object, source: str = "vocabulary") -> Vocabulary:
        """Validated: four lists of short printable strings (the file comes with a checkpoint from elsewhere)."""
        if not isinstance(data, dict) or set(data) != set(FIELDS):
            raise ValueError(f"{source}: expected an object with exactly the keys {list(FIELDS)}")
        for name in FIELDS:
            entries = data[name]
            if not isinstance(entries, list) or len(entries) > MAX_ENTRIES:
                raise ValueError(f"{source}: {name} must be a list of at most {MAX_ENTRIES} strings")
            for entry in entries:
                if not isinstance(entry, str) or not entry.strip() or len(entry) > MAX_ENTRY_CHARS \
                        or not entry.isprintable():
                    raise ValueError(f"{source}: {name} holds {entry!r}, not a short printable string")
        vocabulary = cls(**{name: tuple(data[name]) for name in FIELDS})
        vocabulary.check(source)
        return vocabulary

    def check(self, source: str = "vocabulary") -> None:
        """Characters, motions and backgrounds must not be empty (adverbs may: not every dataset has them)."""
        empty = [name for name in ("characters", "motions", "backgrounds") if not getattr(self, name)]
        if empty:
            raise ValueError(f"{source}: no {' or '.join(empty)}")

    def to_json(self) -> dict[str, list[str]]:
        return {name: list(getattr(self, name)) for name in FIELDS}

    def placeholder(self) -> str:
        """An instruction made of the vocabulary's first entries (the most frequent; a background that opens a
        film), to show the form on a new game's first turn."""
        motion = " ".join(x for x in (self.adverbs[:1] + self.motions[:1]))
        return f"Character: {self.characters[0]}; Motion: {motion}; Background: {self.backgrounds[0]}."

    def unknown_words(self, instruction: str) -> list[str]:
        """One warning per part of ``instruction`` whose words the model never saw in training ([] if none).

        A character must be one of the trained names; motion and background words must each occur somewhere in the
        trained adverbs + motions / backgrounds. Free text is checked against every trained word.
        """
        try:
            parsed = parse_instruction(instruction)
        except TagError:
            return []  # not playable at all: the game reports that error instead
        if not parsed.structured:
            known = {w for name in FIELDS for entry in getattr(self, name) for w in _words(entry)}
            unknown = list(dict.fromkeys(w for w in _words(parsed.text) if w not in known))
            return [f"{_quoted(unknown)} never seen in training"] if unknown else []
        warnings = []
        if parsed.character.lower() not in {c.lower() for c in self.characters}:
            warnings.append(f"character {parsed.character!r} is not one of {', '.join(self.characters)}")
        for part, text, trained in (("motion", parsed.motion, self.adverbs + self.motions),
                                    ("background", parsed.background, self.backgrounds)):
            known = {w for entry in trained for w in _words(entry)}
            unknown = list(dict.fromkeys(w for w in _words(text) if w not in known))
            if unknown:
                warnings.append(f"{part}: {_quoted(unknown)} never seen in training")
        return warnings

    def describe(self, width: int = 110) -> str:
        """The vocabulary as a few wrapped lines per field, for ``:help``."""
        lines = []
        for name in FIELDS:
            line = f"  {name + ':':<13}"
            for i, entry in enumerate(getattr(self, name)):
                piece = entry + (", " if i < len(getattr(self, name)) - 1 else "")
                if len(line) + len(piece) > width:
                    lines.append(line.rstrip())
                    line = " " * 15
                line += piece
            lines.append(line.rstrip())
        return "\n".join(lines)


def _quoted(words: list[str]) -> str:
    return ", ".join(repr(w) for w in words)


def save_vocabulary(vocabulary: Vocabulary, directory: str | Path) -> Path:
    """Write ``directory/vocabulary.json`` atomically."""
    path = Path(directory) / VOCABULARY_FILE
    atomic_write_json(path, vocabulary.to_json())
    return path


def load_vocabulary(checkpoint: str | Path) -> Vocabulary | None:
    """The vocabulary stored with an MLLM checkpoint (a directory, or a run's ``checkpoints/latest``); None when it
    has none. A malformed file raises ValueError naming it."""
    if not str(checkpoint):
        return None
    try:
        path = resolve_checkpoint(checkpoint) / VOCABULARY_FILE
    except FileNotFoundError:
        return None
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_ENTRIES * len(FIELDS) * (MAX_ENTRY_CHARS + 4):
        raise ValueError(f"{path}: too large for a vocabulary file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON vocabulary file ({exc})") from None
    return Vocabulary.from_json(data, str(path))
