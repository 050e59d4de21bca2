import os

import numpy as np
import pytest

from animegamer.data.cuts import detect_scenes, iter_frames_at, plan_clips
from animegamer.data.films import (
    Box,
    CutSettings,
    FilmJob,
    aspect_box,
    assign_film_ids,
    check_folders,
    cut_film,
    detect_black_borders,
    find_films,
    fit_frame,
    process_film,
    sample_frames,
)
from animegamer.data.video import VideoReadError, probe_video, read_video
from tests.helpers.synthetic_films import TINTS, make_film

SMALL = CutSettings(height=48, width=64, fps=8, clip_seconds=2.0)


@pytest.mark.parametrize(
    "bars",
    [(8, 8, 0, 0), (0, 0, 12, 10), (6, 10, 12, 8), (0, 0, 0, 0)],
    ids=["letterbox", "pillarbox", "both", "none"],
)
def test_black_borders_cropped_to_the_content_box(tmp_path, bars):
    truth = make_film(tmp_path / "film.mp4", seconds=1.5, bars=bars)
    box = detect_black_borders(sample_frames(tmp_path / "film.mp4"), threshold=16)
    assert np.abs(np.array(box.to_list()) - np.array(truth["box"])).max() <= 2, (box, truth["box"])


def test_borders_need_black_in_every_sample():
    frames = np.full((4, 20, 30, 3), 120, np.uint8)
    frames[:, :3] = 0  # a real letterbox bar: black in all samples
    frames[0, -5:] = 0  # dark bottom rows in one sample only: content, not a bar
    assert detect_black_borders(frames) == Box(0, 3, 30, 20)
    assert detect_black_borders(np.zeros((2, 20, 30, 3), np.uint8)) == Box(0, 0, 30, 20)  # all black: keep all


def test_aspect_crop_then_resize_never_stretches():
    wide = aspect_box(Box(0, 8, 96, 56), height=48, width=64)  # 96x48 content -> 4:3
    assert (wide.width, wide.height) == (64, 48) and wide.x0 == 16  # trimmed equally left and right
    tall = aspect_box(Box(10, 0, 50, 100), height=48, width=64)  # 40x100 content -> 4:3
    assert (tall.width, tall.height) == (40, 30) and tall.y0 == 35
    frame = np.zeros((100, 120, 3), np.uint8)
    frame[:, 60:] = 255
    out = fit_frame(frame, Box(0, 0, 120, 90), 48, 64)
    assert out.shape == (48, 64, 3)
    assert out[:, :30].max() == 0 and out[:, 34:].min() == 255  # the edge stays in the middle


def test_scene_cuts_found_near_the_true_frames(tmp_path):
    truth = make_film(tmp_path / "film.mp4", seconds=6.75, cuts=(2.25, 4.5), bars=(8, 8, 0, 0))
    scenes = detect_scenes(tmp_path / "film.mp4", Box(*truth["box"]))
    assert len(scenes) == 3
    found = [start for start, _ in scenes[1:]]
    assert np.allclose(found, truth["cuts"], atol=1 / 16 + 1e-6)  # within one source frame
    assert scenes[0][0] == 0.0 and scenes[-1][1] == pytest.approx(6.75, abs=1 / 16)


def test_plan_clips_back_to_back_within_scenes():
    plans = plan_clips([(0.0, 4.1), (4.1, 5.0), (5.0, 9.0)], SMALL, native_fps=16)
    assert [(p.start, p.end, p.scene_index) for p in plans] == [(0.0, 2.0, 0), (2.0, 4.0, 0), (5.0, 7.0, 2)]
    assert [p.clip_index for p in plans] == [0, 1, 2]
    assert len(plans[0].times) == 17 and np.allclose(np.diff(plans[0].times), 1 / 8)
    assert plans[1].times[-1] == pytest.approx(4.0)  # closing frame included, still inside the scene


def test_clip_length_must_be_a_whole_number_of_frames(tmp_path):
    # 2.1 s at 8 fps is 16.8 frame steps: cut as 18 frames (2.125 s) the clips drifted from the 2.1 s plan
    # (2 of 4 "moved") and their records said 2.1 s; a scene's last clip could cross its cut.
    uneven = CutSettings(height=48, width=64, fps=8, clip_seconds=2.1, cut_check_threshold=0)
    with pytest.raises(ValueError, match=r"clip_seconds=2.1 at fps=8 is 16.8 frame steps.* e\.g\. 2 or 2\.125"):
        plan_clips([(0.0, 9.0)], uneven, native_fps=16)
    make_film(tmp_path / "film.mp4", seconds=9.0, cuts=(4.5,))
    with pytest.raises(ValueError, match="not a whole number"):
        cut_film(tmp_path / "film.mp4", "film", tmp_path / "out", uneven)
    even = CutSettings(height=48, width=64, fps=8, clip_seconds=2.125, cut_check_threshold=0)
    result = cut_film(tmp_path / "film.mp4", "film", tmp_path / "out", even)
    assert [(r.start, r.end) for r in result.records] == [(0.0, 2.125), (2.125, 4.25), (4.5, 6.625), (6.625, 8.75)]
    assert (result.check["planned"], result.check["written"], result.check["moved"]) == (4, 4, 0)
    assert probe_video(tmp_path / "out" / result.records[-1].video).num_frames == 18


def test_cut_film_writes_two_second_clips_in_order(tmp_path):
    truth = make_film(tmp_path / "film.mp4", seconds=6.75, cuts=(2.25, 4.5), bars=(8, 8, 0, 0))
    result = cut_film(tmp_path / "film.mp4", "film", tmp_path / "out", SMALL)
    assert result.crop == list(truth["box"])
    assert len(result.scenes) == 3
    records = result.records
    assert [r.clip_index for r in records] == [0, 1, 2]
    assert [r.clip_id for r in records] == ["film_00000", "film_00001", "film_00002"]
    starts = [r.start for r in records]
    assert starts == sorted(starts) and np.allclose(starts, [0.0, 2.25, 4.5], atol=1 / 16 + 1e-6)
    for scene, record in enumerate(records):
        assert record.end - record.start == pytest.approx(2.0)
        assert record.extra["scene"] == scene
        lo, hi = result.scenes[scene]
        assert lo <= record.start and record.end < hi  # no clip crosses a cut
        path = tmp_path / "out" / record.video
        assert record.video == f"clips/film/{scene:05d}.mp4"
        info = probe_video(path)
        assert (info.num_frames, info.height, info.width, info.fps) == (17, 48, 64, 8.0)
        frames, _ = read_video(path)
        # The clip shows its own scene's tint from the first to the last frame, and no black bar is left.
        for frame in (frames[0], frames[-1]):
            assert np.argmax(frame.reshape(-1, 3).mean(0)) == np.argmax(TINTS[scene])
        assert frames[:, :2].mean() > 40 and frames[:, -2:].mean() > 40


def test_decord_reader_takes_the_same_frames(tmp_path):
    make_film(tmp_path / "film.mp4", seconds=2.5, speed=2.0)
    (plan,) = plan_clips([(0.0, 2.5)], SMALL, native_fps=16)
    a = np.stack([f for _, f, _ in iter_frames_at(tmp_path / "film.mp4", plan.times, "pyav")])
    b = np.stack([f for _, f, _ in iter_frames_at(tmp_path / "film.mp4", plan.times, "decord")])
    assert a.shape == b.shape == (17, 64, 96, 3)
    assert np.abs(a.astype(int) - b.astype(int)).mean() < 2.0


def test_unreadable_film_is_reported_not_raised(tmp_path):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + np.random.default_rng(0).bytes(4000))
    with pytest.raises(VideoReadError, match="broken.mp4"):
        cut_film(bad, "broken", tmp_path / "out", SMALL)
    result = process_film(FilmJob(str(bad), "broken", str(tmp_path / "out"), SMALL))
    assert result.records == [] and str(bad) in result.error
    assert not (tmp_path / "out" / "clips" / "broken").exists()


def test_find_films_and_unique_ids(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    for p in ("a/Ep 01.mkv", "b/Ep 01.mp4", "a/notes.txt", "c.webm"):
        (tmp_path / p).write_bytes(b"x")
    films, unusable = find_films([str(tmp_path / "a"), str(tmp_path / "b"), str(tmp_path / "c.webm")])
    assert [p.name for p in films] == ["Ep 01.mkv", "Ep 01.mp4", "c.webm"] and unusable == {}
    assert list(assign_film_ids(films)) == ["Ep_01", "Ep_01_2", "c"]
    with pytest.raises(FileNotFoundError, match="nope"):
        find_films([str(tmp_path / "nope")])


def test_films_that_are_not_regular_files_are_reported_not_opened(tmp_path):
    films = tmp_path / "films"
    films.mkdir()
    (films / "good.mp4").write_bytes(b"x")
    os.mkfifo(films / "pipe.mkv")  # opening it would block the run forever
    (films / "loop.mp4").symlink_to("loop.mp4")
    (films / "a.webm").symlink_to("b.webm")
    (films / "b.webm").symlink_to("a.webm")
    (films / "gone.mov").symlink_to(tmp_path / "deleted.mov")
    (films / "tty.avi").symlink_to("/dev/null")
    (films / "notes.txt").symlink_to("notes.txt")  # not named like a film: not ours to report
    os.mkfifo(tmp_path / "named.mp4")
    found, unusable = find_films([str(films), str(tmp_path / "named.mp4")])
    assert [p.name for p in found] == ["good.mp4"]
    assert set(unusable) == {str(films / n) for n in ("pipe.mkv", "loop.mp4", "a.webm", "b.webm", "gone.mov",
                                                      "tty.avi")} | {str(tmp_path / "named.mp4")}
    assert "named pipe" in unusable[str(films / "pipe.mkv")] and "named pipe" in unusable[str(tmp_path / "named.mp4")]
    assert "symlink loop" in unusable[str(films / "loop.mp4")] and "symlink loop" in unusable[str(films / "a.webm")]
    assert "link to nothing" in unusable[str(films / "gone.mov")]
    assert "device" in unusable[str(films / "tty.avi")]


def overlap_cases(tmp_path):
    """(films inputs, output_dir) pairs that overlap, each built under tmp_path."""
    films = tmp_path / "films"
    (films / "season1").mkdir(parents=True)
    (films / "season1" / "ep1.mp4").write_bytes(b"x")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "to_films").symlink_to(films)
    (elsewhere / "to_out").symlink_to(films / "prepared")
    out = tmp_path / "out"
    (out / "clips" / "ep1").mkdir(parents=True)
    (out / "clips" / "ep1" / "00000.mp4").write_bytes(b"x")
    (out / "raw").mkdir()
    (films / "season1" / "linked.mp4").symlink_to(out / "clips" / "ep1" / "00000.mp4")
    (elsewhere / "to_clips").symlink_to(out / "clips")
    return {
        "out inside films": ([films], films / "prepared"),
        "out deep inside films": ([films], films / "season1" / "a" / "b"),
        "same folder": ([films], films),
        "same folder via a symlink": ([elsewhere / "to_films"], films),
        "out a symlink into films": ([films / "season1"], elsewhere / "to_out" / ".." / "season1" / "x"),
        "films are our clips": ([out / "clips"], out),
        "films inside our clips": ([out / "clips" / "ep1"], out),
        "films inside our clips via a symlink": ([elsewhere / "to_clips"], out),
        "a clip of ours given as a film": ([out / "clips" / "ep1" / "00000.mp4"], out),
        "out inside a films folder holding our clips": ([tmp_path], out),
        "out inside films via a symlinked film folder": ([elsewhere / "to_films"], films / "prepared"),
    }


@pytest.mark.parametrize("case", ["out inside films", "out deep inside films", "same folder",
                                  "same folder via a symlink", "out a symlink into films", "films are our clips",
                                  "films inside our clips", "films inside our clips via a symlink",
                                  "a clip of ours given as a film", "out inside a films folder holding our clips",
                                  "out inside films via a symlinked film folder"])
def test_overlapping_films_and_output_folders_are_refused(tmp_path, case):
    inputs, out = overlap_cases(tmp_path)[case]
    found, _ = find_films([str(i) for i in inputs])
    with pytest.raises(ValueError, match="output_dir") as exc:
        check_folders([str(i) for i in inputs], found, out)
    assert "\n" not in str(exc.value)


def test_a_film_symlinked_to_a_clip_of_ours_is_refused(tmp_path):
    films, out = tmp_path / "films", tmp_path / "out"
    (out / "clips" / "ep1").mkdir(parents=True)
    (out / "clips" / "ep1" / "00000.mp4").write_bytes(b"x")
    films.mkdir()
    (films / "new.mp4").symlink_to(out / "clips" / "ep1" / "00000.mp4")
    found, _ = find_films([str(films)])
    with pytest.raises(ValueError, match="00000.mp4 lies inside .*clips .a clip of an earlier run"):
        check_folders([str(films)], found, out)


def test_separate_folders_are_accepted(tmp_path):
    films = tmp_path / "films"
    films.mkdir()
    (films / "ep1.mp4").write_bytes(b"x")
    for out in (tmp_path / "films2", tmp_path / "out", tmp_path / "a" / "films"):  # a shared prefix is not overlap
        check_folders([str(films)], find_films([str(films)])[0], out)
    # films elsewhere in output_dir never see the clips written to output_dir/clips
    out = tmp_path / "data"
    (out / "raw").mkdir(parents=True)
    (out / "raw" / "ep2.mkv").write_bytes(b"x")
    (out / "ep3.mp4").write_bytes(b"x")
    (out / "clips_old").mkdir()
    inputs = [str(out / "raw"), str(out / "ep3.mp4"), str(out / "clips_old")]
    check_folders(inputs, find_films(inputs)[0], out)
