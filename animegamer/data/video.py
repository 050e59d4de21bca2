"""Video I/O. PyAV is the default reader (decord is kept as a backend); clips are written as mp4 and gif.

Frames are ``uint8`` numpy arrays of shape (T, H, W, 3), RGB, upright: a film's rotation metadata (the display
matrix phones write instead of turning the picture) is applied while decoding, so sizes are the displayed ones.

Limits on what is read, checked from the container's metadata before any frame is decoded (a small file can
declare huge frames): at most ``MAX_FRAME_SIDE`` pixels a side and ``MAX_FRAME_PIXELS`` a frame (8K UHD), and
``read_video`` (which holds every frame it returns) at most ``MAX_DECODED_BYTES`` of frames.

Every file written here is checked before it is published: ffmpeg's exit status, then the temp file is decoded
and must hold exactly the frames given. Anything else (a full disk, a file size limit, a killed encoder) removes
the temp file and raises :class:`VideoWriteError`, an ``OSError`` with one line naming the file.
"""

from __future__ import annotations

import re
import signal
import subprocess
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from animegamer.io import atomic_path

BACKENDS = ("pyav", "decord")
MAX_FRAME_SIDE = 8192  # pixels, either side
MAX_FRAME_PIXELS = 7680 * 4320  # 8K UHD: one RGB frame is 100 MB
MAX_DECODED_BYTES = 4 << 30  # frames read_video may hold at once


class VideoReadError(RuntimeError):
    """A video could not be opened or decoded; the message names the file."""


class VideoWriteError(OSError):
    """A video could not be written completely (a full disk, ffmpeg failed); nothing is left at its path or beside
    it, and the message (one line) names the file."""


@dataclass
class VideoInfo:
    fps: float
    num_frames: int
    height: int  # as displayed (after the rotation)
    width: int
    rotation: int = 0  # quarter turns counter-clockwise that make the stored picture upright: 0, 90, 180 or 270

    @property
    def duration(self) -> float:
        return self.num_frames / self.fps if self.fps else 0.0


def video_stream(container: Any, path: str | Path) -> Any:
    """The first video stream of an open PyAV container, its frame size checked against the limits;
    :class:`VideoReadError` for a file without one (an audio-only film) or with frames past them."""
    if not container.streams.video:
        raise VideoReadError(f"{path}: no video stream (an audio-only file?)")
    stream = container.streams.video[0]
    check_frame_size(path, stream.width, stream.height)
    return stream


def check_frame_size(path: str | Path, width: int, height: int) -> None:
    """:class:`VideoReadError` (one line) for a frame size past ``MAX_FRAME_SIDE`` / ``MAX_FRAME_PIXELS``."""
    if width > MAX_FRAME_SIDE or height > MAX_FRAME_SIDE or width * height > MAX_FRAME_PIXELS:
        raise VideoReadError(f"{path}: frames of {width}x{height} pixels are past the limit of {MAX_FRAME_SIDE} a "
                             f"side and {MAX_FRAME_PIXELS:,} pixels a frame; downscale the film first")


def frame_rotation(frame: Any) -> int:
    """The counter-clockwise quarter turns (in degrees: 0, 90, 180, 270) that make a decoded frame upright, from
    its display matrix."""
    return int(round(float(getattr(frame, "rotation", 0) or 0) / 90)) % 4 * 90


def upright_rgb(frame: Any, path: str | Path = "a video") -> np.ndarray:
    """A decoded PyAV frame as an upright (H, W, 3) uint8 RGB array (its rotation metadata applied)."""
    check_frame_size(path, frame.width, frame.height)  # a stream may change size after its header
    rgb = frame.to_ndarray(format="rgb24")
    turns = frame_rotation(frame) // 90
    return np.ascontiguousarray(np.rot90(rgb, turns)) if turns else rgb


def probe_video(path: str | Path) -> VideoInfo:
    """Frame rate, frame count, displayed size and rotation of a video (packets counted if the container lacks the
    frame count). Frame sizes past the limits are refused before any frame is decoded; then one frame is decoded
    for its rotation."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = video_stream(container, path)
            fps = float(stream.average_rate or stream.guessed_rate or 0)
            stored_height, stored_width = stream.height, stream.width
            count = stream.frames
            if not count:
                count = sum(1 for packet in container.demux(stream) if packet.size)  # one packet per frame
        rotation = 0
        with av.open(str(path)) as container:
            try:
                first = next(container.decode(video=0), None)
                rotation = frame_rotation(first) if first is not None else 0
            except av.error.FFmpegError:  # a damaged start: the decode pass counts its errors, the picture is kept
                pass
    except (av.error.FFmpegError, OSError) as exc:
        raise VideoReadError(f"{path}: cannot read video ({exc})") from exc
    turned = rotation in (90, 270)
    height, width = (stored_width, stored_height) if turned else (stored_height, stored_width)
    return VideoInfo(fps=fps, num_frames=int(count), height=height, width=width, rotation=rotation)


def read_video(
    path: str | Path,
    backend: str = "pyav",
    start: float = 0.0,
    end: float | None = None,
    fps: float | None = None,
) -> tuple[np.ndarray, float]:
    """Decode frames in [start, end) seconds, optionally resampled to ``fps``; returns (frames, fps)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r} is not one of {BACKENDS}")
    if not Path(path).is_file():
        raise VideoReadError(f"{path}: file not found")
    frames, times, native = _read_pyav(path, start, end) if backend == "pyav" else _read_decord(path, start, end)
    if len(frames) == 0:
        raise VideoReadError(f"{path}: no frames decoded in [{start}, {end})")
    stack = np.stack(frames)
    if fps is None or not native:
        return stack, native
    # Nearest-frame resampling onto a regular grid of the requested rate.
    t0 = times[0]
    count = max(1, int(np.floor((times[-1] - t0) * fps + 1e-6)) + 1)
    grid = t0 + np.arange(count) / fps
    idx = np.clip(np.searchsorted(times, grid - 0.5 / native), 0, len(times) - 1)
    return stack[idx], float(fps)


def _read_pyav(path, start, end):
    import av

    frames, times, held = [], [], 0
    try:
        with av.open(str(path)) as container:
            stream = video_stream(container, path)
            native = float(stream.average_rate or stream.guessed_rate or 0)
            for frame in container.decode(stream):
                t = float(frame.time) if frame.time is not None else len(times) / (native or 1)
                if t < start - 1e-6:
                    continue
                if end is not None and t >= end - 1e-6:
                    break
                held += frame.width * frame.height * 3
                if held > MAX_DECODED_BYTES:
                    raise VideoReadError(f"{path}: more than {MAX_DECODED_BYTES:,} bytes of frames in [{start}, "
                                         f"{end}); read a shorter span")
                frames.append(upright_rgb(frame, path))
                times.append(t)
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise VideoReadError(f"{path}: cannot decode video ({exc})") from exc
    return frames, np.asarray(times), native


def _read_decord(path, start, end):
    try:
        import decord
    except ImportError as exc:  # pragma: no cover - decord has no wheels for some platforms
        raise VideoReadError("decord is not installed; use backend='pyav'") from exc
    try:
        reader = decord.VideoReader(str(path))
        native = float(reader.get_avg_fps())
        times = np.arange(len(reader)) / native
        keep = np.nonzero((times >= start - 1e-6) & ((times < end - 1e-6) if end is not None else True))[0]
        frames = list(reader.get_batch(keep.tolist()).asnumpy()) if len(keep) else []
    except Exception as exc:  # decord raises its own DECORDError and RuntimeError
        raise VideoReadError(f"{path}: cannot decode video ({exc})") from exc
    return frames, times[keep], native


def write_mp4(path: str | Path, frames: np.ndarray, fps: float = 8) -> Path:
    """Write (T, H, W, 3) uint8 frames as H.264 mp4 (odd sizes are padded), atomically and checked:
    :class:`VideoWriteError` if the file could not be written whole."""
    with mp4_stream(path, fps) as append:
        append(frames)
    return Path(path)


@contextmanager
def mp4_stream(path: str | Path, fps: float = 8) -> Iterator[Callable[[np.ndarray], None]]:
    """An H.264 mp4 written a piece at a time: yields ``append((T, H, W, 3) uint8 frames)``; published atomically
    when the block ends and the file is checked (ffmpeg's exit status, then every frame decoded), removed if the
    block raises or the check fails (:class:`VideoWriteError`). A long video never has to be in memory at once."""
    path = Path(path)
    with atomic_path(path) as tmp:
        encoder = _Encoder(tmp, path, fps)
        try:
            yield encoder.append
            encoder.finish()
        except BaseException:
            encoder.kill()
            raise
        check_written_video(tmp, encoder.frames, path)


class _Encoder:
    """ffmpeg (imageio-ffmpeg's binary) encoding raw RGB frames from a pipe, started at the first frame (which
    fixes the size). Its exit status is checked: imageio's own writer ignores it, so a trailer that failed on a full
    disk passed as a finished file."""

    def __init__(self, tmp: Path, path: Path, fps: float):
        self.tmp, self.path, self.fps = tmp, path, Fraction(fps).limit_denominator()
        self.process: subprocess.Popen | None = None
        self.size: tuple[int, int] | None = None  # (H, W) after padding to even sides
        self.frames = 0
        self.messages: deque[str] = deque(maxlen=4)  # ffmpeg's last lines: the last goes into our one-line error
        self.reader: threading.Thread | None = None

    def _start(self, height: int, width: int) -> None:
        import imageio_ffmpeg

        command = [
            imageio_ffmpeg.get_ffmpeg_exe(), "-y", "-v", "error", "-f", "rawvideo", "-pix_fmt", "rgb24",
            "-s", f"{width}x{height}", "-r", str(self.fps), "-i", "-", "-an", "-vcodec", "libx264",
            "-pix_fmt", "yuv420p", "-f", "mp4", str(self.tmp),  # x264's default quality, as imageio's writer had
        ]
        # a session of its own: Ctrl-C reaches our process only, which stops ffmpeg itself (kill); signals as ours
        # (an ignored SIGXFSZ makes a write past `ulimit -f` fail like one on a full disk, with ffmpeg's message)
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE, start_new_session=True, restore_signals=False)
        except OSError as exc:  # no ffmpeg binary where IMAGEIO_FFMPEG_EXE points, say
            raise VideoWriteError(f"{self.path}: cannot start ffmpeg ({exc})") from None
        self.reader = threading.Thread(target=self._read_messages, args=(self.process.stderr,), daemon=True)
        self.reader.start()
        self.size = (height, width)

    def append(self, frames: np.ndarray) -> None:
        frames = _as_uint8(frames)
        _, h, w, _ = frames.shape
        if h % 2 or w % 2:  # yuv420p needs even sides
            frames = np.pad(frames, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        if self.process is None:
            self._start(*frames.shape[1:3])
        elif frames.shape[1:3] != self.size:
            raise ValueError(f"{self.path}: frames of {frames.shape[1:3]} after frames of {self.size}")
        try:
            self.process.stdin.write(np.ascontiguousarray(frames).tobytes())
        except OSError:  # ffmpeg ended early (it could not write): its exit status and message tell why
            self.finish()
            raise VideoWriteError(f"{self.path}: ffmpeg stopped while encoding") from None
        self.frames += len(frames)

    def finish(self) -> None:
        """Close the pipe and wait for ffmpeg; :class:`VideoWriteError` unless it wrote the file and exited 0."""
        if self.process is None:
            raise VideoWriteError(f"{self.path}: no frames to write")
        try:
            self.process.stdin.close()
        except OSError:
            pass
        code = self.process.wait()
        self.reader.join()
        if code != 0:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            last = f": {self.messages[-1]}" if self.messages else ""
            raise VideoWriteError(f"{self.path}: ffmpeg failed ({how}){last}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    def _read_messages(self, pipe) -> None:
        for raw in pipe:  # read all along: a full pipe would stop ffmpeg
            line = re.sub(r"^\[[^\]]*\]\s*", "", raw.decode("utf-8", "replace").strip())  # "[out#0/mp4 @ 0x..] "
            if line:
                self.messages.append(line[:300])
        pipe.close()


def check_written_video(tmp: str | Path, expected: int, path: str | Path) -> None:
    """:class:`VideoWriteError` naming ``path`` unless the written file ``tmp`` decodes to exactly ``expected``
    frames (a trailer cut short by a full disk leaves a file that does not open, or holds fewer frames)."""
    import av

    try:
        with av.open(str(tmp)) as container:
            count = sum(1 for _ in container.decode(video=0))
    except (av.error.FFmpegError, OSError, IndexError) as exc:
        raise VideoWriteError(f"{path}: the written video does not decode ({exc})") from None
    if count != expected:
        raise VideoWriteError(f"{path}: the written video holds {count} frames, not {expected}")


def write_gif(path: str | Path, frames: np.ndarray, fps: float = 8) -> Path:
    """Write frames as a looping gif, atomically and checked (:class:`VideoWriteError` if the file could not be
    written whole). Each frame gets its own 256-colour palette by Pillow's fast octree quantizer: on a 17-frame
    480x720 clip about 12x faster than the median cut Pillow picks by default, with no more error
    (docs/fast_turns.md)."""
    from PIL import Image

    frames = _as_uint8(frames)
    images = [Image.fromarray(f).quantize(256, method=Image.Quantize.FASTOCTREE) for f in frames]
    path = Path(path)
    with atomic_path(path) as tmp:
        try:
            images[0].save(
                str(tmp), format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0
            )
            with Image.open(tmp) as written:  # Pillow merges repeated frames, so only the last one is looked for
                written.seek(written.n_frames - 1)
                written.load()
        except (OSError, EOFError, ValueError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            raise VideoWriteError(f"{path}: cannot write the gif ({reason})") from None
    return path


def _as_uint8(frames) -> np.ndarray:
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise ValueError(f"expected frames of shape (T, H, W, 3), got {frames.shape}")
    if frames.dtype != np.uint8:
        frames = np.clip(np.round(frames * 255.0 if frames.max() <= 1.0 else frames), 0, 255).astype(np.uint8)
    return frames
