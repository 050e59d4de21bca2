"""Who is on screen in a SpriteWorld clip: the protagonist, and which second character, read from their colours.

Every character wears its own colours (:data:`~animegamer.spriteworld.world.CHARACTERS`), so a clip of the world,
real or generated, says who is in it without a learned detector. A character's *presence* is the number of pixels
per frame, scaled to a 64 x 96 frame, within :data:`TOLERANCE` (RGB distance) of its shirt colour where the empty
scenery of the shot (the place at its time of day, the film's home) has no such colour at that pixel: the figure,
not a blue sky behind it.

- :func:`second_character`: of the characters other than the protagonist, the one whose shirt shows most, or None
  when none reaches :data:`MIN_PRESENCE` (no friend drawn);
- :func:`hero_on_screen`: the protagonist's shirt reaches :data:`MIN_PRESENCE` (a sleeper in a bedroom: its
  blanket and hair);
- :class:`TurnCast`: what one turn of a held-out game should show (protagonist, friend, whether the instruction
  named the friend) and its scenery; :meth:`TurnCast.score` turns a clip into the evaluation's 0/1 identity values.

    cast = TurnCast.from_row(row["spec"], row, instruction)       # a games/<film>.jsonl row
    cast.score(frames)    # {"hero_on_screen": 1.0, "friend_remembered": 0.0} (a friend not named, drawn wrong)
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from animegamer.spriteworld.home import HomeLook, home_background
from animegamer.spriteworld.world import CHARACTERS

TOLERANCE = 40.0  # RGB distance within which a pixel counts as a character's colour
# pixels per 64x96 frame that count as drawn: on 1,200 random shots of the world the least present friend or hero
# shows 24, the most present absent character 13 (Momo's blue trousers are near Kai's blue shirt)
MIN_PRESENCE = 18.0
REFERENCE_AREA = 64 * 96
BLANKET = (120, 170, 235)  # a sleeper in a bedroom is under it (draw.draw_figure), shirt hidden


def presence(frames: np.ndarray, scenery: np.ndarray, colours: Mapping[str, Sequence]) -> dict[str, float]:
    """Per name of ``colours``, the pixels per frame (scaled to 64 x 96) of ``frames`` within :data:`TOLERANCE` of
    one of its colours where ``scenery`` (the shot's empty background, resized to the frames) has none of it.

    ``frames``: (T, H, W, 3) uint8; ``scenery``: (H', W', 3) uint8."""
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or not len(frames):
        raise ValueError(f"frames must be (T, H, W, 3) with T >= 1, got {frames.shape}")
    height, width = frames.shape[1:3]
    if scenery.shape[:2] != (height, width):
        import cv2

        scenery = cv2.resize(np.ascontiguousarray(scenery), (width, height), interpolation=cv2.INTER_AREA)
    pixels = frames.astype(np.float32)  # (T, H, W, 3)
    background = scenery.astype(np.float32)  # (H, W, 3)
    scale = REFERENCE_AREA / (height * width) / len(frames)
    out = {}
    for name, wanted in colours.items():
        count = 0
        for colour in wanted:
            target = np.asarray(colour, np.float32)
            near = np.linalg.norm(pixels - target, axis=-1) < TOLERANCE  # (T, H, W)
            behind = np.linalg.norm(background - target, axis=-1) < TOLERANCE  # (H, W): the scenery has it there
            count += int((near & ~behind).sum())
        out[name] = count * scale
    return out


def _check(hero: str) -> None:
    if hero not in CHARACTERS:
        raise ValueError(f"hero {hero!r} is not one of {list(CHARACTERS)}")


def second_character(frames: np.ndarray, hero: str, scenery: np.ndarray) -> str | None:
    """The character other than ``hero`` whose shirt shows most in ``frames``, or None when none is drawn."""
    _check(hero)
    shirts = presence(frames, scenery, {name: (c.top,) for name, c in CHARACTERS.items() if name != hero})
    best = max(shirts, key=shirts.get)
    return best if shirts[best] >= MIN_PRESENCE else None


def hero_on_screen(frames: np.ndarray, hero: str, scenery: np.ndarray, under_blanket: bool = False) -> bool:
    """Whether ``hero`` is drawn in ``frames``: its shirt, or (``under_blanket``: asleep in a bedroom) the blanket
    and its hair, reach :data:`MIN_PRESENCE`."""
    _check(hero)
    c = CHARACTERS[hero]
    colours = (BLANKET, c.hair) if under_blanket else (c.top,)
    return presence(frames, scenery, {hero: colours})[hero] >= MIN_PRESENCE


def names_friend(instruction: str, friend: str) -> bool:
    """Whether ``instruction`` says ``friend``'s name as a whole word."""
    return bool(friend) and re.search(rf"\b{re.escape(friend)}\b", instruction) is not None


@dataclass(frozen=True)
class TurnCast:
    """Who one turn's real clip shows: the protagonist, the friend in view ("" none: the shot's friend of a social
    action or the companion following) and whether the player's instruction named that friend."""

    hero: str
    friend: str
    named: bool
    under_blanket: bool  # the protagonist sleeps in a bedroom: its shirt is under the blanket
    scenery: np.ndarray = field(repr=False, compare=False)  # (H, W, 3) uint8, the shot's empty background

    @classmethod
    def from_row(cls, spec: Mapping, settings: Mapping, instruction: str) -> TurnCast:
        """From a games row's ``spec`` and drawing settings (``home``, ``companion``, ``height``, ``width``)."""
        hero, friend = str(spec["character"]), str(spec.get("friend") or settings.get("companion") or "")
        if hero not in CHARACTERS or (friend and (friend not in CHARACTERS or friend == hero)):
            raise ValueError(f"a turn of {hero!r} with friend {friend!r}: not characters of the world")
        look = HomeLook.from_value(settings.get("home"))
        scenery = home_background(str(spec["place"]), str(spec["time"]), int(settings.get("height", 64)),
                                  int(settings.get("width", 96)), look)
        asleep = spec.get("action") == "sleep" and spec["place"] == "bedroom"
        return cls(hero, friend, names_friend(instruction, friend), asleep, scenery)

    def score(self, frames: np.ndarray) -> dict[str, float]:
        """0/1 values of ``frames``: ``hero_on_screen``, and ``friend_named`` or ``friend_remembered`` (the friend
        in view is the one drawn) when the turn has a friend; a clip with no second character drawn is wrong."""
        values = {"hero_on_screen": float(hero_on_screen(frames, self.hero, self.scenery, self.under_blanket))}
        if self.friend:
            right = second_character(frames, self.hero, self.scenery) == self.friend
            values["friend_named" if self.named else "friend_remembered"] = float(right)
        return values
