"""What SpriteWorld's memory world draws that no instruction says: a film's home and the companion who follows.

- **The home.** In a memory film the indoor rooms (bedroom, kitchen) are the film's own: wall and floor colours
  from small palettes and the furniture layout either as designed or mirrored (bed, fridge and window on the other
  side). One :class:`HomeLook` per film, the same for both rooms, so a kitchen seen earlier tells the bedroom's
  colours. Instructions never name it; only the clips of earlier turns show it.
- **The companion.** After a social shot the friend follows the hero for a few shots, standing at the right edge,
  breathing; not in the instruction, not part of the shot's true motion (it hardly moves).

Drawing only; the rules deciding what a film's facts are live in :mod:`animegamer.spriteworld.memory`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from animegamer.spriteworld.draw import DESIGN_H, GROUND, Character, Pose, background, draw_figure

INDOORS = ("bedroom", "kitchen")
# Home palettes (RGB), index 0 first; walls light, floors darker, each pair clearly apart at 64x96.
WALLS = ((205, 185, 228), (170, 225, 190), (250, 200, 160), (165, 200, 245))
FLOORS = ((170, 118, 78), (120, 120, 135), (175, 60, 60), (95, 150, 85))
WALL_NAMES = ("lavender", "mint", "peach", "sky")  # what a captioner calls them (one tokenizer piece each)
FLOOR_NAMES = ("wood", "slate", "carpet", "moss")  # (carpet: red)


@dataclass(frozen=True)
class HomeLook:
    """A film's home: palette indices of its walls and floor, and whether the furniture layout is mirrored."""

    wall: int
    floor: int
    mirrored: bool

    def __post_init__(self) -> None:
        if not (0 <= self.wall < len(WALLS) and 0 <= self.floor < len(FLOORS)):
            raise ValueError(f"home look {self} is outside the palettes ({len(WALLS)} walls, {len(FLOORS)} floors)")

    def to_list(self) -> list:
        return [self.wall, self.floor, self.mirrored]

    def describe(self) -> str:
        """How a captioner says it: ``Home: mint walls, carpet floor, mirrored layout.``"""
        layout = "mirrored" if self.mirrored else "designed"
        return f"Home: {WALL_NAMES[self.wall]} walls, {FLOOR_NAMES[self.floor]} floor, {layout} layout."

    @classmethod
    def from_value(cls, value) -> HomeLook | None:
        """A HomeLook from itself, a ``[wall, floor, mirrored]`` list (records, game rows) or None."""
        if value is None or isinstance(value, HomeLook):
            return value
        if not isinstance(value, (list, tuple)) or len(value) != 3:
            raise ValueError(f"home must be [wall, floor, mirrored], got {value!r}")
        return cls(int(value[0]), int(value[1]), bool(value[2]))


@lru_cache(maxsize=256)
def home_background(place: str, time: str, height: int, width: int, look: HomeLook | None) -> np.ndarray:
    """The (H, W, 3) uint8 read-only picture of ``place``: the film's home when indoors and ``look`` is set."""
    if look is None or place not in INDOORS:
        return background(place, time, height, width)
    img = background(place, time, height, width, wall=WALLS[look.wall], floor=FLOORS[look.floor])
    if look.mirrored:
        img = np.ascontiguousarray(img[:, ::-1])  # (H, W, 3), the room seen from the other side
        img.setflags(write=False)
    return img


def companion_pose(place: str, height: int, width: int, character: Character, t: int) -> Pose:
    """The companion of frame ``t``: standing at the right edge facing the middle, breathing slowly."""
    unit = height / DESIGN_H
    x = width - 7.0 * unit * character.size
    return Pose(x, GROUND[place] * unit, -1, breath=0.2 * math.sin(2 * math.pi * t / 10))


def draw_companion(img: np.ndarray, place: str, character: Character, t: int) -> None:
    """Draw the companion of frame ``t`` onto ``img`` (H, W, 3) uint8, in place (before the shot's figures)."""
    height, width = img.shape[:2]
    draw_figure(img, character, companion_pose(place, height, width, character, t), height / DESIGN_H)
