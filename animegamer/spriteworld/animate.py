"""SpriteWorld's animation: the poses and props of every frame of a shot, its pixels, and its true motion.

Everything follows from a seed: ``render_shot(spec, seed)`` draws the same frames every time.

- the motion scope is the *true* motion: the mean per-frame displacement in pixels of the characters' body parts
  (head, torso, hands, feet weighted by their share of the figure), known exactly because we drew them; it is
  quantised to motion levels 1..5 with quantile bin edges fitted on the dataset (:func:`fit_motion_bins`);
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
  ``blocking="anchored"`` starts every run, walk, jump and flight from one spot, and only the motion shows it.

A memory film's home and companion (:mod:`animegamer.spriteworld.memory`) are drawn by :func:`draw_scene` from
:mod:`animegamer.spriteworld.home`; figures, props and backgrounds by :mod:`animegamer.spriteworld.draw`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from animegamer.spriteworld.draw import (
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
from animegamer.spriteworld.home import INDOORS, HomeLook, draw_companion, home_background
from animegamer.spriteworld.world import ADVERB_SPEED, CHARACTERS, ShotSpec
from animegamer.states import NUM_MOTION_LEVELS


@dataclass
class Frame:
    figures: list[tuple[Character, Pose]]  # in the same order in every frame of a scene
    props: list[tuple] = field(default_factory=list)  # see draw.draw_prop


@dataclass
class Scene:
    spec: ShotSpec
    frames: list[Frame]
    unit: float  # pixels per body unit before the character's size
    height: int
    width: int
    home: HomeLook | None = None  # a memory film's home (indoor places), home.HomeLook
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
    film's facts (memory.py), drawn by :func:`draw_scene`."""
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
