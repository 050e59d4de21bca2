"""SpriteWorld's world: who (Qiqi, Momo, Kai, Luna), what (walk, run, jump, fly, sleep, eat, read, talk, dance,
play), where (bedroom, kitchen, park, forest, beach, street) and when (morning, noon, evening, night), and the
:class:`ShotSpec` that names one shot of it.

One clip is one shot: a character doing an action in a place at a time of day, drawn with OpenCV (default 64x96,
17 frames at 8 fps; :mod:`animegamer.spriteworld.animate`). Social actions (talk, play) bring a second character.
An adverb says how (slowly < calmly < happily < quickly scale the action's speed).

The tags of every shot follow the world's rules (:meth:`ShotSpec.tags`), in the real pipeline's format
(animegamer.states): ``<SC>`` is 1 for actions with a second character, ``<ET>`` 1 for leisure (read, dance,
play), ``<ST>`` +1 for eat/sleep (restoring), -1 for run/jump/fly/dance (tiring), 0 otherwise; the motion level
comes from the drawn motion.

Films of shots, the dataset on disk and the held-out games: :mod:`animegamer.spriteworld.films`. What a memory
film keeps without saying it: :mod:`animegamer.spriteworld.memory`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from animegamer.data.manifest import ClipRecord
from animegamer.spriteworld.draw import Character
from animegamer.states import Instruction, ShotTags, StateValues, TagError

CHARACTERS: dict[str, Character] = {
    c.name: c
    for c in (
        Character("Qiqi", skin=(255, 218, 190), hair=(240, 105, 170), top=(225, 35, 55), bottom=(120, 30, 40),
                  accent=(255, 255, 255), hair_style="long", outfit="dress", size=1.0),
        Character("Momo", skin=(250, 205, 168), hair=(60, 45, 40), top=(250, 200, 20), bottom=(45, 85, 205),
                  accent=(255, 150, 160), hair_style="ears", outfit="shirt", size=0.92),
        Character("Kai", skin=(232, 186, 145), hair=(250, 135, 20), top=(30, 105, 230), bottom=(55, 55, 70),
                  accent=(30, 105, 230), hair_style="spiky", outfit="shirt", size=1.08),
        Character("Luna", skin=(255, 226, 208), hair=(225, 228, 240), top=(150, 65, 210), bottom=(70, 35, 110),
                  accent=(75, 40, 125), hair_style="hat", outfit="dress", size=1.0),
    )
}
PLACES = ("bedroom", "kitchen", "park", "forest", "beach", "street")
TIMES = ("morning", "noon", "evening", "night")
OUTDOORS = ("park", "forest", "beach", "street")

# Speed (and amplitude) multiplier of each adverb; each action allows a few, slowest first.
ADVERB_SPEED = {
    "soundly": 0.6, "slowly": 0.6, "quietly": 0.6, "gently": 0.7, "calmly": 0.85, "peacefully": 1.0,
    "happily": 1.0, "quickly": 1.4, "excitedly": 1.5, "energetically": 1.5,
}


@dataclass(frozen=True)
class Action:
    name: str
    text: str  # the motion as tags and instructions say it; {friend} is the second character
    adverbs: tuple[str, ...]
    places: tuple[str, ...]
    social: int  # <SC>: a second character takes part
    entertainment: int  # <ET>: a leisure activity
    stamina: int  # <ST>: +1 restoring, -1 tiring, 0 neutral


ACTIONS: dict[str, Action] = {
    a.name: a
    for a in (
        Action("walk", "walk", ("slowly", "calmly", "happily", "quickly"), PLACES, 0, 0, 0),
        Action("run", "run", ("slowly", "happily", "quickly"), OUTDOORS, 0, 0, -1),
        Action("jump", "jump", ("gently", "happily", "energetically"), OUTDOORS, 0, 0, -1),
        Action("fly", "fly", ("slowly", "calmly", "quickly"), OUTDOORS, 0, 0, -1),
        Action("sleep", "sleep", ("soundly", "peacefully"), ("bedroom", "park", "beach"), 0, 0, 1),
        Action("eat", "eat", ("slowly", "happily", "quickly"), ("kitchen", "park", "beach", "street"), 0, 0, 1),
        Action("read", "read a book", ("quietly", "calmly", "happily"), ("bedroom", "kitchen", "park", "beach"),
               0, 1, 0),
        Action("talk", "talk with {friend}", ("calmly", "happily", "excitedly"), PLACES, 1, 0, 0),
        Action("dance", "dance", ("gently", "happily", "energetically"), ("bedroom", "park", "beach", "street"),
               0, 1, -1),
        Action("play", "play ball with {friend}", ("gently", "happily", "energetically"), OUTDOORS, 1, 1, 0),
    )
}
# Relative weights of the next action given the current one (a day's plausible successions).
TRANSITIONS: dict[str, dict[str, float]] = {
    "sleep": {"eat": 4, "read": 2, "walk": 2, "dance": 1},
    "eat": {"walk": 3, "talk": 2, "read": 2, "run": 1, "dance": 1},
    "walk": {"run": 2, "talk": 2, "jump": 1, "eat": 1, "read": 1, "play": 1, "fly": 1, "dance": 1},
    "run": {"jump": 2, "walk": 2, "fly": 2, "run": 1},
    "jump": {"run": 2, "fly": 2, "dance": 2, "walk": 1},
    "fly": {"walk": 2, "jump": 1, "fly": 1, "run": 1, "dance": 1},
    "talk": {"play": 2, "walk": 2, "dance": 1, "eat": 1, "talk": 1},
    "read": {"sleep": 2, "eat": 1, "talk": 1, "walk": 2, "read": 1},
    "dance": {"talk": 2, "walk": 1, "play": 1, "dance": 1, "sleep": 1},
    "play": {"talk": 1, "run": 2, "dance": 1, "jump": 1, "eat": 1},
}
# Where an action usually happens when the character moves somewhere new for it.
HOME = {"sleep": "bedroom", "eat": "kitchen", "read": "bedroom"}


@dataclass(frozen=True)
class ShotSpec:
    """What one shot shows. Validated on construction."""

    character: str  # the protagonist (tags' <S>)
    action: str
    place: str
    time: str  # time of day
    adverb: str  # how: scales the action's speed
    friend: str = ""  # the second character of social actions, "" otherwise

    def __post_init__(self) -> None:
        for name, value, allowed in (
            ("character", self.character, CHARACTERS), ("action", self.action, ACTIONS),
            ("place", self.place, PLACES), ("time", self.time, TIMES), ("adverb", self.adverb, ADVERB_SPEED),
        ):
            if value not in allowed:
                raise ValueError(f"{name}={value!r} is not one of {list(allowed)}")
        if ACTIONS[self.action].social:
            if self.friend not in CHARACTERS or self.friend == self.character:
                raise ValueError(f"{self.action!r} needs a friend other than {self.character}, got {self.friend!r}")
        elif self.friend:
            raise ValueError(f"{self.action!r} is not social, friend must be empty (got {self.friend!r})")

    @property
    def motion(self) -> str:
        return ACTIONS[self.action].text.format(friend=self.friend)

    @property
    def environment(self) -> str:
        return f"{self.time} {self.place}"

    def tags(self, motion_level: int) -> ShotTags:
        """The shot's tags by the rules of the world; ``motion_level`` comes from the measured motion."""
        a = ACTIONS[self.action]
        values = StateValues(motion_level=int(motion_level), social=a.social, entertainment=a.entertainment,
                             stamina=a.stamina)
        return ShotTags(self.character, self.motion, self.environment, self.adverb, values)

    def instruction(self) -> Instruction:
        return Instruction(self.character, f"{self.adverb} {self.motion}", self.environment)

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def caption_tags(record: ClipRecord) -> ShotTags:
    """The tag line a captioner watching the clip would write: every word said, even where the record's own
    ``tags`` say it as a memory instruction does (``later here``). The decoder side (the base text-to-video model,
    stage (a)'s text tokens, the places' scenery) learns from what the clip shows; only the MLLM reads the
    instruction as the player typed it. Records without a drawn spec (not SpriteWorld) keep their tags."""
    tags = record.shot_tags()
    extra = record.extra or {}
    if tags is None or not all(k in extra for k in ("character", "action", "place", "time", "adverb")):
        return tags
    spec = ShotSpec(**{k: extra[k] for k in ("character", "action", "place", "time", "adverb")},
                    friend=extra.get("friend", ""))
    return spec.tags(tags.values.motion_level)


def spec_from_instruction(instruction: Instruction, *, source: str = "", line: int | None = None) -> ShotSpec:
    """The ShotSpec a structured SpriteWorld instruction describes; anything outside the world raises TagError."""
    def fail(message: str, field_name: str) -> TagError:
        return TagError(message, source=source, line=line, field=field_name)

    if not instruction.structured:
        raise fail("free text is not a SpriteWorld instruction", "format")
    if instruction.character not in CHARACTERS:
        raise fail(f"{instruction.character!r} is not one of {list(CHARACTERS)}", "character")
    time, _, place = instruction.background.partition(" ")
    if time not in TIMES or place not in PLACES:
        raise fail(f"{instruction.background!r} is not '<{'|'.join(TIMES)}> <{'|'.join(PLACES)}>'", "background")
    adverb, _, rest = instruction.motion.partition(" ")
    if adverb not in ADVERB_SPEED:
        raise fail(f"motion must start with an adverb, one of {list(ADVERB_SPEED)}", "motion")
    for action in ACTIONS.values():
        pattern = "^" + re.escape(action.text).replace(re.escape("{friend}"), r"(?P<friend>\w+)") + "$"
        match = re.match(pattern, rest)
        if match:
            try:
                return ShotSpec(instruction.character, action.name, place, time, adverb,
                                match.groupdict().get("friend") or "")
            except ValueError as exc:
                raise fail(str(exc), "motion") from None
    raise fail(f"{rest!r} is not one of {[a.text for a in ACTIONS.values()]}", "motion")
