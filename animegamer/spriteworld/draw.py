"""Drawing for SpriteWorld (animegamer.spriteworld): figures, props and backgrounds with OpenCV.

A figure is drawn from a :class:`Pose` in *body units*: ``u`` points where the character faces, ``v`` points up,
the origin is between the feet and a standing figure is about 27 units tall. ``unit`` pixels per body unit
(height / 64 at the default 64x96) times the character's size maps it to the frame. Backgrounds are drawn on a
96x64 design grid scaled to the frame. Coordinates are sub-pixel (OpenCV ``shift``) and anti-aliased so that
tiny motions (breathing) show as tiny changes, not as jumps of a whole pixel.

Colours are RGB; OpenCV does not care about channel order when it only draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np

RGB = tuple[int, int, int]
SHIFT = 4  # OpenCV fixed-point bits: coordinates in 1/16 pixel
_ONE = 1 << SHIFT
DESIGN_H, DESIGN_W = 64.0, 96.0  # the grid backgrounds and ground lines are designed on


@dataclass(frozen=True)
class Character:
    """How one character looks: a round-headed figure told apart by hair, outfit and size."""

    name: str
    skin: RGB
    hair: RGB
    top: RGB  # shirt or dress
    bottom: RGB  # trousers (shirt outfits) or shoes (dresses)
    accent: RGB  # hat, ribbon or inner ears
    hair_style: str  # long | ears | spiky | hat
    outfit: str  # dress | shirt
    size: float  # body height relative to the others


@dataclass(frozen=True)
class Pose:
    """One figure in one frame."""

    x: float  # root (between the feet) in pixels
    y: float
    facing: int  # +1 right, -1 left
    tilt: float = 0.0  # body rotation about the root in radians, counter-clockwise on screen
    arms: tuple[float, float] = (0.15, -0.15)  # back, front arm angle from hanging down; + is forward
    legs: tuple[float, float] = (0.0, 0.0)  # back, front leg angle from straight down; + is forward
    breath: float = 0.0  # chest and head lift in body units (breathing, nodding)
    eyes_closed: bool = False
    mouth_open: bool = False
    holding: str = ""  # "" | book | bowl
    page: float = 0.0  # 0..1 progress of a page turn (holding a book)
    blanket: bool = False


# Parts of a figure whose displacement defines the true motion, with their share of the figure's area.
KEYPOINT_WEIGHTS = np.array([0.25, 0.35, 0.1, 0.1, 0.1, 0.1])  # head, torso, back/front hand, back/front foot
_SHOULDER_V, _HIP_V, _HEAD_V, _ARM, _LEG = 15.5, 8.5, 21.5, 7.0, 8.5


def _body_to_image(pose: Pose, scale: float, pts) -> np.ndarray:
    pts = np.asarray(pts, dtype=np.float64).reshape(-1, 2)
    u, v = pts[:, 0] * pose.facing, pts[:, 1]
    c, s = math.cos(pose.tilt), math.sin(pose.tilt)
    return np.stack([pose.x + (c * u - s * v) * scale, pose.y - (s * u + c * v) * scale], axis=1)  # (P, 2)


def _joints(pose: Pose) -> dict[str, np.ndarray]:
    """Joint positions in body units."""
    b = pose.breath
    shoulder = np.array([0.0, _SHOULDER_V + b])
    hip = np.array([0.0, _HIP_V])
    hands = [shoulder + _ARM * np.array([math.sin(a), -math.cos(a)]) for a in pose.arms]
    feet = [hip + _LEG * np.array([math.sin(a), -math.cos(a)]) for a in pose.legs]
    return {
        "head": np.array([0.0, _HEAD_V + 1.3 * b]),
        "torso": (shoulder + hip) / 2,
        "shoulder": shoulder,
        "hip": hip,
        "hand_back": hands[0],
        "hand_front": hands[1],
        "foot_back": feet[0],
        "foot_front": feet[1],
    }


def keypoints(character: Character, pose: Pose, unit: float) -> np.ndarray:
    """(6, 2) pixel positions of head, torso, hands and feet (order of KEYPOINT_WEIGHTS)."""
    j = _joints(pose)
    names = ("head", "torso", "hand_back", "hand_front", "foot_back", "foot_front")
    return _body_to_image(pose, unit * character.size, [j[n] for n in names])


def _fixed(pts: np.ndarray) -> np.ndarray:
    return np.round(np.asarray(pts) * _ONE).astype(np.int32)


def fill_poly(img: np.ndarray, pts: np.ndarray, color: RGB) -> None:
    cv2.fillPoly(img, [_fixed(pts).reshape(-1, 1, 2)], color, cv2.LINE_AA, SHIFT)


def disc(img: np.ndarray, center, radius: float, color: RGB) -> None:
    c = _fixed(center).ravel()
    cv2.circle(img, (int(c[0]), int(c[1])), max(1, round(radius * _ONE)), color, -1, cv2.LINE_AA, SHIFT)


def segment(img: np.ndarray, p, q, color: RGB, thickness: float) -> None:
    p, q = _fixed(p).ravel(), _fixed(q).ravel()
    cv2.line(img, (int(p[0]), int(p[1])), (int(q[0]), int(q[1])), color, max(1, round(thickness)), cv2.LINE_AA, SHIFT)


def _ellipse(cx: float, cy: float, ax: float, ay: float, a0: float = 0.0, a1: float = 2 * math.pi, n: int = 16):
    t = np.linspace(a0, a1, n)
    return np.stack([cx + ax * np.cos(t), cy + ay * np.sin(t)], axis=1)


_DARK: RGB = (35, 30, 45)


class _Shapes:
    """A figure's shapes in body units, in drawing order; mapped to the image with one transform, then drawn."""

    def __init__(self) -> None:
        self.ops: list[tuple[str, np.ndarray, RGB, float]] = []  # (poly | disc | seg, points, colour, size)

    def poly(self, pts, color: RGB) -> None:
        self.ops.append(("poly", np.asarray(pts, np.float64).reshape(-1, 2), color, 0.0))

    def disc(self, center, radius: float, color: RGB) -> None:
        self.ops.append(("disc", np.asarray(center, np.float64).reshape(1, 2), color, radius))

    def seg(self, p, q, color: RGB, width: float) -> None:
        self.ops.append(("seg", np.array([p, q], np.float64), color, width))

    def draw(self, img: np.ndarray, pose: Pose, scale: float) -> None:
        fixed = _fixed(_body_to_image(pose, scale, np.concatenate([op[1] for op in self.ops])))  # (P, 2)
        start = 0
        for kind, pts, color, size in self.ops:
            q = fixed[start : start + len(pts)]
            start += len(pts)
            if kind == "poly":
                cv2.fillPoly(img, [q.reshape(-1, 1, 2)], color, cv2.LINE_AA, SHIFT)
            elif kind == "disc":
                center = (int(q[0, 0]), int(q[0, 1]))
                cv2.circle(img, center, max(1, round(size * scale * _ONE)), color, -1, cv2.LINE_AA, SHIFT)
            else:
                p0, p1 = (int(q[0, 0]), int(q[0, 1])), (int(q[1, 0]), int(q[1, 1]))
                cv2.line(img, p0, p1, color, max(1, round(size * scale)), cv2.LINE_AA, SHIFT)


def draw_figure(img: np.ndarray, ch: Character, pose: Pose, unit: float) -> None:
    """Draw one character in ``pose`` onto ``img`` (H, W, 3) uint8, in place."""
    j = _joints(pose)
    h = j["head"][1]
    shapes = _Shapes()
    leg_color = ch.bottom if ch.outfit == "shirt" else ch.skin
    shoe = _DARK if ch.outfit == "shirt" else ch.bottom

    if ch.hair_style == "long":  # hair falling down the back, behind everything
        shapes.poly([(-0.5, h + 5), (-5.8, h + 2.5), (-6.8, h - 8.5), (-1.5, h - 9.5)], ch.hair)
    # back arm, legs, torso, head, hair, face, then the front arm and what it holds
    _arm(shapes, j["shoulder"], j["hand_back"], ch, darker=True)
    for foot in ("foot_back", "foot_front"):
        shapes.seg(j["hip"], j[foot], leg_color, _LIMB)
        shapes.disc(j[foot], 1.3, shoe)
    top = 17.0 + pose.breath
    if ch.outfit == "dress":
        shapes.poly([(-5.8, 4.5), (5.8, 4.5), (3.3, top), (-3.3, top)], ch.top)
    else:
        shapes.poly([(-3.9, 7.5), (3.9, 7.5), (3.9, top), (-3.9, top)], ch.top)
    if pose.holding == "bowl":
        _bowl(shapes, j["hand_back"])
    if pose.blanket:
        shapes.poly([(-5.2, -1.5), (5.6, -1.5), (5.6, 15.0), (-5.2, 15.0)], (120, 170, 235))
    shapes.disc(j["head"], 5.0, ch.skin)
    _hair(shapes, ch, h)
    _face(shapes, pose, h)
    if not pose.blanket:
        _arm(shapes, j["shoulder"], j["hand_front"], ch, darker=False)
    if pose.holding == "book":
        _book(shapes, j["hand_front"], pose.page)
    shapes.draw(img, pose, unit * ch.size)


_LIMB = 2.3  # limb thickness in body units


def _arm(shapes: _Shapes, shoulder, hand, ch: Character, darker: bool) -> None:
    sleeve = tuple(int(c * 0.8) for c in ch.top) if darker else ch.top
    skin = tuple(int(c * 0.9) for c in ch.skin) if darker else ch.skin
    elbow = (shoulder + hand) / 2
    shapes.seg(elbow, hand, skin, _LIMB * 0.85)
    shapes.seg(shoulder, elbow, sleeve, _LIMB)
    shapes.disc(hand, _LIMB * 0.55, skin)


def _hair(shapes: _Shapes, ch: Character, h: float) -> None:
    shapes.poly(_ellipse(0.0, h + 0.2, 5.6, 5.5, 0.45, math.pi + 0.75), ch.hair)  # front above the eyes, back covered
    if ch.hair_style == "long":
        shapes.poly([(-5.4, h + 4.5), (-8.0, h + 6.5), (-7.6, h + 2.5)], ch.accent)  # ribbon
    elif ch.hair_style == "ears":
        for ear, inner in (
            ([(-5.0, h + 2.6), (-4.8, h + 8.2), (-1.4, h + 4.8)], [(-4.2, h + 4.0), (-4.1, h + 6.8), (-2.4, h + 5.0)]),
            ([(1.3, h + 4.9), (4.6, h + 8.2), (5.0, h + 2.7)], [(2.4, h + 5.1), (4.1, h + 6.8), (4.3, h + 4.0)]),
        ):
            shapes.poly(ear, ch.hair)
            shapes.poly(inner, ch.accent)
    elif ch.hair_style == "spiky":
        for spike in (
            [(-5.2, h + 0.5), (-9.8, h + 3.0), (-4.4, h + 4.2)],
            [(-4.6, h + 3.5), (-5.6, h + 9.2), (-1.0, h + 5.6)],
            [(-1.6, h + 5.4), (0.9, h + 10.0), (2.2, h + 5.3)],
            [(1.4, h + 5.0), (5.6, h + 8.2), (5.2, h + 2.4)],
        ):
            shapes.poly(spike, ch.hair)
    elif ch.hair_style == "hat":
        shapes.poly([(-4.6, h + 4.6), (4.6, h + 4.6), (-3.0, h + 15.0)], ch.accent)
        shapes.poly([(-8.0, h + 3.8), (8.0, h + 3.8), (8.0, h + 5.4), (-8.0, h + 5.4)], ch.accent)
        shapes.disc((-3.0, h + 15.0), 0.9, (250, 220, 80))  # the star on the tip


def _face(shapes: _Shapes, pose: Pose, h: float) -> None:
    for u in (0.6, 3.6):
        if pose.eyes_closed:
            shapes.seg((u - 0.7, h - 1.2), (u + 0.7, h - 1.2), _DARK, 0.6)
        else:
            shapes.disc((u, h - 1.1), 0.7, _DARK)
    if pose.mouth_open:
        shapes.disc((3.0, h - 3.4), 0.8, (170, 50, 60))


def _book(shapes: _Shapes, hand, page: float) -> None:
    """An open book held up to the viewer: blue cover, two white pages, a page sweeping across when turning."""
    x, y = hand[0] + 1.5, hand[1] + 1.2
    shapes.poly([(x - 3.4, y - 2.4), (x + 3.4, y - 2.4), (x + 3.4, y + 2.4), (x - 3.4, y + 2.4)], (50, 100, 200))
    for x0, x1 in ((x - 3.0, x - 0.25), (x + 0.25, x + 3.0)):
        shapes.poly([(x0, y - 2.0), (x1, y - 2.0), (x1, y + 2.0), (x0, y + 2.0)], (250, 250, 245))
    if 0.0 < page < 1.0:
        tip = x + 2.8 * math.cos(math.pi * page)
        shapes.poly([(x, y - 2.0), (tip, y - 2.6), (tip, y + 1.6), (x, y + 2.0)], (225, 225, 240))


def _bowl(shapes: _Shapes, hand) -> None:
    x, y = hand[0] + 1.2, hand[1] + 1.0
    shapes.poly(_ellipse(x, y, 2.8, 2.4, math.pi, 2 * math.pi), (240, 240, 235))
    shapes.poly(_ellipse(x, y, 2.5, 0.9, 0.0, math.pi), (245, 240, 215))


# --------------------------------------------------------------------------------------------
# Props that are not held: ("ball", x, y) | ("bubble", x, y) | ("z", x, y) | ("note", x, y) |
# ("puff", x, y, radius) | ("streak", x0, y0, x1, y1); positions in pixels, sizes in body units.
# --------------------------------------------------------------------------------------------


def draw_prop(img: np.ndarray, prop: tuple, unit: float) -> None:
    kind, *args = prop
    if kind == "ball":
        disc(img, args, 2.2 * unit, (245, 70, 70))
        segment(img, (args[0] - 2.2 * unit, args[1]), (args[0] + 2.2 * unit, args[1]), (255, 255, 255), 0.6 * unit)
    elif kind == "bubble":
        x, y = args
        fill_poly(img, np.array([(x - 2 * unit, y + 2.5 * unit), (x - 3.5 * unit, y + 6 * unit), (x + 1, y)]),
                  (255, 255, 255))
        fill_poly(img, _ellipse(x, y, 6.5 * unit, 4.0 * unit), (255, 255, 255))
        for dx in (-2.5, 0.0, 2.5):
            disc(img, (x + dx * unit, y), 0.7 * unit, (90, 90, 110))
    elif kind == "z":
        x, y = args
        s = 1.6 * unit
        pts = np.array([(x - s, y - s), (x + s, y - s), (x - s, y + s), (x + s, y + s)])
        for p, q in zip(pts[:-1], pts[1:], strict=True):
            segment(img, p, q, (210, 225, 255), 0.7 * unit)
    elif kind == "note":
        x, y = args
        pink = (240, 60, 150)  # reads on day skies and night skies alike
        disc(img, (x, y), 1.2 * unit, pink)
        segment(img, (x + 1.0 * unit, y), (x + 1.0 * unit, y - 4.5 * unit), pink, 0.6 * unit)
        segment(img, (x + 1.0 * unit, y - 4.5 * unit), (x + 2.8 * unit, y - 3.2 * unit), pink, 0.6 * unit)
    elif kind == "puff":
        x, y, r = args
        disc(img, (x, y), r * unit, (225, 220, 210))
    elif kind == "streak":
        x0, y0, x1, y1 = args
        segment(img, (x0, y0), (x1, y1), (255, 255, 255), 0.7 * unit)
    else:
        raise ValueError(f"unknown prop {kind!r}")


# --------------------------------------------------------------------------------------------
# Backgrounds: one static picture per (place, time of day), designed on a 96x64 grid.
# --------------------------------------------------------------------------------------------

# Per time of day: sky top and bottom colours, and the light multiplying everything the sun lights.
SKY: dict[str, tuple[RGB, RGB]] = {
    "morning": ((120, 175, 240), (255, 205, 175)),
    "noon": ((70, 145, 240), (175, 215, 255)),
    "evening": ((90, 60, 150), (255, 140, 70)),
    "night": ((8, 10, 35), (30, 40, 90)),
}
LIGHT: dict[str, tuple[float, float, float]] = {
    "morning": (1.0, 0.95, 0.9),
    "noon": (1.0, 1.0, 1.0),
    "evening": (0.95, 0.75, 0.62),
    "night": (0.3, 0.34, 0.52),
}
# Feet line of standing characters, in design rows (of 64).
GROUND = {"bedroom": 58.0, "kitchen": 58.0, "park": 56.0, "forest": 58.0, "beach": 56.0, "street": 53.0}
BED_TOP = 41.0  # design row of the mattress in the bedroom
BED_RIGHT = 40.0  # design column of the bed's foot end


class _Canvas:
    """Draws in design coordinates with the time of day's light applied to lit colours."""

    def __init__(self, height: int, width: int, time: str, wall: RGB | None = None, floor: RGB | None = None):
        self.img = np.zeros((height, width, 3), np.uint8)
        self.sx, self.sy = width / DESIGN_W, height / DESIGN_H
        self.light = LIGHT[time]
        self.time = time
        self.wall, self.floor = wall, floor  # a home's own colours (home.py); None: the rooms' defaults

    def lit(self, color: RGB) -> RGB:
        return tuple(int(min(255, c * k)) for c, k in zip(color, self.light, strict=True))

    def sky(self, top: float = 0.0, bottom: float = 64.0, x0: float = 0.0, x1: float = 96.0) -> None:
        c0, c1 = (np.array(c, np.float64) for c in SKY[self.time])
        r0, r1 = round(top * self.sy), round(bottom * self.sy)
        rows = np.linspace(0.0, 1.0, max(1, r1 - r0))[:, None]
        self.img[r0:r1, round(x0 * self.sx) : round(x1 * self.sx)] = (c0 * (1 - rows) + c1 * rows)[:, None, :].astype(
            np.uint8
        )

    def rect(self, x0, y0, x1, y1, color: RGB, lit: bool = True) -> None:
        pts = np.array([(x0, y0), (x1, y0), (x1, y1), (x0, y1)], np.float64)
        self.poly(pts, color, lit)

    def poly(self, pts, color: RGB, lit: bool = True) -> None:
        pts = np.asarray(pts, np.float64) * (self.sx, self.sy)
        fill_poly(self.img, pts, self.lit(color) if lit else color)

    def circle(self, x, y, r, color: RGB, lit: bool = True) -> None:
        fill_poly(self.img, _ellipse(x * self.sx, y * self.sy, r * self.sx, r * self.sy, n=20),
                  self.lit(color) if lit else color)

    def sun_or_moon(self, x: float, y: float) -> None:
        if self.time == "night":
            self.circle(x, y, 4.0, (245, 240, 200), lit=False)
            self.circle(x + 1.8, y - 1.2, 3.4, SKY["night"][0], lit=False)  # crescent
            for sx, sy in ((10, 4), (30, 9), (52, 3), (70, 12), (88, 6), (40, 15)):
                self.circle(sx, sy, 0.5, (255, 255, 220), lit=False)
        else:
            sun = {"morning": (255, 235, 170), "noon": (255, 248, 200), "evening": (255, 120, 60)}[self.time]
            self.circle(x, y, 4.5, sun, lit=False)


def _window(cv: _Canvas, x0, y0, x1, y1) -> None:
    cv.rect(x0 - 1.2, y0 - 1.2, x1 + 1.2, y1 + 1.2, (250, 250, 250))
    cv.sky(y0, y1, x0, x1)
    if cv.time == "night":
        cv.circle((x0 + x1) / 2 + 3, (y0 + y1) / 2 - 2, 2.0, (245, 240, 200), lit=False)
    cv.rect((x0 + x1) / 2 - 0.5, y0, (x0 + x1) / 2 + 0.5, y1, (250, 250, 250))


def _bedroom(cv: _Canvas) -> None:
    cv.rect(0, 0, 96, 48, cv.wall or (205, 185, 228))
    floor = cv.floor or (170, 118, 78)
    cv.rect(0, 48, 96, 64, floor)
    for x in range(0, 96, 12):
        cv.rect(x, 48, x + 0.5, 64, tuple(int(c * 0.82) for c in floor) if cv.floor else (140, 95, 62))
    _window(cv, 56, 9, 82, 29)
    cv.rect(2, 34, 5, 52, (130, 80, 50))  # headboard
    cv.rect(4, 41, BED_RIGHT, 47, (250, 245, 245))  # mattress
    cv.rect(4, 46, BED_RIGHT, 52, (130, 80, 50))  # bed frame
    cv.rect(6, 37.5, 14, 41.5, (255, 255, 255))  # pillow
    cv.rect(86, 36, 94, 48, (160, 105, 70))  # night stand and lamp
    cv.rect(89.5, 30, 90.5, 36, (90, 90, 90))
    lamp = (255, 225, 130) if cv.time == "night" else (250, 240, 210)
    cv.poly([(86, 30), (94, 30), (92, 25), (88, 25)], lamp, lit=cv.time != "night")
    if cv.time == "night":
        cv.circle(90, 33, 5.0, (120, 105, 80), lit=False)
        cv.poly([(86, 30), (94, 30), (92, 25), (88, 25)], lamp, lit=False)


def _kitchen(cv: _Canvas) -> None:
    cv.rect(0, 0, 96, 46, cv.wall or (246, 236, 185))
    grout = tuple(int(c * 0.9) for c in cv.wall) if cv.wall else (228, 212, 150)
    for x in range(0, 96, 6):
        cv.rect(x, 0, x + 0.4, 46, grout)
    for y in range(0, 46, 6):
        cv.rect(0, y, 96, y + 0.4, grout)
    for i, x in enumerate(range(0, 96, 8)):
        for j, y in enumerate(range(46, 64, 6)):
            cv.rect(x, y, x + 8, y + 6, (225, 225, 230) if (i + j) % 2 else cv.floor or (150, 160, 185))
    _window(cv, 32, 8, 50, 24)
    cv.rect(3, 10, 19, 50, (236, 242, 248))  # fridge
    cv.rect(3, 24, 19, 24.6, (170, 180, 190))
    cv.rect(16, 14, 17, 21, (150, 160, 170))
    cv.rect(60, 38, 92, 41, (185, 120, 70))  # table
    cv.rect(62, 41, 64, 54, (150, 95, 55))
    cv.rect(88, 41, 90, 54, (150, 95, 55))
    cv.circle(74, 36.5, 2.5, (255, 255, 255))  # plate and cup
    cv.rect(81, 33.5, 84, 38, (230, 90, 70))
    if cv.time == "night":
        cv.poly([(44, 0), (52, 0), (60, 30), (36, 30)], (70, 70, 55), lit=False)  # ceiling light cone
        cv.circle(48, 1.5, 2.0, (255, 240, 170), lit=False)


def _park(cv: _Canvas) -> None:
    cv.sky(0, 34)
    cv.sun_or_moon(20, 10)
    cv.poly([(0, 34), (20, 27), (44, 33), (70, 26), (96, 32), (96, 36), (0, 36)], (120, 200, 120))
    cv.rect(0, 34, 96, 64, (100, 190, 80))
    cv.poly([(0, 51), (96, 48), (96, 58), (0, 61)], (222, 200, 150))
    for x, r in ((12, 8.0), (84, 9.0)):
        cv.rect(x - 1.5, 26, x + 1.5, 45, (120, 80, 40))
        cv.circle(x, 22, r, (50, 150, 60))
        cv.circle(x - 3, 19, r * 0.45, (80, 175, 80))
    cv.rect(38, 38, 58, 40, (165, 100, 50))  # bench
    cv.rect(38, 34, 58, 35.5, (165, 100, 50))
    cv.rect(40, 40, 41, 45, (120, 80, 40))
    cv.rect(55, 40, 56, 45, (120, 80, 40))
    for x in (28, 66, 72):
        cv.circle(x, 44, 1.0, (255, 120, 160))
    if cv.time == "night":
        cv.rect(29.5, 20, 30.5, 46, (60, 60, 70), lit=False)
        cv.circle(30, 19, 2.2, (255, 235, 150), lit=False)


def _forest(cv: _Canvas) -> None:
    cv.sky(0, 30)
    cv.sun_or_moon(78, 8)
    cv.rect(0, 22, 96, 64, (40, 95, 50))
    for x, top, c in ((4, 6, (25, 95, 55)), (20, 2, (30, 110, 60)), (38, 9, (25, 90, 50)), (54, 3, (35, 115, 60)),
                      (72, 10, (25, 95, 55)), (90, 4, (30, 105, 58))):
        cv.rect(x - 1.5, 30, x + 1.5, 46, (95, 65, 35))
        for k in range(3):
            y = top + k * 9
            cv.poly([(x, y), (x + 9 + 2 * k, y + 14), (x - 9 - 2 * k, y + 14)], c)
    cv.rect(0, 46, 96, 64, (95, 120, 50))
    for x, y in ((14, 56), (46, 60), (84, 55)):
        cv.rect(x - 0.5, y - 2, x + 0.5, y, (240, 235, 220))
        cv.poly([(x - 2.5, y - 2), (x + 2.5, y - 2), (x, y - 4.5)], (225, 50, 50))
    if cv.time == "night":
        for x, y in ((10, 40), (30, 34), (62, 42), (80, 30)):  # fireflies
            cv.circle(x, y, 0.8, (230, 255, 120), lit=False)


def _beach(cv: _Canvas) -> None:
    cv.sky(0, 28)
    cv.sun_or_moon(70, 12)
    cv.rect(0, 28, 96, 41, (40, 130, 210))
    for x in range(2, 96, 14):
        cv.rect(x, 33, x + 5, 33.8, (225, 240, 255))
        cv.rect(x + 7, 37, x + 11, 37.8, (225, 240, 255))
    cv.rect(0, 40, 96, 64, (240, 215, 160))
    cv.poly([(0, 40), (96, 40), (96, 42), (0, 43.5)], (250, 250, 245))
    cv.rect(13.5, 30, 14.5, 50, (200, 200, 200))  # parasol
    cv.poly([(4, 32), (24, 32), (14, 25)], (235, 60, 60))
    cv.poly([(10, 32), (18, 32), (14, 25)], (255, 255, 255))
    cv.rect(85, 24, 88, 50, (150, 100, 50))  # palm
    for dx, dy in ((-9, 4), (9, 4), (-6, -2), (6, -2)):
        cv.poly([(86.5, 23), (86.5 + dx, 23 + dy), (86.5 + dx * 0.6, 23 + dy + 2)], (40, 150, 60))
    cv.circle(78, 58, 1.5, (255, 150, 130))  # shell


def _street(cv: _Canvas) -> None:
    cv.sky(0, 30)
    cv.sun_or_moon(48, 8)
    night = cv.time == "night"
    for x0, x1, top, c in ((0, 22, 8, (175, 175, 195)), (22, 42, 16, (205, 150, 130)), (42, 66, 4, (145, 165, 195)),
                           (66, 82, 14, (210, 195, 150)), (82, 96, 10, (165, 140, 175))):
        cv.rect(x0, top, x1, 40, c)
        for wx in np.arange(x0 + 2.5, x1 - 3, 6.0):
            for wy in np.arange(top + 3, 36, 7.0):
                lit_window = night and (int(wx * 7 + wy * 3) % 3 != 0)
                cv.rect(wx, wy, wx + 3, wy + 4, (255, 220, 120) if lit_window else (120, 160, 200), lit=not lit_window)
    cv.rect(0, 40, 96, 47, (190, 190, 195))
    cv.rect(0, 47, 96, 64, (75, 75, 85))
    for x in range(4, 96, 16):
        cv.rect(x, 57, x + 8, 58, (245, 245, 245))
    cv.rect(71, 18, 72.2, 46, (70, 70, 80))  # street lamp
    cv.rect(68, 17, 75, 19, (70, 70, 80))
    cv.circle(71.5, 20.5, 1.6, (255, 235, 150) if night else (235, 235, 225), lit=not night)


_PAINTERS = {
    "bedroom": _bedroom, "kitchen": _kitchen, "park": _park, "forest": _forest, "beach": _beach, "street": _street,
}


@lru_cache(maxsize=256)
def _background_cached(place: str, time: str, height: int, width: int, wall: RGB | None,
                       floor: RGB | None) -> np.ndarray:
    cv = _Canvas(height, width, time, wall, floor)
    _PAINTERS[place](cv)
    cv.img.setflags(write=False)
    return cv.img


def background(place: str, time: str, height: int, width: int, wall: RGB | None = None,
               floor: RGB | None = None) -> np.ndarray:
    """The static (H, W, 3) uint8 picture of ``place`` at ``time`` (read-only; copy before drawing on it).

    ``wall`` / ``floor`` recolour the indoor rooms (a film's own home, home.py); outdoors ignores them."""
    if place not in _PAINTERS:
        raise ValueError(f"unknown place {place!r}; one of {sorted(_PAINTERS)}")
    if time not in SKY:
        raise ValueError(f"unknown time of day {time!r}; one of {list(SKY)}")
    return _background_cached(place, time, height, width, wall, floor)
