"""The CogVideoX VAE: loading it from a diffusers folder, frames -> latents and back.

Shared by :class:`animegamer.models.decoder.AnimationShotDecoder` and feature precomputation (``vae_encode``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from animegamer.config import DecoderConfig

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def require_dir(root: Path, sub: str) -> Path:
    path = root / sub
    if not (path / ("scheduler_config.json" if sub == "scheduler" else "config.json")).is_file():
        raise FileNotFoundError(
            f"CogVideoX {sub} not found at {path}. Put the CogVideoX-2b diffusers folder (transformer/, vae/, "
            f"scheduler/) under {root} (see checkpoints/README.md) or set decoder.pretrained=DIR."
        )
    return path


def load_vae(cfg: DecoderConfig, device: str | torch.device | None = None):
    """The frozen CogVideoX VAE of ``cfg.pretrained`` (used by the decoder and by feature precomputation)."""
    from diffusers import AutoencoderKLCogVideoX

    path = require_dir(Path(cfg.pretrained), "vae")
    vae = AutoencoderKLCogVideoX.from_pretrained(str(path), torch_dtype=DTYPES[cfg.dtype])
    if cfg.vae_slicing:
        vae.enable_slicing()
    if cfg.vae_tiling:
        vae.enable_tiling()
    return vae.eval().requires_grad_(False).to(device or "cpu")


def vae_encode(vae, frames: torch.Tensor) -> torch.Tensor:
    """uint8 frames (B, T, H, W, 3) -> scaled latents (B, F, C, h, w) float32, the transformer's layout.

    The posterior mean is used (deterministic); CogVideoX-2B multiplies latents by ``scaling_factor``.
    """
    if frames.ndim != 5 or frames.shape[-1] != 3:
        raise ValueError(f"expected uint8 frames (B, T, H, W, 3), got {tuple(frames.shape)}")
    param = next(vae.parameters())
    x = frames.to(param.device).permute(0, 4, 1, 2, 3).float() / 127.5 - 1.0  # (B, 3, T, H, W) in [-1, 1]
    with torch.no_grad():
        latents = vae.encode(x.to(param.dtype)).latent_dist.mode()  # (B, C, F, h, w)
    latents = latents.float() * vae.config.scaling_factor
    return latents.permute(0, 2, 1, 3, 4).contiguous()  # (B, F, C, h, w)


def vae_decode(vae, latents: torch.Tensor) -> torch.Tensor:
    """Scaled latents (B, F, C, h, w) -> uint8 frames (B, T, H, W, 3) on the CPU."""
    param = next(vae.parameters())
    z = latents.permute(0, 2, 1, 3, 4) / vae.config.scaling_factor  # (B, C, F, h, w)
    with torch.no_grad():
        video = vae.decode(z.to(device=param.device, dtype=param.dtype)).sample  # (B, 3, T, H, W) in [-1, 1]
    video = ((video.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return video.permute(0, 2, 3, 4, 1).cpu()  # (B, T, H, W, 3)
