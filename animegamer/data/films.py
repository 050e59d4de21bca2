"""Films to fixed-length clips: black-border crop, resize, scene cuts, 2 s clips in timestamp order.

One film is processed in three reads of the file:

1. **Borders.** ``BORDER_SAMPLES`` frames spread over the film are decoded (by seeking). A row (column) is black
   border when its mean luma stays below ``black_threshold`` in *every* sample; the crop box is the span between
   the first and last non-black row and column. Taking the brightest sample per row keeps a dark scene from being
   mistaken for a letterbox.
2. **Scenes.** PySceneDetect's ``ContentDetector`` runs over the cropped picture (PyAV backend) and gives scenes
   as [start, end) seconds, times measured from the film's first frame as PySceneDetect does (PTS based).
3. **Clips.** Each scene is cut into back-to-back clips of ``clip_seconds`` from the scene start; the tail shorter
   than a clip is dropped. Every clip is checked on its own frames before it is written and starts again after
   any cut the detector merged (:mod:`animegamer.data.cuts`), so no clip crosses a cut. A clip holds
   ``clip_seconds * fps + 1`` frames on a regular grid at the target ``fps`` (nearest decoded frame), i.e. the
   closing frame at ``start + clip_seconds`` is included: 17 frames for 2 s at 8 fps, the 4k + 1 count the
   CogVideoX VAE wants. Frames are cropped to the border box, then centre-cropped to the target aspect ratio
   (the longer side is trimmed equally on both ends), then resized to ``height x width`` (area filter when
   shrinking, bilinear when enlarging); the picture is never stretched or padded.

:func:`process_film` runs all of it for one film in a worker process (plus the motion scope of every clip) and
returns a :class:`FilmResult`; an unreadable film comes back with ``error`` set instead of raising.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from animegamer.data.cuts import (
    Box,
    CutCheck,
    CutSettings,
    DecodeLog,
    checked_clips,
    decode_packets,
    detect_scenes,
    plan_clips,
)
from animegamer.data.manifest import ClipRecord
from animegamer.data.motion import scorer_for
from animegamer.data.video import VideoReadError, probe_video, upright_rgb, video_stream, write_mp4

FILM_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v")
BORDER_SAMPLES = 16  # frames sampled over the film for border detection
FILM_RECORD = "film.json"  # per-film result beside its clips; marks the film as finished
CLIPS_DIR = "clips"  # output_dir/clips/<film_id>/: every clip the pipeline writes


@dataclass
class FilmResult:
    film_id: str
    source: str
    records: list[ClipRecord] = field(default_factory=list)
    scenes: list[list[float]] = field(default_factory=list)  # [start, end) seconds of every detected scene
    crop: list[int] | None = None  # border box [x0, y0, x1, y1] in source pixels
    info: dict[str, Any] = field(default_factory=dict)  # fps, num_frames, height, width of the source
    error: str | None = None  # set when the film could not be processed (then records is empty)
    check: dict[str, Any] = field(default_factory=dict)  # CutCheck.to_json(): what the per-clip cut check changed
    decode_errors: int = 0  # packets the decoder rejected + frames it flagged corrupt
    seconds: float = 0.0  # wall time spent on the film


# --------------------------------------------------------------------------------------------
# Films on disk
# --------------------------------------------------------------------------------------------


def find_films(inputs: list[str]) -> tuple[list[Path], dict[str, str]]:
    """Film files named in ``inputs`` (files, or directories searched recursively), sorted, no duplicates, and
    the entries that look like films but cannot be read as files (a named pipe, a device, a symlink loop, a
    dangling link): their path -> why, so they are reported instead of passed over without a word.

    Raises FileNotFoundError for an input that does not exist at all.
    """
    found: dict[Path, None] = {}
    unusable: dict[str, str] = {}
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            for p in sorted(path.rglob("*")):
                if p.suffix.lower() not in FILM_EXTENSIONS or p.is_dir():
                    continue
                if p.is_file():
                    found[Path(os.path.realpath(p))] = None
                else:
                    unusable[str(p)] = not_a_regular_file(p)
        elif path.is_file():
            found[Path(os.path.realpath(path))] = None
        elif os.path.lexists(path):
            unusable[str(path)] = not_a_regular_file(path)
        else:
            raise FileNotFoundError(f"film or directory not found: {item}")
    return sorted(found), unusable


def not_a_regular_file(path: Path) -> str:
    """Why ``path`` (neither a regular file nor a directory) cannot be read as a film."""
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "not a film: a symlink loop"
        return f"not a film: a link to nothing ({exc.strerror})"
    if stat.S_ISFIFO(mode):
        return "not a film: a named pipe (FIFO), not a regular file"
    if stat.S_ISSOCK(mode):
        return "not a film: a socket, not a regular file"
    return "not a film: a device, not a regular file"


def check_folders(inputs: list[str], films: list[Path], output_dir: str | Path) -> None:
    """Refuse films and an ``output_dir`` that overlap so that a rerun would read the clips the previous run wrote
    (``output_dir/clips``) as new films: duplicate clips under new film ids, the same frames in train and test.

    Refused, symlinks followed: ``output_dir`` is a films folder or lies inside one; a films folder is
    ``output_dir/clips`` or lies inside it; a film (also one reached through a symlink) lies inside
    ``output_dir/clips``. A films folder elsewhere in ``output_dir`` (``output_dir/raw``) never sees the clips and
    is fine. Raises ValueError with a one-line message.
    """
    out = Path(os.path.realpath(output_dir))
    clips = out / CLIPS_DIR
    advice = "a rerun would cut the clips of the previous run as new films; keep output_dir outside the films folders"
    for item in inputs:
        path = Path(os.path.realpath(item))
        if path.is_dir() and out.is_relative_to(path):
            where = "is" if out == path else "lies inside"
            raise ValueError(f"output_dir {output_dir} {where} the films folder {item}: {advice}")
        if path.is_relative_to(clips):
            raise ValueError(f"films {item} lie inside {Path(output_dir) / CLIPS_DIR}, where the clips are written: "
                             f"{advice}")
    for film in films:
        if film.is_relative_to(clips):
            raise ValueError(f"the film {film} lies inside {Path(output_dir) / CLIPS_DIR} (a clip of an earlier "
                             f"run?): {advice}")


def film_id_for(path: str | Path) -> str:
    """A file-system and JSON friendly id from the file name: ``My Film (2001).mkv`` -> ``My_Film_2001``."""
    stem = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(path).stem).strip("_.")
    return stem or "film"


def assign_film_ids(paths: list[Path]) -> dict[str, Path]:
    """Film id -> path; films whose names collide get ``_2``, ``_3`` ... in sorted path order."""
    ids: dict[str, Path] = {}
    for path in paths:
        base = film_id_for(path)
        film_id, n = base, 1
        while film_id in ids:
            n += 1
            film_id = f"{base}_{n}"
        ids[film_id] = path
    return ids


# --------------------------------------------------------------------------------------------
# Borders and resizing
# --------------------------------------------------------------------------------------------


def sample_frames(path: str | Path, count: int = BORDER_SAMPLES) -> np.ndarray:
    """``count`` RGB frames spread evenly over the film, found by seeking: (N, H, W, 3) uint8.

    Each sample is the first frame decoded after seeking that lies within half a sample spacing before its target
    time, so in a long film it is simply the keyframe the seek lands on (no decoding forward). Packets the
    decoder rejects and the smeared frames after them are passed over (the clip pass counts them).
    """
    import av

    frames = []
    log = DecodeLog(path)
    try:
        with av.open(str(path)) as container:
            stream = video_stream(container, path)
            if stream.duration and stream.time_base:
                duration = float(stream.duration * stream.time_base)
            else:
                duration = float(container.duration or 0) / av.time_base
            start = float((stream.start_time or 0) * stream.time_base) if stream.time_base else 0.0
            slack = 0.5 * duration / count
            for i in range(count):
                target = start + duration * (i + 0.5) / count
                container.seek(int(target / stream.time_base), stream=stream, backward=True)
                for frame, smeared in decode_packets(container, stream, log):
                    if not smeared and (frame.time is None or frame.time >= target - slack):
                        frames.append(upright_rgb(frame, path))
                        break
    except (av.error.FFmpegError, IndexError, OSError, ValueError, ZeroDivisionError) as exc:
        raise VideoReadError(f"{path}: cannot read frames for border detection ({exc})") from exc
    if not frames:
        raise VideoReadError(f"{path}: no frames decoded for border detection")
    return np.stack(frames)


def detect_black_borders(frames: np.ndarray, threshold: int = 16) -> Box:
    """The box inside letterbox/pillarbox bars of (N, H, W, 3) uint8 frames of one film.

    A row/column is border when its mean luma is below ``threshold`` in every frame; only bars touching the
    frame edges are removed. An all-black sample set gives the full frame.
    """
    luma = frames[..., 0] * 0.299 + frames[..., 1] * 0.587 + frames[..., 2] * 0.114  # (N, H, W)
    rows = luma.mean(axis=2).max(axis=0)  # (H,) brightest sample per row
    cols = luma.mean(axis=1).max(axis=0)  # (W,)
    height, width = luma.shape[1:]
    content_rows = np.nonzero(rows >= threshold)[0]
    content_cols = np.nonzero(cols >= threshold)[0]
    if len(content_rows) == 0 or len(content_cols) == 0:
        return Box(0, 0, width, height)
    return Box(int(content_cols[0]), int(content_rows[0]), int(content_cols[-1]) + 1, int(content_rows[-1]) + 1)


def aspect_box(box: Box, height: int, width: int) -> Box:
    """The centred part of ``box`` with the target aspect ratio ``width / height`` (trimming the longer side)."""
    target = width / height
    if box.width / box.height > target:  # too wide: trim left and right
        w = max(1, int(round(box.height * target)))
        x0 = box.x0 + (box.width - w) // 2
        return Box(x0, box.y0, x0 + w, box.y1)
    h = max(1, int(round(box.width / target)))
    y0 = box.y0 + (box.height - h) // 2
    return Box(box.x0, y0, box.x1, y0 + h)


def fit_frame(frame: np.ndarray, box: Box, height: int, width: int) -> np.ndarray:
    """Crop ``frame`` to ``box`` (already of the target aspect) and resize it to (height, width)."""
    import cv2

    crop = box.crop(frame)
    if crop.shape[:2] == (height, width):
        return np.ascontiguousarray(crop)
    shrink = crop.shape[0] > height or crop.shape[1] > width
    return cv2.resize(crop, (width, height), interpolation=cv2.INTER_AREA if shrink else cv2.INTER_LINEAR)


# --------------------------------------------------------------------------------------------
# One film
# --------------------------------------------------------------------------------------------


def frames_hash(frames: np.ndarray) -> str:
    """A clip's content key: a hash of its (F, H, W, 3) uint8 frames as written."""
    return hashlib.blake2b(np.ascontiguousarray(frames).tobytes(), digest_size=16).hexdigest()


def clip_video_path(film_id: str, clip_index: int) -> str:
    """Clip file relative to the output directory (and the manifest)."""
    return f"{CLIPS_DIR}/{film_id}/{clip_index:05d}.mp4"


def cut_film(
    path: str | Path,
    film_id: str,
    output_dir: str | Path,
    settings: CutSettings,
    on_clip: Callable[[ClipRecord, np.ndarray], None] | None = None,
) -> FilmResult:
    """Cut one film into clips under ``output_dir/clips/<film_id>/``; returns the records in clip order.

    ``on_clip(record, frames)`` is called with every written clip's (F, H, W, 3) frames (e.g. to score motion)
    and may fill fields of the record. Raises :class:`VideoReadError` on an unreadable film, or one with more
    than ``settings.max_decode_errors`` decoder errors. Each record's ``extra["frames_hash"]`` is a hash of the
    clip's frames, so a caption can follow an unchanged clip through a re-cut.
    """
    output_dir = Path(output_dir)
    started = time.perf_counter()
    info = probe_video(path)
    if info.fps <= 0 or info.num_frames == 0:
        raise VideoReadError(f"{path}: no video frames or unknown frame rate")
    full = Box(0, 0, info.width, info.height)
    border = detect_black_borders(sample_frames(path), settings.black_threshold) if settings.crop_black_borders \
        else full
    scenes = detect_scenes(path, border if border != full else None, settings.scene_threshold, info.rotation)
    plans = plan_clips(scenes, settings, info.fps)
    target = aspect_box(border, settings.height, settings.width)

    clip_dir = output_dir / CLIPS_DIR / film_id
    if clip_dir.exists():  # clips of an interrupted or outdated run of this film
        shutil.rmtree(clip_dir)
    clip_dir.mkdir(parents=True)
    records = []
    log, check = DecodeLog(path, settings.max_decode_errors), CutCheck()
    fit = lambda frame: fit_frame(frame, target, settings.height, settings.width)  # noqa: E731
    for plan, frames in checked_clips(path, plans, settings, fit, log, check):  # frames: (F, h, w, 3)
        video = clip_video_path(film_id, plan.clip_index)
        write_mp4(output_dir / video, frames, fps=settings.fps)
        record = ClipRecord(
            clip_id=f"{film_id}_{plan.clip_index:05d}",
            video=video,
            film_id=film_id,
            clip_index=plan.clip_index,
            start=plan.start,
            end=plan.end,
            extra={"scene": plan.scene_index, "frames_hash": frames_hash(frames)},
        )
        if on_clip is not None:
            on_clip(record, frames)
        records.append(record)
    return FilmResult(
        film_id=film_id,
        source=printable(str(path)),
        records=records,
        scenes=[[round(s, 6), round(e, 6)] for s, e in scenes],
        crop=border.to_list(),
        info=asdict(info),
        seconds=time.perf_counter() - started,
        check=check.to_json(),
        decode_errors=log.errors,
    )


def init_worker(parent_pid: int | None = None) -> None:
    """One thread per library in a film worker process (the parallelism is across films); SIGINT is left to
    the main process, which stops the workers itself (a Ctrl-C must not make each worker print a traceback).

    With ``parent_pid`` (the main process) the worker dies with it on Linux, however it ends (``kill -9``
    included): the kernel sends it SIGKILL (``PR_SET_PDEATHSIG``), so no worker lives on as an orphan holding its
    film's memory. A parent already gone before that was set is noticed at once."""
    import signal

    import cv2

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if parent_pid is not None:
        die_with_parent(parent_pid)
    os.environ["OMP_NUM_THREADS"] = "1"  # read by torch (RAFT) when it is first imported in this process
    cv2.setNumThreads(1)


def die_with_parent(parent_pid: int) -> None:
    """Have the kernel SIGKILL this process when ``parent_pid`` (its parent) ends (Linux; elsewhere nothing)."""
    import ctypes
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before the call: the kernel will not tell us
        os._exit(1)


def printable(text: str) -> str:
    """``text`` with the undecodable bytes of a file name (``os.fsdecode``'s surrogates) written as ``\\xff``:
    safe to print and to store as UTF-8 JSON."""
    return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


@dataclass(frozen=True)
class FilmJob:
    """Everything a worker process needs for one film (picklable)."""

    path: str
    film_id: str
    output_dir: str
    cut: CutSettings
    motion: Any = None  # animegamer.data.motion.MotionSettings, or None to skip motion scoring


def process_film(job: FilmJob) -> FilmResult:
    """Worker entry: cut one film and score every clip's motion. Never raises for a bad film: the result
    carries ``error`` (naming the path) and the film's partial clips are removed."""

    started = time.perf_counter()
    try:
        on_clip = None
        if job.motion is not None:
            scorer = scorer_for(job.motion)

            def on_clip(record: ClipRecord, frames: np.ndarray) -> None:
                record.motion_scope = round(scorer.score(frames), 6)

        return cut_film(job.path, job.film_id, job.output_dir, job.cut, on_clip)
    except Exception as exc:  # a film the decoders choke on must not stop the others
        shutil.rmtree(Path(job.output_dir) / CLIPS_DIR / job.film_id, ignore_errors=True)
        message = str(exc) if job.path in str(exc) else f"{job.path}: {exc}"
        return FilmResult(
            film_id=job.film_id,
            source=printable(job.path),
            error=printable(f"{type(exc).__name__}: {message}"),
            seconds=time.perf_counter() - started,
        )
