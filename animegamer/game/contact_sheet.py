"""A contact sheet of a game: one row per turn, a few frames of its clip and the state values beside them.

Small clips (SpriteWorld's 64x96) are unreadable at their own size: :func:`upscale` enlarges frames by an integer
factor with nearest-neighbour sampling (every pixel a crisp block, nothing invented), :func:`readable_factor` picks
the factor that brings a clip to a viewable height, and the label of each row is wrapped at word boundaries so a
whole instruction shows, never cut mid-word.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from animegamer.io import atomic_path

LABEL_WIDTH = 260
PAD = 4
READABLE_HEIGHT = 256  # clips lower than this are upscaled for people to look at
MAX_SHEET_PIXELS = 64_000_000  # ~190 MB of RGB; a bigger sheet is refused before any memory is taken for it


def sample_frame_indices(num_frames: int, count: int) -> list[int]:
    """``count`` evenly spaced frame indices, first and last included."""
    if num_frames <= count:
        return list(range(num_frames))
    return [round(i * (num_frames - 1) / (count - 1)) for i in range(count)]


def upscale(frames: np.ndarray, factor: int) -> np.ndarray:
    """(..., H, W, C) frames enlarged ``factor`` times by nearest neighbour -> (..., H * factor, W * factor, C)."""
    if factor < 1:
        raise ValueError(f"upscale factor must be >= 1, got {factor}")
    if factor == 1:
        return frames
    return np.repeat(np.repeat(frames, factor, axis=-3), factor, axis=-2)


def readable_factor(height: int, target: int = READABLE_HEIGHT) -> int:
    """The integer factor that brings a clip of ``height`` rows to at least ``target`` rows (1 if it is already)."""
    return max(1, math.ceil(target / max(1, height)))


def wrap_label(text: str, font: ImageFont.ImageFont, width: int) -> list[str]:
    """``text`` broken into lines of at most ``width`` pixels at spaces; a word wider than a line gets a line of
    its own, whole (never split)."""
    lines: list[str] = []
    for paragraph in text.split("\n"):
        words = paragraph.split()
        line = ""
        for word in words:
            candidate = f"{line} {word}" if line else word
            if line and font.getlength(candidate) > width:
                lines.append(line)
                line = word
            else:
                line = candidate
        lines.append(line)
    return lines


def contact_sheet(rows: list[tuple[np.ndarray, list[str]]], path: str | Path, frames_per_row: int = 6,
                  scale: int = 1, label_width: int = LABEL_WIDTH) -> Path:
    """Write a PNG: for each ``(frames (T, H, W, 3) uint8, label lines)`` a row of frames then its label text.

    Frames are enlarged ``scale`` times (nearest neighbour); label lines longer than ``label_width`` pixels wrap
    at spaces, so every word of every line shows. ValueError, before the image is made, for a sheet of more than
    ``MAX_SHEET_PIXELS``."""
    if not rows:
        raise ValueError("a contact sheet needs at least one row")
    font = ImageFont.load_default()
    wrapped = [[piece for line in lines for piece in wrap_label(line, font, label_width - PAD)] for _, lines in rows]
    height = max(frames.shape[1] for frames, _ in rows) * scale
    width = max(frames.shape[2] for frames, _ in rows) * scale
    line_height = 12
    row_heights = [max(height, line_height * len(lines)) + PAD for lines in wrapped]
    size = (frames_per_row * (width + PAD) + label_width, sum(row_heights) + PAD)
    if size[0] * size[1] > MAX_SHEET_PIXELS:
        raise ValueError(f"a contact sheet of {size[0]}x{size[1]} pixels is more than {MAX_SHEET_PIXELS:,}: "
                         "show fewer rows per sheet or shorter labels")
    sheet = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(sheet)
    top = PAD
    for (frames, _), lines, row_height in zip(rows, wrapped, row_heights, strict=True):
        for c, index in enumerate(sample_frame_indices(len(frames), frames_per_row)):
            sheet.paste(Image.fromarray(upscale(frames[index], scale)), (PAD + c * (width + PAD), top))
        left = frames_per_row * (width + PAD) + PAD
        for k, text in enumerate(lines):
            draw.text((left, top + k * line_height), text, fill="black", font=font)
        top += row_height
    path = Path(path)
    with atomic_path(path) as tmp:
        sheet.save(tmp, format="PNG")
    return path
