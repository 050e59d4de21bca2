"""A tiny decoder with a LoRA moved off its zero start, for the tests of the inference speed options."""

from __future__ import annotations

from pathlib import Path

import torch

from animegamer.config import DecoderConfig
from animegamer.models.decoder import AnimationShotDecoder


def tiny_lora_decoder(tiny_cogvideox_dir: str | Path, dtype: str = "fp32") -> AnimationShotDecoder:
    """The tiny CogVideoX transformer (no VAE) in eval mode, its LoRA (rank 4) given small random values so that
    merging it changes the weights; seeded, so every call builds the same decoder."""
    torch.manual_seed(0)
    cfg = DecoderConfig(pretrained=str(tiny_cogvideox_dir), lora_rank=4, lora_alpha=4, motion_embed_dim=16,
                        gradient_checkpointing=False, dtype=dtype)
    decoder = AnimationShotDecoder.from_config(cfg, with_vae=False).eval()
    with torch.no_grad():
        for p in decoder.lora_parameters():
            p.add_(0.05 * torch.randn_like(p))
    return decoder
