"""Synthetic clip frames for tests: a square moving over a gradient background."""

from __future__ import annotations

import numpy as np


def make_clip_frames(num_frames: int = 9, height: int = 48, width: int = 64, speed: float = 3.0, seed: int = 0):
    """A square moving right at ``speed`` px/frame over a gradient background, (T, H, W, 3) uint8."""
    rng = np.random.default_rng(seed)
    base = np.zeros((height, width, 3), np.uint8)
    base[..., 0] = np.linspace(20, 120, width, dtype=np.uint8)[None, :]
    base[..., 2] = rng.integers(30, 60)
    frames = []
    for t in range(num_frames):
        frame = base.copy()
        x = int(4 + speed * t) % (width - 12)
        frame[height // 2 - 6 : height // 2 + 6, x : x + 12] = (250, 200, 40)
        frames.append(frame)
    return np.stack(frames)
