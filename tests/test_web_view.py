"""The browser game's view helpers: the enlarged clip, the read-only bars, the history rows."""

import numpy as np

from animegamer.data.video import probe_video, write_mp4
from animegamer.game.browser import bars_html, compose_instruction, large_clip


def test_large_clip_is_written_once_beside_the_clip(tmp_path):
    frames = np.random.default_rng(0).integers(0, 255, (9, 64, 96, 3), dtype=np.uint8)
    clip = write_mp4(tmp_path / "turn_000.mp4", frames, fps=8)
    large = large_clip(clip)
    assert large.parent == tmp_path and large.name.startswith("turn_000_x6_")  # named by the clip's content
    info = probe_video(large)
    assert (info.height, info.width, info.num_frames) == (384, 576, 9)
    written = large.stat().st_mtime_ns
    assert large_clip(clip) == large and large.stat().st_mtime_ns == written  # not written again
    big = write_mp4(tmp_path / "big.mp4", np.zeros((9, 400, 600, 3), np.uint8), fps=8)
    assert large_clip(big) == big  # large enough already
    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video")
    assert large_clip(broken) == broken  # shown as it is rather than failing the page


def test_bars_are_static_html_and_fields_compose():
    text = bars_html(None)
    assert text.count('class="ag-bar"') == 3 and 'data-value="50"' in text and "<input" not in text
    assert compose_instruction("Qiqi", "gently", "read a book", "night bedroom", "") == \
        "Character: Qiqi; Motion: gently read a book; Background: night bedroom."
    assert compose_instruction("", None, "", "", "") == ""
