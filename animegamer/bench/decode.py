"""Latents -> frames, the full CogVideoX VAE against the stage (e) small causal decoder, and the time to the first
frames of a 4-step turn with each.

    result = bench_decode(decoder, shot, levels, sampling, device, warmup, repeats, compile=True, preset="full")

The latents are the 4-step distilled sampler's (the stage (d) student's timesteps, as the ``options`` part samples
them; random weights: a speed figure only). Rows:

    full VAE              the streamed CogVideoX decode (animegamer.sampling.streaming.decode_chunks): its first chunk
                          holds the frames of the first latent-frame batch (9 of 17 at 480x720)
    small                 the small decoder (CausalLatentDecoder, random weights at the preset's size), latent frame
                          by latent frame: its first chunk is the first latent frame's single frame
    small, compiled       the same with its memory blocks under torch.compile (regional; with ``compile``)

For each: the whole decode, the first chunk, and the time to the first frames = the 4-step denoising + the first
chunk (the MLLM's share is the ``turn`` part's).
"""

from __future__ import annotations

import dataclasses

import torch

from animegamer.bench.models import SMALL_SIZES, build_small_decoder
from animegamer.bench.options import distilled_timesteps
from animegamer.bench.timing import measure
from animegamer.config import SamplingConfig
from animegamer.sampling.fewstep import FewStepSampler
from animegamer.sampling.presets import PresetSampler, effective_sampling
from animegamer.sampling.streaming import decode_chunks


def bench_decode(decoder, shot: torch.Tensor, levels: torch.Tensor, sampling: SamplingConfig, device, warmup: int,
                 repeats: int, compile: bool, preset: str) -> dict:
    """Timings of the full and the small decoder on the same 4-step latents (see the module docstring)."""
    decoder.merge_lora()
    student = FewStepSampler(distilled_timesteps(decoder))
    sampler = PresetSampler(decoder, effective_sampling(dataclasses.replace(sampling, preset="distilled")), student)

    def denoise():
        return sampler.latents(shot, levels, torch.Generator().manual_seed(0))

    latents = denoise()  # (1, F, C, h, w)
    den = measure(denoise, device, warmup, repeats)
    small = build_small_decoder(decoder, preset)
    channels, blocks = SMALL_SIZES[preset]
    decoders = {"full VAE": lambda z: decode_chunks(decoder.vae, z), "small": small.decode_chunks}
    rows = {}
    for name in ["full VAE", "small"] + (["small, compiled"] if compile else []):
        if name == "small, compiled":
            small.compile_blocks(dynamic=False)
            decode = small.decode_chunks
        else:
            decode = decoders[name]
        whole = measure(lambda decode=decode: list(decode(latents)), device, warmup, repeats)
        first = measure(lambda decode=decode: next(iter(decode(latents))), device, warmup, repeats)
        rows[name] = {
            "decode_s": whole.median,
            "first_chunk_s": first.median,
            "first_frames": int(next(iter(decode(latents))).shape[1]),
            "frames": int(sum(chunk.shape[1] for chunk in decode(latents))),
            "time_to_first_frames_s": den.median + first.median,
            "render_s": den.median + whole.median,
            "raw_decode_s": whole.seconds,
        }
    full = rows["full VAE"]["decode_s"]
    for row in rows.values():
        row["decode_speedup"] = full / max(row["decode_s"], 1e-12)
    return {
        "rows": rows,
        "denoise_s": den.median,
        "parameters": {"vae_decoder": sum(p.numel() for p in decoder.vae.decoder.parameters()),
                       "small_decoder": sum(p.numel() for p in small.parameters())},
        "settings": {"student_timesteps": list(student.timesteps), "small_channels": list(channels),
                     "small_blocks_per_level": blocks, "latents": list(latents.shape), "random_weights": True},
    }
