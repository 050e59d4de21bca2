"""The training stages as recipes over the one loop (animegamer/training/loop.py): ``stage_a`` .. ``stage_e``, each
its config, what it builds, one micro-batch's loss and what it saves; ``main(argv)`` trains it from a command line
(``scripts/train_stage_*.py`` call it, and so does :func:`train_stage`)."""

from __future__ import annotations

import importlib
from pathlib import Path

STAGES = ("stage_a", "stage_b", "stage_c", "stage_d", "stage_e")


def train_stage(stage: str, argv: list[str]) -> Path:
    """Train ``stage`` ("stage_a" .. "stage_e") in this process from a command line; returns its output_dir."""
    if stage not in STAGES:
        raise ValueError(f"{stage!r} is not a training stage (one of {', '.join(STAGES)})")
    return importlib.import_module(f"animegamer.recipes.{stage}").main(argv)
