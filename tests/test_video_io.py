"""Video files as they come from real disks and real cameras (animegamer.data.video): a write that fails half way
never publishes a clip, sizes are checked before decoding, rotation metadata is applied, a file without a picture
is one line."""

import json
import struct
import subprocess

import imageio_ffmpeg
import numpy as np
import pytest

from animegamer.data import video
from animegamer.data.cuts import Box
from animegamer.data.films import CutSettings, FilmJob, cut_film, process_film, sample_frames
from animegamer.data.video import (
    VideoReadError,
    VideoWriteError,
    mp4_stream,
    probe_video,
    read_video,
    write_gif,
    write_mp4,
)
from tests.helpers.clips import make_clip_frames
from tests.helpers.limits import run_python
from tests.helpers.synthetic_films import make_film

WRITE_ALL = """
import json, sys
import numpy as np
from animegamer.data.video import mp4_stream, write_gif, write_mp4
from animegamer.game.turn import write_clip
frames = np.random.default_rng(0).integers(0, 255, (17, 64, 96, 3), dtype=np.uint8)  # noise: ~100 kB as mp4


def streamed(path):
    with mp4_stream(path) as append:
        for i in range(0, 17, 4):
            append(frames[i:i + 4])


out = {}
writers = [("clip.mp4", write_mp4), ("clip.gif", write_gif), ("game.mp4", lambda p, f: streamed(p)),
           ("turn_000", lambda p, f: write_clip(f, p))]  # a game's clip: its gif, then its mp4
for name, write in writers:
    try:
        write(sys.argv[1] + "/" + name, frames)
        out[name] = "written"
    except OSError as exc:
        out[name] = [type(exc).__name__, str(exc)]
print(json.dumps(out))
"""


@pytest.mark.parametrize("limit", [0, 1_000, 4_096, 30_000])
def test_a_full_disk_publishes_no_video_and_says_so_in_one_line(tmp_path, limit):
    """A real write limit (``ulimit -f``: a write past it fails like one on a full disk): every writer (a clip, its
    gif, a video streamed piece by piece, a game turn's gif + mp4) raises VideoWriteError (an OSError) naming its
    file, and leaves nothing."""
    result = run_python(["-c", WRITE_ALL, str(tmp_path)], file_limit=limit)
    assert result.returncode == 0, result.stderr
    outcome = json.loads(result.stdout)
    for name in ("clip.mp4", "clip.gif", "game.mp4", "turn_000"):
        kind, message = outcome[name]
        assert kind == "VideoWriteError", outcome
        assert message.startswith(str(tmp_path / name)) and "\n" not in message, message
    assert list(tmp_path.iterdir()) == []  # no partial file, no temp file


def test_a_video_written_without_a_limit_decodes_to_every_frame(tmp_path):
    frames = make_clip_frames(9, 31, 45)  # odd sides: padded
    write_mp4(tmp_path / "a.mp4", frames, fps=8)
    decoded, fps = read_video(tmp_path / "a.mp4")
    assert decoded.shape == (9, 32, 46, 3) and fps == 8
    assert np.abs(decoded[:, :31, :45].astype(int) - frames).mean() < 6
    write_gif(tmp_path / "a.gif", frames)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.gif", "a.mp4"]


def test_an_encoder_that_is_given_nothing_or_dies_publishes_nothing(tmp_path):
    with pytest.raises(VideoWriteError, match="no frames"), mp4_stream(tmp_path / "empty.mp4"):
        pass
    with pytest.raises(VideoWriteError, match="ffmpeg"), mp4_stream(tmp_path / "killed.mp4") as append:
        append(np.zeros((2, 16, 16, 3), np.uint8))
        killed = [obj for obj in append.__self__.__dict__.values() if isinstance(obj, subprocess.Popen)]
        killed[0].kill()  # the encoder gone half way (OOM killer, a kill): what it wrote is never published
        killed[0].wait()
        for _ in range(200):  # until the pipe says so
            append(np.zeros((8, 16, 16, 3), np.uint8))
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- sizes checked before decoding


@pytest.mark.parametrize("side, pixels, refused", [(80, 10**9, True), (10**5, 5_000, True), (96, 6_144, False)])
def test_frame_sizes_past_the_limits_are_refused_before_any_frame_is_decoded(tmp_path, monkeypatch, side, pixels,
                                                                              refused):
    make_film(tmp_path / "film.mp4", seconds=1.0, height=64, width=96)
    monkeypatch.setattr(video, "MAX_FRAME_SIDE", side)
    monkeypatch.setattr(video, "MAX_FRAME_PIXELS", pixels)
    readers = [probe_video, read_video, sample_frames]
    if not refused:
        assert probe_video(tmp_path / "film.mp4").width == 96
        return
    for reader in readers:
        with pytest.raises(VideoReadError, match=r"96x64 pixels are past the limit") as exc:
            reader(tmp_path / "film.mp4")
        assert str(exc.value).startswith(str(tmp_path / "film.mp4")) and "\n" not in str(exc.value)


def declared_size_film(path, width: int, height: int) -> None:
    """A 7 kB AVI of two raw 16x16 frames whose headers declare ``width`` x ``height`` frames: what a hostile or
    broken file looks like to a reader that trusts the container."""
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "color=red:s=16x16:r=8",
                    "-frames:v", "2", "-c:v", "rawvideo", "-pix_fmt", "bgr24", str(path)], check=True)
    data = bytearray(path.read_bytes())
    strf, avih = data.find(b"strf"), data.find(b"avih")
    struct.pack_into("<ii", data, strf + 12, width, height)  # BITMAPINFOHEADER biWidth, biHeight
    struct.pack_into("<II", data, avih + 40, width, height)  # MainAVIHeader dwWidth, dwHeight
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("width, height", [(16000, 16000), (9000, 100), (100, 9000), (7000, 7000)])
def test_a_small_file_declaring_huge_frames_is_refused_from_its_header(tmp_path, width, height):
    film = tmp_path / "huge.avi"
    declared_size_film(film, width, height)
    assert film.stat().st_size < 10_000
    for reader in (probe_video, read_video, sample_frames):
        with pytest.raises(VideoReadError, match=f"frames of {width}x{height} pixels are past the limit"):
            reader(film)
    result = process_film(FilmJob(str(film), "huge", str(tmp_path / "out"), CutSettings(height=48, width=64)))
    assert result.error and "past the limit" in result.error and not result.records


def test_read_video_holds_no_more_than_its_bound(tmp_path, monkeypatch):
    make_film(tmp_path / "film.mp4", seconds=2.0, height=64, width=96)  # 32 frames of 18 kB
    monkeypatch.setattr(video, "MAX_DECODED_BYTES", 10 * 64 * 96 * 3)
    with pytest.raises(VideoReadError, match="bytes of frames"):
        read_video(tmp_path / "film.mp4")
    assert len(read_video(tmp_path / "film.mp4", end=0.5)[0]) == 8  # a short span fits


def test_a_file_without_a_picture_is_one_line(tmp_path):
    audio = tmp_path / "song.mp4"
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-f", "lavfi", "-i", "sine=duration=1",
                    "-c:a", "aac", str(audio)], check=True)
    for reader in (probe_video, read_video, sample_frames):
        with pytest.raises(VideoReadError, match="no video stream") as exc:
            reader(audio)
        assert str(audio) in str(exc.value)


# ---------------------------------------------------------------------- rotation metadata


def upright_frames(count: int = 8) -> np.ndarray:
    """(T, 32, 48, 3): four flat quadrants of distinct colours, so any turn or mirror of the picture shows."""
    frame = np.zeros((32, 48, 3), np.uint8)
    frame[:16, :24], frame[:16, 24:], frame[16:, :24], frame[16:, 24:] = (230, 30, 30), (30, 230, 30), \
        (30, 30, 230), (230, 230, 30)
    return np.repeat(frame[None], count, axis=0)


def rotated_film(tmp_path, degrees: int) -> object:
    """The upright frames stored turned (as a phone stores them) with the display matrix that turns them back."""
    stored = np.rot90(upright_frames(), -(degrees // 90), axes=(1, 2))
    plain = write_mp4(tmp_path / f"stored{degrees}.mp4", stored, fps=8)
    film = tmp_path / f"film{degrees}.mp4"
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-display_rotation", str(degrees), "-i",
                    str(plain), "-c", "copy", str(film)], check=True)
    return film


@pytest.mark.parametrize("degrees", [90, 180, 270, 0])
def test_rotation_metadata_is_applied_to_every_frame_read(tmp_path, degrees):
    film = rotated_film(tmp_path, degrees)
    info = probe_video(film)
    assert (info.height, info.width, info.rotation) == (32, 48, degrees)
    frames, _ = read_video(film)
    assert frames.shape == (8, 32, 48, 3)
    assert np.abs(frames.astype(int) - upright_frames()).mean() < 6
    samples = sample_frames(film, count=2)
    assert samples.shape == (2, 32, 48, 3) and np.abs(samples.astype(int) - upright_frames(2)).mean() < 6


@pytest.mark.parametrize("degrees", [90, 270])
def test_a_rotated_film_is_cut_into_upright_clips(tmp_path, degrees):
    upright = tmp_path / "upright.mp4"
    make_film(upright, seconds=2.5, height=64, width=96, bars=(8, 8, 0, 0))
    frames, fps = read_video(upright)
    stored = write_mp4(tmp_path / "stored.mp4", np.rot90(frames, -(degrees // 90), axes=(1, 2)), fps=fps)
    film = tmp_path / "phone.mp4"
    subprocess.run([imageio_ffmpeg.get_ffmpeg_exe(), "-v", "error", "-display_rotation", str(degrees), "-i",
                    str(stored), "-c", "copy", str(film)], check=True)
    settings = CutSettings(height=48, width=64)
    expected = cut_film(upright, "upright", tmp_path / "a", settings)
    result = cut_film(film, "phone", tmp_path / "b", settings)
    assert result.crop == expected.crop == [0, 8, 96, 56]  # the letterbox found in the upright picture
    assert len(result.records) == len(expected.records) == 1
    clip, _ = read_video(tmp_path / "b" / result.records[0].video)
    reference, _ = read_video(tmp_path / "a" / expected.records[0].video)
    assert clip.shape == reference.shape == (17, 48, 64, 3)
    assert np.abs(clip.astype(int) - reference).mean() < 4


@pytest.mark.parametrize("degrees", [0, 90, 180, 270])
def test_a_box_of_the_upright_picture_maps_back_to_the_stored_frame(degrees):
    upright = np.arange(6 * 10).reshape(6, 10)  # (H, W) of the displayed picture
    stored = np.rot90(upright, -(degrees // 90))
    box = Box(2, 1, 7, 4)
    mapped = box.stored(degrees, stored.shape[1], stored.shape[0])
    assert sorted(mapped.crop(stored).ravel()) == sorted(box.crop(upright).ravel())
