"""SpriteWorld: a small synthetic anime-life world whose clips train every stage for real on a CPU.

One clip is one shot: a character (Qiqi, Momo, Kai, Luna) doing an action (walk, run, jump, fly, sleep, eat,
read, talk, dance, play) in a place (bedroom, kitchen, park, forest, beach, street) at a time of day (morning,
noon, evening, night), drawn with OpenCV (default 64x96, 17 frames at 8 fps). Social actions (talk, play) bring
a second character. Everything follows from a seed: ``render_shot(spec, seed)`` draws the same frames every time.

Ground truth comes with every clip, in the real pipeline's format (animegamer.data.manifest):

- the motion scope is the *true* motion: the mean per-frame displacement in pixels of the characters' body parts
  (head, torso, hands, feet weighted by their share of the figure), known exactly because we drew them; it is
  quantised to motion levels 1..5 with quantile bin edges fitted on the dataset (``meta["motion_bins"]``);
- the adverb scales the action's speed (slowly < calmly < happily < quickly), so it correlates with the level;
  a factor in [1 - speed_jitter, 1 + speed_jitter] that no word says scales it too (default 0.1: the caption and
  the action nearly fix the level; wider, only the motion level tells a decoder how fast to draw);
- the *blocking* (where a character stands, which way it travels) is fixed per action by default, as on a stage:
  travels cross the middle from left to right, a flight climbs, a pair stands at the middle; positions vary within
  the middle tenth of their range and the phase of every motion stays random. The caption then says what the
  picture is up to that phase, so a small text-to-video model draws the figure where the story has it rather than
  a blur averaged over starts and directions no caption tells: with ``blocking="free"`` (random sides and spots,
  the world before) a running figure came out of the game as a horizontal smear of its colours. Under fixed
  blocking a faster run starts further left (its path is centred), so the first frame tells the speed;
  ``blocking="anchored"`` starts every run, walk, jump and flight from one spot, and only the motion shows it;
- ``<SC>`` is 1 for actions with a second character, ``<ET>`` 1 for leisure (read, dance, play), ``<ST>`` +1 for
  eat/sleep (restoring), -1 for run/jump/fly/dance (tiring), 0 otherwise.

A film is a Markov chain of shots: plausible successions (sleep -> eat -> walk ...), places that return, and a
clock that moves from morning to night (and back to morning after a night's sleep). Films are split into
train/test by film; held-out films become game files with ground truth (:func:`write_games`).

``memory: true`` adds what a film keeps without saying it (its own home, a friend who follows) and instructions
that leave out what earlier turns fixed; ``held_out_pairs`` keeps (character, action) / (character, friend) pairs
out of the training films (:mod:`animegamer.data.spriteworld_memory`). Both off: this world, bit for bit.

    python scripts/make_spriteworld.py --config configs/spriteworld/data.yaml
"""

from __future__ import annotations

import math
import re
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from animegamer.data.manifest import ClipRecord, write_manifest
from animegamer.data.spriteworld_draw import (
    BED_RIGHT,
    BED_TOP,
    DESIGN_H,
    DESIGN_W,
    GROUND,
    KEYPOINT_WEIGHTS,
    Character,
    Pose,
    draw_figure,
    draw_prop,
    keypoints,
)
from animegamer.data.spriteworld_home import INDOORS, HomeLook, draw_companion, home_background
from animegamer.data.spriteworld_memory import MEMORY_WORDS, HeldOutPairs, ShotMemory, allowed_weights, film_memory
from animegamer.io import atomic_write_jsonl, atomic_write_text
from animegamer.states import NUM_MOTION_LEVELS, Instruction, ShotTags, StateValues, TagError

if TYPE_CHECKING:
    from animegamer.config import SpriteWorldConfig

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


def lexicon() -> list[str]:
    """Every word a SpriteWorld instruction can contain (names, adverbs, actions, times, places), for the tiny
    tokenizers: trained on them, each is one piece, so an instruction's tokens sit at the same positions whatever
    its words (only the social actions' "with <friend>" adds tokens). The memory world's ``still later here home
    friend`` are among them."""
    words = [*CHARACTERS, *ADVERB_SPEED, *TIMES, *PLACES]
    for action in ACTIONS.values():
        words += [w for w in action.text.split() if w != "{friend}"]
    return list(dict.fromkeys([*words, *MEMORY_WORDS]))  # the memory world's words stand where these stand


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


# --------------------------------------------------------------------------------------------
# Animation: poses per frame, the frames, and the true motion
# --------------------------------------------------------------------------------------------


@dataclass
class Frame:
    figures: list[tuple[Character, Pose]]  # in the same order in every frame of a scene
    props: list[tuple] = field(default_factory=list)  # see spriteworld_draw.draw_prop


@dataclass
class Scene:
    spec: ShotSpec
    frames: list[Frame]
    unit: float  # pixels per body unit before the character's size
    height: int
    width: int
    home: HomeLook | None = None  # a memory film's home (indoor places), spriteworld_home
    companion: str = ""  # a memory film's friend following the hero, drawn beside the shot's figures


@dataclass
class _Ctx:
    rng: np.random.Generator
    k: float  # speed multiplier (adverb x a little jitter)
    unit: float
    width: int
    height: int
    num_frames: int
    ground: float  # feet line in pixels
    place: str
    fixed: bool  # fixed blocking: sides set by the action, positions in the middle tenth of their range
    anchored: bool = False  # anchored blocking: fixed, and paths start from one spot whatever their speed
    mirrored: bool = False  # the room's furniture layout is mirrored (a memory film's home): the bed is on the right

    def side(self) -> int:
        """A direction: +1 (right, or up for a climb) under fixed blocking, else either at random."""
        return 1 if self.fixed else int(self.rng.choice([-1, 1]))

    def spot(self, lo: float, hi: float) -> float:
        """A value in [lo, hi]: anywhere under free blocking, within the middle tenth under fixed blocking."""
        if self.fixed:
            middle, half = (lo + hi) / 2, (hi - lo) / 20
            return float(self.rng.uniform(middle - half, middle + half))
        return float(self.rng.uniform(lo, hi))

    def travel(self, speed: float) -> tuple[int, float, float]:
        """Direction, start x and (possibly reduced) speed of a path that stays inside the frame.

        Under anchored blocking every path starts from the same spot near the left edge whatever its speed, so
        the first frame does not tell the speed (only how far the figure gets does)."""
        lo, hi = 9 * self.unit, self.width - 9 * self.unit
        if self.anchored:
            x0 = self.spot(lo, lo + 0.2 * (hi - lo))
            return 1, x0, min(speed, (hi - x0) / max(1, self.num_frames - 1))
        speed = min(speed, (hi - lo) / max(1, self.num_frames - 1))
        span = speed * (self.num_frames - 1)
        d = self.side()
        x0 = self.spot(lo, hi - span) if d > 0 else self.spot(lo + span, hi)
        return d, x0, speed


def _walk(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    d, x0, v = c.travel(1.3 * c.k * c.unit)
    w, ph, amp = 2 * math.pi / 8 * math.sqrt(c.k), c.rng.uniform(0, 2 * math.pi), 0.5 * min(1.3, math.sqrt(c.k))
    frames = []
    for t in range(c.num_frames):
        s = math.sin(w * t + ph)
        bob = 0.6 * c.unit * abs(math.cos(w * t + ph))
        frames.append(Frame([(hero, Pose(x0 + d * v * t, c.ground - bob, d, arms=(0.5 * s, -0.5 * s),
                                         legs=(amp * s, -amp * s)))]))
    return frames


def _run(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    d, x0, v = c.travel(3.2 * c.k * c.unit)
    w, ph = 2 * math.pi / 6 * math.sqrt(c.k), c.rng.uniform(0, 2 * math.pi)
    frames = []
    for t in range(c.num_frames):
        s = math.sin(w * t + ph)
        pose = Pose(x0 + d * v * t, c.ground - 1.2 * c.unit * abs(s), d, tilt=-d * 0.3,
                    arms=(1.1 * s, -1.1 * s), legs=(-0.95 * s, 0.95 * s))
        puffs = [("puff", x0 + d * v * (t - lag) - d * 2 * c.unit, c.ground - c.unit, 0.6 + 0.4 * lag)
                 for lag in (2, 4) if t >= lag]
        frames.append(Frame([(hero, pose)], puffs))
    return frames


def _jump(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    d, x0, v = c.travel(0.4 * c.k * c.unit)
    height, period, ph = min(16.0, 10.0 * c.k) * c.unit, 8, int(c.rng.integers(0, 8))
    frames = []
    for t in range(c.num_frames):
        q = math.sin(math.pi * ((t + ph) % period) / period)
        pose = Pose(x0 + d * v * t, c.ground - height * q, d, arms=(0.3 + 2.5 * q, 0.2 + 2.7 * q),
                    legs=(-0.7 * q, 0.8 * q))
        frames.append(Frame([(hero, pose)]))
    return frames


def _fly(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    speed = 3.6 * c.k * c.unit
    d, up = c.side(), c.side()
    angle = c.spot(0.35, 0.6)
    direction = np.array([d * math.cos(angle), -up * math.sin(angle)])  # screen y points down
    span = min(speed * (c.num_frames - 1), 0.8 * c.width)
    speed = span / max(1, c.num_frames - 1)
    middle = np.array([c.width / 2 + c.spot(-4, 4) * c.unit, c.height * 0.45])
    # Anchored blocking: every flight starts where the longest would (its first frame does not tell the speed).
    start = middle - direction * (0.4 * c.width if c.anchored else span / 2)
    # Body axis along the flight (head first), face towards the ground: superhero style.
    tilt = math.atan2(-direction[0], -direction[1])
    ph = c.rng.uniform(0, 2 * math.pi)
    frames = []
    for t in range(c.num_frames):
        wobble = 1.2 * c.unit * math.sin(2 * math.pi * t / 12 + ph)
        root = start + direction * speed * t + np.array([0.0, wobble])
        kick = 0.12 * math.sin(2 * math.pi * t / 6 + ph)
        pose = Pose(float(root[0]), float(root[1]), d, tilt=tilt, arms=(3.0, 2.8), legs=(-0.1 + kick, 0.1 - kick))
        perp = np.array([-direction[1], direction[0]])
        streaks = []
        for i in range(3):
            a = root - direction * (2 + 2 * i) * c.unit + perp * (i - 1) * 3 * c.unit
            b = a - direction * 6 * c.unit
            streaks.append(("streak", *a, *b))
        frames.append(Frame([(hero, pose)], streaks))
    return frames


def _sleep(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    body = c.unit * hero.size
    if c.place == "bedroom":  # on the bed, head on the pillow at the left (at the right in a mirrored room)
        facing, tilt = 1, math.pi / 2
        x = 10 * c.width / DESIGN_W + 21.5 * body
        y = BED_TOP * c.height / DESIGN_H - 4 * body
        x = min(x, BED_RIGHT * c.width / DESIGN_W)
        if c.mirrored:
            facing, tilt, x = -1, -tilt, c.width - x
    else:  # on the grass or the sand, head left or right
        facing = c.side()
        tilt = facing * math.pi / 2
        x = c.width / 2 + facing * 13 * body + c.spot(-6, 6) * c.unit
        y = c.ground - 4 * body
    ph = c.rng.uniform(0, 2 * math.pi)
    frames = []
    for t in range(c.num_frames):
        breath = 0.35 * c.k * math.sin(2 * math.pi * t / 12 + ph)
        pose = Pose(x, y, facing, tilt=tilt, arms=(0.1, 0.1), breath=breath, eyes_closed=True,
                    blanket=c.place == "bedroom")
        head = keypoints(hero, pose, c.unit)[0]
        zs = []
        for i in range(2):
            q = ((t + 6 * i) % 12) / 12
            zs.append(("z", head[0] + (3 + 3 * q) * c.unit, head[1] - (8 + 8 * q) * c.unit))
        frames.append(Frame([(hero, pose)], zs))
    return frames


def _eat(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    x, d = c.spot(0.3, 0.7) * c.width, c.side()
    period, ph = max(4.0, 10.0 / c.k), c.rng.uniform(0, 10)
    frames = []
    for t in range(c.num_frames):
        q = 0.5 - 0.5 * math.cos(2 * math.pi * (t + ph) / period)  # 1 = spoon at the mouth
        pose = Pose(x, c.ground, d, arms=(1.3, 0.5 + 1.8 * q), breath=0.3 * q, mouth_open=q > 0.85,
                    holding="bowl")
        frames.append(Frame([(hero, pose)]))
    return frames


def _read(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    x, d = c.spot(0.3, 0.7) * c.width, c.side()
    period, ph = max(5.0, 10.0 / c.k), c.rng.uniform(0, 10)
    frames = []
    for t in range(c.num_frames):
        cycle = ((t + ph) % period) / period
        page = max(0.0, (cycle - 0.6) / 0.4)  # the last 40% of each cycle turns a page
        lift = 0.35 * min(c.k, 1.3) * math.sin(math.pi * page)
        pose = Pose(x, c.ground, d, arms=(1.15, 1.3 + lift), breath=0.3 * c.k * math.sin(2 * math.pi * t / 16),
                    holding="book", page=page)
        frames.append(Frame([(hero, pose)]))
    return frames


def _pair(c: _Ctx, hero: Character, friend: Character, gap: float) -> tuple[list[Character], list[float], list[int]]:
    """Two characters facing each other ``gap`` body units apart, the hero on the right (free blocking: either)."""
    centre = c.width / 2 + c.spot(-5, 5) * c.unit
    side = c.side()
    xs = [centre + side * gap / 2 * c.unit, centre - side * gap / 2 * c.unit]
    return [hero, friend], xs, [-side, side]


def _talk(c: _Ctx, hero: Character, friend: Character) -> list[Frame]:
    people, xs, facings = _pair(c, hero, friend, 24.0)
    first, ph = int(c.rng.integers(0, 2)), c.rng.uniform(0, 2 * math.pi)
    frames = []
    for t in range(c.num_frames):
        speaker = (t // 8 + first) % 2
        figures, props = [], []
        for i, (ch, x, f) in enumerate(zip(people, xs, facings, strict=True)):
            if i == speaker:
                g = abs(math.sin(2 * math.pi * t / 6 + ph))
                pose = Pose(x, c.ground, f, arms=(0.2, 0.5 + 0.7 * c.k * g), mouth_open=(t // 2) % 2 == 0,
                            breath=0.35 * c.k * math.sin(2 * math.pi * t / 6 + ph))
                head = keypoints(ch, pose, c.unit)[0]
                props.append(("bubble", head[0] + f * 8 * c.unit, head[1] - 10 * c.unit))
            else:
                pose = Pose(x, c.ground, f, breath=0.2 * c.k * math.sin(2 * math.pi * t / 10))
            figures.append((ch, pose))
        frames.append(Frame(figures, props))
    return frames


def _dance(c: _Ctx, hero: Character, _friend) -> list[Frame]:
    x0, d = c.spot(0.3, 0.7) * c.width, c.side()
    w, ph = 2 * math.pi / 8, c.rng.uniform(0, 2 * math.pi)
    swing = 0.5 * min(c.k, 1.4)
    frames = []
    for t in range(c.num_frames):
        s = math.sin(w * t + ph)
        pose = Pose(x0 + 3 * c.k * c.unit * s, c.ground - 1.5 * c.k * c.unit * abs(math.sin(2 * (w * t + ph))), d,
                    tilt=0.15 * s, arms=(2.5 + swing * s, 2.5 - swing * s), legs=(0.35 * s, -0.35 * s))
        notes = [("note", x0 + side * 10 * c.unit, c.ground - (24 + ((t * 0.8 + 5 * i) % 8)) * c.unit)
                 for i, side in enumerate((-1, 1))]
        frames.append(Frame([(hero, pose)], notes))
    return frames


def _play(c: _Ctx, hero: Character, friend: Character) -> list[Frame]:
    people, xs, facings = _pair(c, hero, friend, 40.0)
    period, ph = 8, int(c.rng.integers(0, 16))
    hands = [np.array([x + f * 6 * c.unit, c.ground - 18 * c.unit]) for x, f in zip(xs, facings, strict=True)]
    frames = []
    for t in range(c.num_frames):
        throw, q = divmod(t + ph, period)
        q /= period
        thrower = throw % 2
        figures = []
        for i, (ch, x, f) in enumerate(zip(people, xs, facings, strict=True)):
            if i == thrower:  # the throwing arm comes down after the release
                arms, lift = (0.3, 2.6 - 1.6 * q), 0.0
            else:  # the catcher reaches up and hops as the ball arrives
                arms, lift = (0.4 + 1.4 * q, 0.6 + 1.9 * q), c.k * c.unit * max(0.0, math.sin(2 * math.pi * q))
            figures.append((ch, Pose(x, c.ground - lift, f, arms=arms)))
        a, b = hands[thrower], hands[1 - thrower]
        ball = a + (b - a) * q - np.array([0.0, 10 * c.k * c.unit * math.sin(math.pi * q)])
        frames.append(Frame(figures, [("ball", *ball)]))
    return frames


_ANIMATE = {"walk": _walk, "run": _run, "jump": _jump, "fly": _fly, "sleep": _sleep, "eat": _eat, "read": _read,
            "talk": _talk, "dance": _dance, "play": _play}


BLOCKINGS = ("fixed", "anchored", "free")
DEFAULT_SPEED_JITTER = 0.1  # a clip's speed factor no word says lies in [1 - j, 1 + j]


def animate(
    spec: ShotSpec, seed: int, *, height: int = 64, width: int = 96, num_frames: int = 17, blocking: str = "fixed",
    speed_jitter: float = DEFAULT_SPEED_JITTER, home: HomeLook | list | None = None, companion: str = "",
) -> Scene:
    """Poses and props of every frame of the shot (no pixels yet); ``blocking`` is fixed, anchored or free and
    ``speed_jitter`` bounds the speed factor no word says (module doc); ``home`` and ``companion`` are a memory
    film's facts (spriteworld_memory), drawn by :func:`draw_scene`."""
    home = HomeLook.from_value(home) if spec.place in INDOORS else None
    if companion and (companion not in CHARACTERS or companion in (spec.character, spec.friend)):
        raise ValueError(f"companion {companion!r} must be a character other than those of the shot")
    if blocking not in BLOCKINGS:
        raise ValueError(f"blocking {blocking!r} is not one of {list(BLOCKINGS)}")
    if not 0.0 <= speed_jitter < 1.0:
        raise ValueError(f"speed_jitter must be in [0, 1) (the factor lies in [1 - j, 1 + j]), got {speed_jitter}")
    rng = np.random.default_rng(seed)
    unit = height / DESIGN_H
    k = ADVERB_SPEED[spec.adverb] * rng.uniform(1.0 - speed_jitter, 1.0 + speed_jitter)
    ctx = _Ctx(rng=rng, k=k, unit=unit, width=width, height=height, num_frames=num_frames,
               ground=GROUND[spec.place] * unit, place=spec.place, fixed=blocking != "free",
               anchored=blocking == "anchored", mirrored=bool(home and home.mirrored))
    friend = CHARACTERS[spec.friend] if spec.friend else None
    frames = _ANIMATE[spec.action](ctx, CHARACTERS[spec.character], friend)
    return Scene(spec=spec, frames=frames, unit=unit, height=height, width=width, home=home, companion=companion)


def draw_scene(scene: Scene) -> np.ndarray:
    """(T, H, W, 3) uint8 frames of an animated scene."""
    bg = home_background(scene.spec.place, scene.spec.time, scene.height, scene.width, scene.home)
    out = np.empty((len(scene.frames), scene.height, scene.width, 3), np.uint8)
    for t, frame in enumerate(scene.frames):
        img = bg.copy()
        if scene.companion:
            draw_companion(img, scene.spec.place, CHARACTERS[scene.companion], t)
        for character, pose in frame.figures:
            draw_figure(img, character, pose, scene.unit)
        for prop in frame.props:
            draw_prop(img, prop, scene.unit)
        out[t] = img
    return out


def scene_motion(scene: Scene) -> float:
    """True motion scope: mean over frames and characters of the area-weighted displacement (pixels/frame)."""
    points = np.stack([
        np.stack([keypoints(ch, pose, scene.unit) for ch, pose in frame.figures]) for frame in scene.frames
    ])  # (T, figures, 6, 2)
    step = np.linalg.norm(np.diff(points, axis=0), axis=-1)  # (T-1, figures, 6)
    return float((step * KEYPOINT_WEIGHTS).sum(-1).mean())


def render_shot(
    spec: ShotSpec, seed: int, *, height: int = 64, width: int = 96, num_frames: int = 17, blocking: str = "fixed",
    speed_jitter: float = DEFAULT_SPEED_JITTER, home: HomeLook | list | None = None, companion: str = "",
) -> np.ndarray:
    """The (T, H, W, 3) uint8 frames of one shot; the same arguments always give the same frames."""
    return draw_scene(animate(spec, seed, height=height, width=width, num_frames=num_frames, blocking=blocking,
                              speed_jitter=speed_jitter, home=home, companion=companion))


def motion_scope(
    spec: ShotSpec, seed: int, *, height: int = 64, width: int = 96, num_frames: int = 17, blocking: str = "fixed",
    speed_jitter: float = DEFAULT_SPEED_JITTER,
) -> float:
    """The true motion scope of :func:`render_shot` with the same arguments."""
    return scene_motion(animate(spec, seed, height=height, width=width, num_frames=num_frames, blocking=blocking,
                                speed_jitter=speed_jitter))


def fit_motion_bins(scopes, levels: int = NUM_MOTION_LEVELS) -> list[float]:
    """Quantile bin edges (levels - 1 of them) splitting the motion scopes into equally filled levels."""
    return [float(e) for e in np.quantile(np.asarray(scopes, np.float64), np.arange(1, levels) / levels)]


def motion_level(scope: float, bins: list[float]) -> int:
    """Level 1..len(bins)+1 of a motion scope."""
    return int(np.searchsorted(np.asarray(bins), scope, side="right")) + 1


# --------------------------------------------------------------------------------------------
# Films: a Markov chain of shots with continuity
# --------------------------------------------------------------------------------------------


@dataclass
class Film:
    film_id: str
    split: str  # train | test
    shots: list[ShotSpec]
    seeds: list[int]  # render seed of each shot
    friend: str = ""  # the film's friend: of its social shots, and its companion in a memory film


def _choose(rng: np.random.Generator, weights: dict[str, float]) -> str:
    names = list(weights)
    p = np.array([weights[n] for n in names], np.float64)
    return names[int(rng.choice(len(names), p=p / p.sum()))]


def _next_place(rng: np.random.Generator, action: str, place: str | None, visited: list[str]) -> str:
    """Mostly stay; otherwise go where the action usually happens, or back to a place of this film."""
    allowed = ACTIONS[action].places
    home = HOME.get(action)
    if place in allowed and rng.random() < (0.3 if home and place != home else 0.7):
        return place
    weights = {p: (3.0 if p in visited else 1.0) * (4.0 if home == p else 1.0) for p in allowed}
    return _choose(rng, weights)


def plan_film(rng: np.random.Generator, hero: str, friend: str, num_shots: int, banned: tuple[str, ...] = (),
              boosted: tuple[str, ...] = ()) -> list[ShotSpec]:
    """One film's shots: actions follow TRANSITIONS, places mostly stay or return, the clock moves on.

    ``banned`` actions never happen (held-out pairs of a training film), ``boosted`` ones are likelier (of a
    held-out film); with neither, the draws are those of the world without held-out pairs."""
    # waking up, breakfast, a morning walk
    action = _choose(rng, allowed_weights({"sleep": 3, "eat": 2, "read": 1, "walk": 2}, banned, ()))
    time = 0 if action == "sleep" else int(rng.choice(3, p=[0.5, 0.3, 0.2]))
    place = _next_place(rng, action, None, [])
    visited: list[str] = []
    shots = []
    for _ in range(num_shots):
        a = ACTIONS[action]
        adverb = a.adverbs[int(rng.integers(len(a.adverbs)))]
        shots.append(ShotSpec(hero, action, place, TIMES[time], adverb, friend if a.social else ""))
        visited.append(place)
        if action == "sleep" and TIMES[time] == "night":
            time = 0  # a new day
        elif TIMES[time] != "night" and rng.random() < 0.35:
            time += 1
        weights = dict(TRANSITIONS[action])
        if TIMES[time] == "night":
            weights["sleep"] = weights.get("sleep", 0.0) + 6.0
        elif "sleep" in weights:
            weights["sleep"] *= 0.2
        action = _choose(rng, allowed_weights(weights, banned, boosted))
        place = _next_place(rng, action, place, visited)
    return shots


def plan_films(seed: int, num_films: int, shots_per_film: int, characters: list[str],
               test_fraction: float, held_out: HeldOutPairs | None = None) -> list[Film]:
    """All films of a dataset, deterministic in ``seed``; protagonists cycle through ``characters``.

    ``held_out`` pairs (spriteworld_memory) never occur in training films; a held-out film of a hero with a
    held-out friend has that friend, and its hero's held-out actions are likelier."""
    held_out = held_out or HeldOutPairs()
    unknown = [c for c in characters if c not in CHARACTERS]
    if unknown or not characters:
        raise ValueError(f"characters must be a non-empty subset of {list(CHARACTERS)}, got {characters}")
    if num_films < 1 or shots_per_film < 1:
        raise ValueError("num_films and shots_per_film must be >= 1")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in [0, 1), got {test_fraction}")
    rng = np.random.default_rng(seed)
    num_test = min(num_films - 1, max(1 if test_fraction > 0 else 0, round(test_fraction * num_films)))
    test = set(rng.permutation(num_films)[:num_test].tolist())
    films = []
    for i in range(num_films):
        hero = characters[i % len(characters)]
        test_film = i in test
        never = held_out.banned_friends(hero)
        others = [c for c in CHARACTERS if c != hero and (c in never if test_film and never else c not in never)]
        friend = others[int(rng.integers(len(others)))]
        banned = held_out.banned_actions(hero)
        shots = plan_film(rng, hero, friend, shots_per_film, () if test_film else banned, banned if test_film else ())
        seeds = [int(s) for s in rng.integers(0, 2**31 - 1, size=shots_per_film)]
        films.append(Film(f"film{i:04d}", "test" if test_film else "train", shots, seeds, friend))
    return films


# --------------------------------------------------------------------------------------------
# The dataset on disk and held-out games
# --------------------------------------------------------------------------------------------

CLIP_SECONDS = 2.0  # consecutive shots fill consecutive 2 s slots of their film


def plan_world(cfg: SpriteWorldConfig) -> tuple[list[Film], dict[str, list[ShotMemory]]]:
    """The films of ``cfg`` and, when it has memory or held-out pairs, every shot's :class:`ShotMemory` by film
    (its instruction's words, home, companion and marks; spriteworld_memory), else an empty dict."""
    held_out = HeldOutPairs.parse(cfg.held_out_pairs)
    films = plan_films(cfg.seed, cfg.num_films, cfg.shots_per_film, list(cfg.characters), cfg.test_fraction,
                       held_out)
    if not (cfg.memory or cfg.held_out_pairs):
        return films, {}
    return films, {
        film.film_id: film_memory(np.random.default_rng([cfg.seed, 1, index]), film.shots, film.friend, held_out,
                                  cfg.memory)
        for index, film in enumerate(films)
    }


def training_tags(cfg: SpriteWorldConfig, motion_level: int = 1) -> list[ShotTags]:
    """The tag lines of every shot of the training films of ``cfg`` as its records carry them (memory films: as
    their instructions say them), with ``motion_level`` in place of the measured one (no clip is drawn)."""
    films, memories = plan_world(cfg)
    return [memories[f.film_id][i].tags(shot, motion_level) if memories else shot.tags(motion_level)
            for f in films if f.split == "train" for i, shot in enumerate(f.shots)]


def write_dataset(cfg: SpriteWorldConfig, progress: bool = True) -> Path:
    """Render every film of ``cfg`` to ``output_dir``: clips/<film>/<index>.mp4, clips.jsonl + clips.meta.json
    (motion bin edges, splits) and games/<film>.{txt,jsonl} for the test films. Returns the manifest path."""
    from tqdm import tqdm

    from animegamer.data.video import write_mp4

    out = Path(cfg.output_dir)
    films, memories = plan_world(cfg)
    marked = bool(memories)
    total = sum(len(f.shots) for f in films)
    scopes: list[float] = []
    pending: deque[Future] = deque()
    with ThreadPoolExecutor(max(1, cfg.workers)) as pool, tqdm(total=total, desc="spriteworld", unit="clip",
                                                                  disable=not progress) as bar:
        for film in films:
            for index, (spec, seed) in enumerate(zip(film.shots, film.seeds, strict=True)):
                memory = memories[film.film_id][index] if marked else None
                scene = animate(spec, seed, height=cfg.height, width=cfg.width, num_frames=cfg.num_frames,
                                blocking=cfg.blocking, speed_jitter=cfg.speed_jitter,
                                home=memory.home if memory else None, companion=memory.companion if memory else "")
                scopes.append(scene_motion(scene))
                path = out / "clips" / film.film_id / f"{index:05d}.mp4"
                pending.append(pool.submit(write_mp4, path, draw_scene(scene), cfg.fps))
                while len(pending) > 4 * max(1, cfg.workers):  # bound the frames waiting in memory
                    pending.popleft().result()
                    bar.update()
        while pending:
            pending.popleft().result()
            bar.update()

    bins = fit_motion_bins(scopes)
    records, i = [], 0
    for film in films:
        for index, (spec, seed) in enumerate(zip(film.shots, film.seeds, strict=True)):
            scope = scopes[i]
            i += 1
            level = motion_level(scope, bins)
            memory = memories[film.film_id][index] if marked else None
            records.append(ClipRecord(
                clip_id=f"{film.film_id}_{index:05d}", video=f"clips/{film.film_id}/{index:05d}.mp4",
                film_id=film.film_id, clip_index=index, start=CLIP_SECONDS * index, end=CLIP_SECONDS * (index + 1),
                tags=(memory.tags(spec, level) if memory else spec.tags(level)).render(),
                motion_scope=round(scope, 5), motion_level=level, caption_status="ok",
                extra={**spec.to_dict(), "render_seed": seed, "blocking": cfg.blocking,
                       "speed_jitter": cfg.speed_jitter, "num_frames": cfg.num_frames, "height": cfg.height,
                       "width": cfg.width, "split": film.split, **(memory.extra() if memory else {})},
            ))
    meta = {
        "source": "spriteworld",
        # Same place as the real pipeline's edges (animegamer.data.motion); the method says they measure true
        # motion, so a flow scorer refuses them: score generated clips with edges refitted by flow on these clips.
        "motion": {
            "method": "true_motion", "edges": bins, "height": cfg.height, "width": cfg.width, "fps": float(cfg.fps),
            "definition": "mean per-frame displacement (pixels at the clip size) of the characters' head, torso, "
                          "hands and feet, weighted by their share of the figure",
        },
        "splits": {s: [f.film_id for f in films if f.split == s] for s in ("train", "test")},
        "config": {k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in vars(cfg).items()},
        "characters": list(CHARACTERS), "actions": list(ACTIONS), "places": list(PLACES), "times": list(TIMES),
    }
    manifest = write_manifest(out / "clips.jsonl", records, meta)
    write_games(out / "games", [r for r in records if r.extra["split"] == "test"])
    return manifest


# render_shot's keywords, kept per clip (home / companion: memory films only)
DRAWING_SETTINGS = ("blocking", "speed_jitter", "num_frames", "height", "width", "home", "companion")


def drawing_settings(row: dict[str, Any]) -> dict[str, Any]:
    """The :func:`render_shot` keywords a clip record's ``extra`` or a game row carries, so the clip can be drawn
    again exactly; settings it lacks take render_shot's defaults, except blocking: rows written before blocking
    existed were drawn free."""
    return {"blocking": "free", **{k: row[k] for k in DRAWING_SETTINGS if row.get(k) is not None}}


def film_game(records: list[ClipRecord]) -> list[dict[str, Any]]:
    """One film's clips (in order) as game turns: the instruction a player would type and the ground truth."""
    turns = []
    for turn, record in enumerate(sorted(records, key=lambda r: r.clip_index)):
        tags = record.shot_tags()
        if tags is None:
            raise ValueError(f"{record.clip_id}: no tags, cannot be a game turn")
        turns.append({
            "turn": turn, "instruction": tags.instruction().render(), "tags": record.tags, "clip_id": record.clip_id,
            "video": record.video, "motion_scope": record.motion_scope, "motion_level": record.motion_level,
            "spec": {k: record.extra[k] for k in ("character", "action", "place", "time", "adverb", "friend")},
            "render_seed": record.extra.get("render_seed"),
            **drawing_settings(record.extra),
            # the turn's marks (memory world / held-out pairs): what it depends on, whether it pairs held-out
            **{k: record.extra[k] for k in ("depends", "held_out_pair", "reach") if k in record.extra},
        })
    return turns


def write_games(out_dir: str | Path, records: list[ClipRecord]) -> list[Path]:
    """Write ``<film>.txt`` (a game file for read_game_file) and ``<film>.jsonl`` (its ground truth per turn,
    videos relative to the manifest directory) for every film among ``records``. Games of an earlier run in
    ``out_dir`` are removed, so the directory holds exactly this dataset's held-out games."""
    out_dir = Path(out_dir)
    if out_dir.is_dir():
        for old in [*out_dir.glob("*.txt"), *out_dir.glob("*.jsonl")]:
            old.unlink()
    films: dict[str, list[ClipRecord]] = {}
    for r in records:
        films.setdefault(r.film_id, []).append(r)
    written = []
    for film_id, clips in sorted(films.items()):
        turns = film_game(clips)
        header = f"# SpriteWorld held-out game {film_id}: {len(turns)} turns; ground truth in {film_id}.jsonl\n"
        atomic_write_text(out_dir / f"{film_id}.txt", header + "".join(t["instruction"] + "\n" for t in turns))
        atomic_write_jsonl(out_dir / f"{film_id}.jsonl", turns)
        written.append(out_dir / f"{film_id}.txt")
    return written
