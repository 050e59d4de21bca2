"""How long writing one turn's clip takes, the work the game now does off the turn's critical path.

    python research/clip_write_time.py --sizes 9x64x96 17x480x720 --repeats 5 --out outputs/clip_write_time.json

For each size (frames x height x width) it times, on random uint8 frames (noise: the encoders' hardest input):
the gif, the mp4, the turn's clip as the game writes it (gif then mp4, atomic: ``write_clip``, now in the game's
writer thread), the browser's display-size copy written once from the frames in memory (``display_clip``, what the
page waits for now), and the browser's former path after the clip (read the mp4 back, enlarge it, write it:
``large_clip``). Median seconds over ``--repeats`` runs after one warm-up; prints a Markdown table and writes JSON.
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
from animegamer.inference.turn import write_clip
from animegamer.inference.web import display_clip, large_clip
from animegamer.io import atomic_write_json

KEYS = ("gif_s", "mp4_s", "clip_s", "display_copy_s", "read_back_enlarge_s")  # the table's columns, in order


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
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["9x64x96", "17x480x720"], help="clips as TxHxW")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per measurement (after one warm-up)")
    parser.add_argument("--out", type=Path, default=None, help="JSON report (default: print only)")
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
        frames = rng.integers(0, 256, (t, h, w, 3), dtype=np.uint8)
        with tempfile.TemporaryDirectory() as tmp:
            rows.append({"frames": t, "height": h, "width": w, **measure(frames, Path(tmp), args.repeats)})
    report = {"torch": torch.__version__, "machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "repeats": args.repeats, "rows": rows}
    print("| clip | gif (s) | mp4 (s) | gif + mp4, the game's clip (s) | browser copy from memory (s) | "
          "browser: read back, enlarge, write (s) |\n| --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        times = " | ".join(f"{r[key]:.3f}" for key in KEYS)
        print(f"| {r['frames']}x{r['height']}x{r['width']} | {times} |")
    if args.out is not None:
        atomic_write_json(args.out, report)
    return report


if __name__ == "__main__":
    main()
