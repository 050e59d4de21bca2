"""The contact sheet and the nearest-neighbour upscale for people to look at (animegamer.game.contact_sheet)."""

import numpy as np
import pytest
from PIL import Image, ImageFont

from animegamer.game.contact_sheet import contact_sheet, readable_factor, upscale, wrap_label

INSTRUCTION = "turn 4: Character: Qiqi; Motion: happily talk with Momo; Background: still here."


def test_labels_wrap_at_spaces_and_keep_every_word():
    font = ImageFont.load_default()
    lines = wrap_label(INSTRUCTION, font, 120)
    assert len(lines) > 1 and all(font.getlength(line) <= 120 for line in lines)
    assert " ".join(lines).split() == INSTRUCTION.split()  # every word, whole, in order
    assert wrap_label("supercalifragilistic word", font, 20) == ["supercalifragilistic", "word"]  # never split


def test_upscale_is_nearest_neighbour():
    frames = np.arange(2 * 2 * 3 * 3, dtype=np.uint8).reshape(2, 2, 3, 3)  # (T, H, W, C)
    big = upscale(frames, 4)
    assert big.shape == (2, 8, 12, 3)
    assert np.array_equal(big[:, ::4, ::4], frames) and np.array_equal(big[:, 3::4, 3::4], frames)
    assert upscale(frames, 1) is frames
    assert (readable_factor(64), readable_factor(256), readable_factor(480)) == (4, 1, 1)
    with pytest.raises(ValueError):
        upscale(frames, 0)


def test_sheet_rows_grow_with_their_labels(tmp_path):
    frames = np.full((9, 64, 96, 3), 200, np.uint8)
    short = Image.open(contact_sheet([(frames, ["turn 0"])], tmp_path / "a.png", scale=2))
    assert short.size == (6 * (192 + 4) + 260, 128 + 8)
    tall = Image.open(contact_sheet([(frames, [INSTRUCTION * 3] * 3)], tmp_path / "b.png"))
    assert tall.height > 64 + 8  # the wrapped label needs more rows than the frames
