"""The real-time options of a turn's rendering, timed side by side: presets, cache hooks, FP8, first frames.

    results = bench_options(decoder, shot, levels, sampling, device, warmup, repeats)

Rows (our path: LoRA merged, eager, so every row runs the same kernels and only the option differs):

    standard              the configured sampler at the paper's 50 steps (dynamic CFG 6, guided steps batched)
    fast                  12 DPM-Solver++ steps, CFG on the first 40% (animegamer.game.build.fast_sampling)
    distilled             4 DDIM steps at the stage (d) student's timesteps (those of configs/stage_d.yaml's 50-step
                          teacher), one conditional call each; with random weights, so a speed figure only
    cache <method>        ``standard`` with one of diffusers' cache hooks (animegamer.sampling.cache); MagCache's
                          ratios are calibrated first, in the same run, on the same shot with the standard sampler
    fp8 [+ distilled]     the transformer's block linears in FP8 via torchao (CUDA GPUs of capability >= 8.9)

For each: seconds of denoising, transformer calls per clip (at batch B: a guided call counts 2) and the share of
the blocks' attention work that actually ran (a cache skips some), and the time to the first frames: denoising plus
the first chunk of the streamed VAE decode (:func:`animegamer.sampling.streaming.decode_chunks`; the MLLM's share of
a turn is the ``turn`` part's). Timed eagerly because the cache hooks wrap the blocks' forward, which the compiled
blocks of the ``turn`` part would fight.

Where a turn's time goes, besides the MLLM: the whole streamed VAE decode and writing the clip as the game does (mp4
+ gif) are the same work for every row, timed once (``profile``); each row's ``render_s`` = its denoising + decode +
writing, and the report adds the ``turn`` part's MLLM time when that part ran.
"""

from __future__ import annotations

import dataclasses
import tempfile

import torch

from animegamer.bench.timing import measure
from animegamer.config import SamplingConfig
from animegamer.game.turn import clip_stem, write_clip
from animegamer.models.fp8 import fp8_unavailable, quantize_transformer_fp8
from animegamer.sampling.cache import CACHE_METHODS, MagRatios, TransformerCache, calibrate_mag_ratios
from animegamer.sampling.fewstep import FewStepSampler
from animegamer.sampling.presets import PresetSampler, effective_sampling
from animegamer.sampling.schedule import build_scheduler
from animegamer.sampling.streaming import decode_chunks
from animegamer.training.distill import segment_boundaries, student_timesteps

PAPER_STEPS = 50
STUDENT_STEPS = 4


def distilled_timesteps(decoder, teacher_steps: int = PAPER_STEPS, student_steps: int = STUDENT_STEPS) -> tuple:
    """The timesteps a stage (d) student of configs/stage_d.yaml samples at (from its DDIM teacher's grid)."""
    scheduler = build_scheduler("ddim", decoder.scheduler_config)
    scheduler.set_timesteps(teacher_steps)
    grid = [int(t) for t in scheduler.timesteps]
    return tuple(student_timesteps(grid, segment_boundaries(teacher_steps, student_steps)))


class WorkCounter:
    """Counts transformer calls (in batch-B units) and the rows the blocks' attention projections ran."""

    def __init__(self, transformer: torch.nn.Module, batch: int):
        self.batch, self.calls, self.attention_rows = batch, 0.0, 0
        self._handles = [transformer.register_forward_pre_hook(self._call, with_kwargs=True)] + [
            block.attn1.to_q.register_forward_hook(self._attention) for block in transformer.transformer_blocks
        ]

    def _call(self, module, args, kwargs):
        self.calls += kwargs["hidden_states"].shape[0] / self.batch

    def _attention(self, module, args, output):
        self.attention_rows += args[0].shape[0]

    def reset(self) -> None:
        self.calls, self.attention_rows = 0.0, 0

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def _variants(sampling: SamplingConfig, device: torch.device, steps: int) -> list[tuple[str, SamplingConfig, bool]]:
    """(row name, sampling settings, fp8) of every row this device can run."""
    standard = dataclasses.replace(sampling, steps=steps, preset="standard", cache="none")
    rows = [
        ("standard", standard, False),
        ("fast", dataclasses.replace(standard, preset="fast"), False),
        ("distilled", dataclasses.replace(standard, preset="distilled", scheduler="ddim"), False),
    ]
    rows += [(f"cache {m}", dataclasses.replace(standard, cache=m), False) for m in CACHE_METHODS if m != "none"]
    if not fp8_unavailable(device):  # last: FP8 replaces the weights in place
        rows += [("fp8", standard, True), ("fp8 + distilled", rows[2][1], True)]
    return rows


def bench_options(decoder, shot: torch.Tensor, levels: torch.Tensor, sampling: SamplingConfig, device,
                  warmup: int, repeats: int, steps: int = PAPER_STEPS) -> dict:
    """Time every row (see module docstring) against a ``steps``-step standard sampler; returns the ``options``
    section of benchmark.json."""
    device = torch.device(device)
    decoder.eval()
    decoder.merge_lora()
    counter = WorkCounter(decoder.transformer, shot.shape[0])
    student = FewStepSampler(distilled_timesteps(decoder), teacher={"steps": PAPER_STEPS})
    rows, skipped = {}, []
    if fp8_unavailable(device):
        skipped.append(f"fp8: {fp8_unavailable(device)}")
    full_rows, fp8_layers = None, 0
    try:
        for name, s, fp8 in _variants(sampling, device, steps):
            if fp8 and not fp8_layers:
                fp8_layers = quantize_transformer_fp8(decoder)
            fewstep = student if s.preset == "distilled" else None
            cache = None
            if s.cache != "none":
                ratios = None
                if s.cache == "magcache":  # calibrated on this decoder and sampler first (not timed)
                    plain = PresetSampler(decoder, effective_sampling(s))
                    ratios = MagRatios(tuple(calibrate_mag_ratios(decoder.transformer, plain.sampling.steps, [
                        lambda plain=plain: plain.latents(shot, levels, torch.Generator().manual_seed(0))])[0]))
                cache = TransformerCache(decoder.transformer, s.cache, s.cache_threshold,
                                         guidance_distilled=fewstep is not None, mag_ratios=ratios)
            sampler = PresetSampler(decoder, effective_sampling(s), fewstep, cache)
            try:
                def denoise(sampler=sampler):
                    return sampler.latents(shot, levels, torch.Generator().manual_seed(0))

                counter.reset()
                latents = denoise()
                calls, attention = counter.calls, counter.attention_rows
                den = measure(denoise, device, warmup, repeats)
                first_frames = next(decode_chunks(decoder.vae, latents)).shape[1]
                first = measure(lambda latents=latents: next(decode_chunks(decoder.vae, latents)), device, warmup,
                                repeats)
            finally:
                sampler.close()
            if name == "standard":
                full_rows, standard_latents = attention, latents
            rows[name] = {
                "steps": fewstep.steps if fewstep is not None else sampler.sampling.steps,
                "description": sampler.description + (", fp8" if fp8 else ""),
                "transformer_calls": calls,
                "attention_work": attention / full_rows if full_rows else None,  # vs standard
                "denoise_s": den.median,
                "first_chunk_decode_s": first.median,
                "first_frames": int(first_frames),
                "time_to_first_frame_s": den.median + first.median,
                "raw_s": den.seconds,
            }
    finally:
        counter.remove()
    profile = decode_and_write(decoder, standard_latents, sampling.fps, device, warmup, repeats)
    base = rows["standard"]["denoise_s"]
    for row in rows.values():
        row["speedup_vs_standard"] = base / max(row["denoise_s"], 1e-12)
        row["render_s"] = row["denoise_s"] + profile["vae_decode_s"] + (profile["write_s"] or 0.0)
    return {"rows": rows, "skipped": skipped, "profile": profile,
            "settings": {"steps": steps, "student_steps": STUDENT_STEPS,
                                                            "student_timesteps": list(student.timesteps),
                                                            "eager": True, "merge_lora": True,
                                                            "fp8_layers": fp8_layers}}


def decode_and_write(decoder, latents: torch.Tensor, fps: int, device, warmup: int, repeats: int) -> dict:
    """The rest of a turn after denoising, the same for every option: the whole streamed VAE decode of ``latents``
    (B, F, C, h, w) and writing its first clip as the game writes a turn (mp4 + gif, in a temporary directory)."""
    decode = measure(lambda: list(decode_chunks(decoder.vae, latents)), device, warmup, repeats)
    frames = torch.cat(list(decode_chunks(decoder.vae, latents)), dim=1)[0].numpy()  # (T, H, W, 3) uint8
    written = time_writing(frames, fps, warmup, repeats)
    profile = {"vae_decode_s": decode.median, "write_s": written["write_s"], "frames": int(frames.shape[0]),
               "raw_vae_decode_s": decode.seconds, "raw_write_s": written.get("raw_write_s", [])}
    if "error" in written:
        profile["write_error"] = written["error"]
    return profile


def time_writing(frames, fps: float, warmup: int = 1, repeats: int = 3) -> dict:
    """Seconds to write one clip (T, H, W, 3) as the game does (gif then mp4, :func:`write_clip`, in a temporary
    directory) on this machine's CPU: ``write_s`` and ``raw_write_s``; where it cannot (e.g. no ffmpeg),
    ``write_s`` None and the ``error`` in one line, so the rows timed beside it still stand."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            took = measure(lambda: write_clip(frames, clip_stem(tmp, 0), fps=fps), "cpu", warmup, repeats)
        except (OSError, RuntimeError, ImportError) as exc:
            return {"write_s": None, "error": f"{type(exc).__name__}: {exc}".splitlines()[0]}
    return {"write_s": took.median, "raw_write_s": took.seconds}
