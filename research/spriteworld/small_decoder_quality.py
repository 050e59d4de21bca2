"""What the small causal decoder (stage e) costs in quality against the full VAE, with 95 % intervals over games.

    python research/spriteworld/small_decoder_quality.py --config configs/spriteworld/eval.yaml \\
        --small checkpoints/spriteworld/stage_e --student checkpoints/spriteworld/stage_d \\
        --out benchmarks/spriteworld/small_decoder

On the evaluation's held-out games (``benchmark``, ``max_games``), three sets of latents are decoded twice, by the
full CogVideoX VAE and by the small decoder, so every comparison is on the very same latents:

    reconstruction   the real clip of each turn, encoded by the VAE (the decoders' own ceiling)
    full game        the game as the evaluation plays it: the MLLM's shots with its own history, the inference
                     config's sampler (decoder_checkpoint)
    4-step student   the same shots rendered by the stage (d) student (``--student``, sampling.preset=distilled)

Per turn: PSNR / SSIM / CLIP-I (paired frames, ``metrics_clip``) of each decode to the real clip (resampled to the
decode's frames and size as the evaluation does), of the small decode to the full decode, and the paired
difference small - full of each to-real metric. Every number is a turn-weighted mean with a 95 % bootstrap interval
over games (animegamer.eval.intervals: games resampled with their turns). The decode times per clip (median, this
CPU) are reported beside them. Writes ``--out``.json (every row) and ``--out``.md (the table and the command).
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.config.recorded import with_decoder_checkpoint
from animegamer.data.features import fit_frames
from animegamer.eval.games import GroundTruthGame, load_games
from animegamer.eval.harness import match_clip
from animegamer.eval.intervals import bootstrap_interval
from animegamer.eval.metrics import CLIPScorer, psnr, ssim
from animegamer.eval.systems import AnimeGamerSystem
from animegamer.game.build import check_checkpoints, load_renderer
from animegamer.io import atomic_write_json, atomic_write_text
from animegamer.models.trained import load_small_decoder
from animegamer.models.vae import vae_encode
from animegamer.sampling.streaming import decode_chunks

TO_REAL = ("psnr", "ssim", "clip_i")


def flags(parser) -> None:
    parser.add_argument("--small", required=True, help="the stage (e) run, checkpoint or small_decoder/ directory")
    parser.add_argument("--student", default="", help="the stage (d) checkpoint; empty: no 4-step student rows")
    parser.add_argument("--out", required=True, help="output stem: <out>.json and <out>.md")
    parser.add_argument("--batch", type=int, default=8, help="clips sampled and decoded at a time")


def timed(fn, *args):
    started = time.perf_counter()
    out = fn(*args)
    return out, time.perf_counter() - started


def score(full: np.ndarray, small: np.ndarray, truth: np.ndarray, scorer: CLIPScorer) -> dict[str, float]:
    """One turn's metrics: each decode (T, H, W, 3) uint8 against the real clip, and small against full."""
    real = match_clip(truth, full)
    values = {}
    for name, frames in (("full", full), ("small", small)):
        values[f"{name}_psnr"], values[f"{name}_ssim"] = psnr(frames, real), ssim(frames, real)
        values[f"{name}_clip_i"] = scorer.clip_i(frames, real, pairing="paired")
    values["small_vs_full_psnr"], values["small_vs_full_ssim"] = psnr(small, full), ssim(small, full)
    values["small_vs_full_clip_i"] = scorer.clip_i(small, full, pairing="paired")
    for metric in TO_REAL:
        values[f"small_minus_full_{metric}"] = values[f"small_{metric}"] - values[f"full_{metric}"]
    return values


def decode_both(vae, small, latents: torch.Tensor, times: dict[str, list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """(full, small) uint8 frames (B, T, H, W, 3) of the same latents; each decode's seconds per clip recorded."""
    full, seconds = timed(lambda: torch.cat(list(decode_chunks(vae, latents)), 1))
    times["full"].append(seconds / len(latents))
    mine, seconds = timed(lambda: torch.cat(list(small.decode_chunks(latents)), 1))
    times["small"].append(seconds / len(latents))
    return full.numpy(), mine.numpy()


def rows_of(kind: str, per_game: dict[str, list[list[float]]]) -> list[dict]:
    rows = []
    for metric, games in per_game.items():
        mean, lo, hi = bootstrap_interval(games)
        rows.append({"kind": kind, "metric": metric, "mean": mean, "lo": lo, "hi": hi,
                     "turns": sum(map(len, games)), "games": len(games)})
    return rows


def markdown(rows: list[dict], times: dict, command: str) -> str:
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    metrics = list(dict.fromkeys(r["metric"] for r in rows))
    cell = {(r["kind"], r["metric"]): r for r in rows}

    def fmt(r: dict | None) -> str:
        if r is None:
            return ""
        bounds = f" [{r['lo']:.3f}, {r['hi']:.3f}]" if r["lo"] is not None else ""
        return f"{r['mean']:.3f}{bounds}"

    lines = ["| metric | " + " | ".join(kinds) + " |", "| --- |" + " --- |" * len(kinds)]
    lines += [f"| {m} | " + " | ".join(fmt(cell.get((k, m))) for k in kinds) + " |" for m in metrics]
    timing = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in times.items())
    return (f"# Small causal decoder (stage e) against the full VAE\n\n`{command}`\n\n"
            "Turn-weighted means with 95 % bootstrap intervals over games (2000 resamples). `full_*` / `small_*`: "
            "each decode against the real clip; `small_vs_full_*`: the small decode against the full decode of the "
            "same latents; `small_minus_full_*`: the paired difference.\n\n"
            + "\n".join(lines) + f"\n\nDecode time per clip (median over batches): {timing}.\n")


def main(argv: list[str] | None = None) -> dict:
    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=flags)
    if args.batch < 1:
        fail(f"--batch={args.batch} must be >= 1")
    inference = cfg.inference
    variants = {"full game": inference}
    if args.student:
        try:
            variants["4-step student"] = dataclasses.replace(
                with_decoder_checkpoint(inference, args.student),
                sampling=dataclasses.replace(inference.sampling, preset="distilled"))
        except ValueError as exc:  # a damaged decoder_config.json, or a shape the config contradicts
            fail(str(exc))
    try:
        for variant in variants.values():
            check_checkpoints(variant)
        games = [g for g in load_games(cfg.benchmark, cfg.max_games) if isinstance(g, GroundTruthGame)]
        if not games or not all(g.has_clips() for g in games):
            raise ValueError(f"{cfg.benchmark}: needs games with their real clips")
        small = load_small_decoder(args.small)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    torch.manual_seed(cfg.seed)
    scorer = CLIPScorer.from_config(cfg.metrics_clip, scale=cfg.clip_scale, frames_per_clip=cfg.frames_per_clip)
    system = AnimeGamerSystem.from_config(inference, render=False)
    plans = [[clip for _, clip in system.plan_game(g)] for g in tqdm(games, desc="MLLM", unit="game")]
    del system

    rows, times = [], {"full": [], "small": []}
    for kind, variant in variants.items():
        renderer = load_renderer(variant, "cpu", offload=False)
        vae, sampling = renderer.decoder.vae, renderer.sampling
        small.check_vae(vae.config.latent_channels, 2 ** (len(vae.config.block_out_channels) - 1),
                        vae.config.temporal_compression_ratio, args.small)
        per_game: dict[str, list[list[float]]] = {}
        recon: dict[str, list[list[float]]] = {}
        for game, plan in tqdm(list(zip(games, plans, strict=True)), desc=kind, unit="game"):
            truths = [game.clip_frames(t) for t in range(len(plan))]
            values, recon_values = [], []
            for start in range(0, len(plan), args.batch):
                clips = plan[start : start + args.batch]
                generators = [torch.Generator().manual_seed(c.seed) for c in clips]
                with torch.no_grad():
                    latents = renderer.sampler.latents(
                        torch.stack([c.shot for c in clips]).to(renderer.decoder.dtype),
                        torch.tensor([c.motion_level for c in clips]), generators)  # (B, F, C, h, w)
                full, mine = decode_both(vae, small, latents, times)
                values += [score(full[i], mine[i], truths[start + i], scorer) for i in range(len(clips))]
                if kind == "full game":  # the real clips through the same VAE: the decoders' own ceiling
                    real = torch.stack([fit_frames(truths[start + i], sampling.num_frames, sampling.height,
                                                   sampling.width) for i in range(len(clips))])
                    full, mine = decode_both(vae, small, vae_encode(vae, real), times)
                    recon_values += [score(full[i], mine[i], real[i].numpy(), scorer) for i in range(len(clips))]
            for name in values[0]:
                per_game.setdefault(name, []).append([v[name] for v in values])
                if recon_values:
                    recon.setdefault(name, []).append([v[name] for v in recon_values])
        if recon:
            rows += rows_of("reconstruction", recon)
        rows += rows_of(kind, per_game)

    median_times = {k: statistics.median(v) for k, v in times.items()}
    command = " ".join(["python", "research/spriteworld/small_decoder_quality.py", *(argv or sys.argv[1:])])
    report = {"command": command, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "device": f"CPU, {torch.get_num_threads()} torch threads", "torch": torch.__version__,
              "games": len(games), "turns": sum(map(len, plans)), "seconds_per_clip": median_times, "rows": rows}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out.with_suffix(".json"), report)
    atomic_write_text(out.with_suffix(".md"), markdown(rows, median_times, command))
    print(markdown(rows, median_times, command))
    return report


if __name__ == "__main__":
    main()
