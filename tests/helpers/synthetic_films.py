"""Tiny synthetic films with known ground truth for the data pipeline tests.

A film is a textured background per scene (a different strong tint each, so a cut is an abrupt colour change), a
textured square bouncing left-right at a constant known speed, and optional black bars.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from animegamer.data.video import write_mp4

TINTS = [(240, 70, 50), (30, 40, 150), (110, 235, 110), (230, 220, 60)]  # red, dark blue, green, yellow scenes


def texture(height: int, width: int, seed: int, tint=(128, 128, 128)) -> np.ndarray:
    """Smooth random texture around ``tint``: (H, W, 3) uint8, far from black everywhere."""
    import cv2

    rng = np.random.default_rng(seed)
    noise = cv2.GaussianBlur(rng.integers(0, 255, (height, width)).astype(np.float32), (5, 5), 0)  # (H, W)
    image = 0.65 * np.asarray(tint, np.float32)[None, None, :] + 0.35 * noise[..., None]  # (H, W, 3)
    return np.clip(image, 0, 255).astype(np.uint8)


def moving_patch_frames(
    num_frames: int, height: int, width: int, speed: float, tint=(128, 128, 128), patch: int = 14, seed: int = 0
) -> np.ndarray:
    """A textured square bouncing horizontally at ``speed`` px/frame over a static texture: (T, H, W, 3)."""
    background = texture(height, width, seed, tint)
    square = texture(patch, patch, seed + 1000, (230, 230, 230))
    travel = width - patch - 2  # the square bounces within [1, width - patch - 1]
    frames = []
    for t in range(num_frames):
        x = (speed * t) % (2 * travel)
        x = int(round(1 + (x if x <= travel else 2 * travel - x)))
        frame = background.copy()
        y = height // 2 - patch // 2
        frame[y : y + patch, x : x + patch] = square
        frames.append(frame)
    return np.stack(frames)


def make_film(
    path: str | Path,
    seconds: float = 2.5,
    fps: int = 16,
    height: int = 64,
    width: int = 96,
    cuts: tuple[float, ...] = (),
    bars: tuple[int, int, int, int] = (0, 0, 0, 0),
    speed: float = 1.0,
    seed: int = 0,
) -> dict:
    """Write a film; returns its ground truth: content ``box`` (x0, y0, x1, y1), ``cuts`` (s) and ``scenes``.

    ``bars`` = (top, bottom, left, right) black bar sizes in pixels; ``speed`` in px per source frame.
    """
    top, bottom, left, right = bars
    inner_h, inner_w = height - top - bottom, width - left - right
    num = int(round(seconds * fps))
    bounds = [0.0, *cuts, seconds]
    frames = np.zeros((num, height, width, 3), np.uint8)
    for scene in range(len(bounds) - 1):
        first, last = int(round(bounds[scene] * fps)), int(round(bounds[scene + 1] * fps))
        content = moving_patch_frames(
            num, inner_h, inner_w, speed, tint=TINTS[scene % len(TINTS)], seed=seed + 17 * scene
        )
        frames[first:last, top : top + inner_h, left : left + inner_w] = content[first:last]
    write_mp4(path, frames, fps=fps)
    scenes = [(bounds[i], bounds[i + 1]) for i in range(len(bounds) - 1)]
    return {"box": (left, top, width - right, height - bottom), "cuts": list(cuts), "scenes": scenes}
