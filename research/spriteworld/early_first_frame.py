"""Can a turn's first frame come out before the few-step student's last step? How much latent frame 0 still changes.

    python inference_MLLM.py --config configs/spriteworld/inference.yaml output_dir=outputs/demo_fast
    python research/spriteworld/early_first_frame.py --config configs/spriteworld/inference.yaml \\
        --results outputs/demo_fast --student checkpoints/spriteworld/stage_d \\
        --small checkpoints/spriteworld/stage_e --out benchmarks/spriteworld/early_first_frame

The stage (d) student updates all latent frames jointly at every step (the transformer's attention is bidirectional
over frames), so latent frame 0 is final only after the last step. The only earlier candidate is the clean-latent
(x0) prediction of an earlier step. For every turn of a played game (``--results``: the MLLM's shots and motion
levels) and ``--seeds`` noises, the student's trajectory is run step by step and, after each step k, its x0
prediction of latent frame 0 is compared with the final latents' frame 0 (relative L2), and both are decoded by
the small causal decoder, whose first chunk is exactly frame 0 from latent frame 0 alone: PSNR of the early frame
to the final frame. Also timed (this CPU, median): one student call and the small decoder's first chunk, so the
time the first frame would gain (one call per step skipped) stands beside what it costs. Means with 95 % bootstrap
intervals over turns (each turn's seeds together). Writes ``--out``.json and ``--out``.md.
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from itertools import pairwise
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import InferenceConfig
from animegamer.config.recorded import with_decoder_checkpoint
from animegamer.eval.intervals import bootstrap_interval
from animegamer.eval.metrics import psnr
from animegamer.game.build import check_checkpoints, load_renderer
from animegamer.game.results import load_results
from animegamer.io import atomic_write_json, atomic_write_text
from animegamer.models.trained import load_small_decoder
from animegamer.sampling.fewstep import alpha_at, alpha_schedule, ddim_step, v_to_x0
from animegamer.sampling.schedule import initial_noise


def flags(parser) -> None:
    parser.add_argument("--results", required=True, help="an inference_MLLM.py output directory (the shots)")
    parser.add_argument("--student", required=True, help="the stage (d) checkpoint")
    parser.add_argument("--small", required=True, help="the stage (e) run, checkpoint or small_decoder/ directory")
    parser.add_argument("--seeds", type=int, default=4, help="noises per turn")
    parser.add_argument("--out", required=True, help="output stem: <out>.json and <out>.md")


@torch.no_grad()
def trajectory(decoder, sampler, shot: torch.Tensor, level: int, noise: torch.Tensor,
               call_seconds: list[float]) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(x0 prediction after each step, final latents) of the few-step sampler (as fewstep_sample runs it)."""
    alphas, final_alpha = alpha_schedule(decoder.scheduler_config)
    x, x0s = noise.float(), []
    shots, levels = shot[None].to(decoder.dtype), torch.tensor([level])
    times = list(sampler.timesteps) + [-1]
    for t, t_next in pairwise(times):
        alpha = alpha_at(alphas, final_alpha, t)
        began = time.perf_counter()
        v = decoder(x, torch.full((1,), t, dtype=torch.long), shots, levels)
        call_seconds.append(time.perf_counter() - began)
        x0s.append(v_to_x0(x, v, alpha))
        x = ddim_step(x, x0s[-1], alpha, alpha_at(alphas, final_alpha, t_next))
    return x0s, x


def first_frame(small, latents: torch.Tensor, seconds: list[float]) -> np.ndarray:
    """Frame 0 (1, H, W, 3) uint8 from latent frame 0 alone: the small decoder's first chunk."""
    began = time.perf_counter()
    frames = next(iter(small.decode_chunks(latents[:, :1])))  # (1, 1, H, W, 3)
    seconds.append(time.perf_counter() - began)
    return frames[0].numpy()


def main(argv: list[str] | None = None) -> dict:
    cfg, args = parse_config(InferenceConfig, __doc__, argv, extra=flags)
    if args.seeds < 1:
        fail(f"--seeds={args.seeds} must be >= 1")
    try:
        variant = dataclasses.replace(with_decoder_checkpoint(cfg, args.student),
                                      sampling=dataclasses.replace(cfg.sampling, preset="distilled"))
        check_checkpoints(variant, mllm=False)
        small = load_small_decoder(args.small)
        _, turns = load_results(args.results, (cfg.mllm.num_slots, cfg.mllm.shot_dim))
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if not turns:
        fail(f"{args.results}: no finished turn")
    renderer = load_renderer(variant, "cpu", offload=False)
    decoder, sampling, sampler = renderer.decoder, renderer.sampling, renderer.sampler.fewstep
    shape = (1, *decoder.latent_shape(sampling.num_frames, sampling.height, sampling.width))
    steps = sampler.steps
    latent_change = [[] for _ in range(steps)]  # per step: per turn, per seed
    frame_psnr = [[] for _ in range(steps)]
    call_s, chunk_s = [], []
    for index, (state, shot) in enumerate(tqdm(turns, desc="turns", unit="turn")):
        level = int(state["values"]["motion_level"])
        per_step_change = [[] for _ in range(steps)]
        per_step_psnr = [[] for _ in range(steps)]
        for seed in range(args.seeds):
            noise = initial_noise(shape, torch.Generator().manual_seed(1000 * index + seed))
            x0s, final = trajectory(decoder, sampler, shot, level, noise, call_s)
            final_frame = first_frame(small, final, chunk_s)
            for k, x0 in enumerate(x0s):
                change = (x0[:, 0] - final[:, 0]).norm() / final[:, 0].norm()
                per_step_change[k].append(float(change))
                early = first_frame(small, x0, chunk_s)
                per_step_psnr[k].append(min(float(psnr(early, final_frame)), 100.0))
        for k in range(steps):
            latent_change[k].append(per_step_change[k])
            frame_psnr[k].append(per_step_psnr[k])
    rows = []
    for k in range(steps):
        change, change_lo, change_hi = bootstrap_interval(latent_change[k])
        quality, quality_lo, quality_hi = bootstrap_interval(frame_psnr[k])
        rows.append({"after_step": k + 1, "timestep": sampler.timesteps[k], "calls_saved": steps - 1 - k,
                     "latent_frame0_rel_change": [change, change_lo, change_hi],
                     "first_frame_psnr_to_final": [quality, quality_lo, quality_hi]})
    command = " ".join(["python", "research/spriteworld/early_first_frame.py", *(argv or sys.argv[1:])])
    report = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": f"CPU, {torch.get_num_threads()} torch threads", "torch": torch.__version__,
              "turns": len(turns), "seeds": args.seeds, "student_timesteps": list(sampler.timesteps),
              "student_call_s": statistics.median(call_s), "small_first_chunk_s": statistics.median(chunk_s),
              "rows": rows}
    out = Path(args.out)
    atomic_write_json(out.with_suffix(".json"), report)
    atomic_write_text(out.with_suffix(".md"), markdown(report))
    print(markdown(report))
    return report


def markdown(report: dict) -> str:
    def cell(values: list) -> str:
        mean, lo, hi = values
        return f"{mean:.3f}" + (f" [{lo:.3f}, {hi:.3f}]" if lo is not None else "")

    lines = ["| first frame from the x0 prediction after step | student calls before it | calls it saves | "
             "latent frame 0: relative change to the end | frame 0: PSNR to the final frame 0 (dB) |",
             "| ---: | ---: | ---: | ---: | ---: |"]
    for row in report["rows"]:
        lines.append(f"| {row['after_step']} (t={row['timestep']}) | {row['after_step']} | {row['calls_saved']} | "
                     f"{cell(row['latent_frame0_rel_change'])} | {cell(row['first_frame_psnr_to_final'])} |")
    return (f"# The first frame before the last denoising step\n\n`{report['command']}`\n\n"
            f"{report['date']}, {report['device']}, torch {report['torch']}: {report['turns']} turns x "
            f"{report['seeds']} noises; means with 95 % bootstrap intervals over turns. PSNR is capped at 100 dB "
            "(the last step's x0 is the final latents).\n\n" + "\n".join(lines)
            + f"\n\nOne student call: {report['student_call_s'] * 1000:.1f} ms; the small decoder's first chunk: "
            f"{report['small_first_chunk_s'] * 1000:.1f} ms (medians, this CPU).\n")


if __name__ == "__main__":
    main()
