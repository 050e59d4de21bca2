"""What the SpriteWorld tests (tests/test_spriteworld.py, tests/test_spriteworld_memory.py) share: a small world's
config, the manifest fields a shot is rebuilt from, and a mask of the pixels of one colour."""

from __future__ import annotations

import numpy as np

from animegamer.config import SpriteWorldConfig

SPEC_KEYS = ("character", "action", "place", "time", "adverb", "friend")  # a record's extra fields of its ShotSpec


def small_config(out, **kw) -> SpriteWorldConfig:
    """A 6-film world of 8 shots each into ``out``; ``kw`` replaces any field."""
    values = dict(output_dir=str(out), num_films=6, shots_per_film=8, test_fraction=0.34, workers=2, speed_jitter=0.3)
    values.update(kw)
    return SpriteWorldConfig(**values)


def colour_mask(frames: np.ndarray, colour, tol: float = 28.0) -> np.ndarray:
    """Where ``frames`` (T, H, W, 3) are within ``tol`` (RGB distance) of ``colour``."""
    return np.linalg.norm(frames.astype(np.float64) - np.array(colour), axis=-1) < tol  # (T, H, W)
