"""A contact sheet of a game: one row per turn, a few frames of its clip and the state values beside them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from animegamer.io import atomic_path

LABEL_WIDTH = 260
PAD = 4


def sample_frame_indices(num_frames: int, count: int) -> list[int]:
    """``count`` evenly spaced frame indices, first and last included."""
    if num_frames <= count:
        return list(range(num_frames))
    return [round(i * (num_frames - 1) / (count - 1)) for i in range(count)]


def contact_sheet(rows: list[tuple[np.ndarray, list[str]]], path: str | Path, frames_per_row: int = 6) -> Path:
    """Write a PNG: for each ``(frames (T, H, W, 3) uint8, label lines)`` a row of frames then its label text."""
    if not rows:
        raise ValueError("a contact sheet needs at least one row")
    height = max(frames.shape[1] for frames, _ in rows)
    width = max(frames.shape[2] for frames, _ in rows)
    font = ImageFont.load_default()
    line_height = 12
    row_height = max(height, line_height * max(len(lines) for _, lines in rows)) + PAD
    sheet = Image.new("RGB", (frames_per_row * (width + PAD) + LABEL_WIDTH, len(rows) * row_height + PAD), "white")
    draw = ImageDraw.Draw(sheet)
    for r, (frames, lines) in enumerate(rows):
        top = PAD + r * row_height
        for c, index in enumerate(sample_frame_indices(len(frames), frames_per_row)):
            sheet.paste(Image.fromarray(frames[index]), (PAD + c * (width + PAD), top))
        left = frames_per_row * (width + PAD) + PAD
        for k, text in enumerate(lines):
            draw.text((left, top + k * line_height), text, fill="black", font=font)
    path = Path(path)
    with atomic_path(path) as tmp:
        sheet.save(tmp, format="PNG")
    return path


def state_bar(name: str, value: int, width: int = 20) -> str:
    """A text bar for the terminal and the sheet: ``stamina  [#########-----------]  45``."""
    filled = round(width * max(0, min(100, value)) / 100)
    return f"{name:<13} [{'#' * filled}{'-' * (width - filled)}] {value:3d}"
