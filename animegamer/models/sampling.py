"""The decoder's sampling-side helpers: VAE latents <-> frames, CogVideoX schedulers, the guidance schedule, clips.

Shared by :class:`animegamer.models.decoder.AnimationShotDecoder`, feature precomputation (``vae_encode``), the
benchmark's plain loop (``scheduler_step``, ``guidance_scales``) and the clip writers.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from animegamer.config import DecoderConfig, SamplingConfig

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


def build_scheduler(name: str, config: dict):
    """A CogVideoX scheduler (``dpm`` or ``ddim``) from the pretrained scheduler config (v-prediction, SNR shift)."""
    from diffusers import CogVideoXDDIMScheduler, CogVideoXDPMScheduler

    classes = {"dpm": CogVideoXDPMScheduler, "ddim": CogVideoXDDIMScheduler}
    if name not in classes:
        raise ValueError(f"scheduler={name!r} is not one of {sorted(classes)}")
    return classes[name].from_config(config)


Generators = torch.Generator | list[torch.Generator]  # one for the batch, or one per clip of the batch


def initial_noise(shape: tuple[int, ...], generator: Generators) -> torch.Tensor:
    """Gaussian latents of ``shape`` (B, ...) on the generator's device.

    A list of B generators draws each clip's latents from its own generator, as B renders of one clip would; the
    CogVideoX DPM scheduler draws its per-step noise the same way from such a list (diffusers' ``randn_tensor``).
    So a batch of clips with a generator each renders every clip as it renders alone, up to float rounding.
    """
    if isinstance(generator, list):
        if len(generator) != shape[0]:
            raise ValueError(f"{len(generator)} generators for a batch of {shape[0]} clips")
        return torch.cat([torch.randn((1, *shape[1:]), generator=g, device=g.device) for g in generator])
    return torch.randn(shape, generator=generator, device=generator.device)


def scheduler_step(scheduler, out, i: int, latents, old_x0, generator: Generators):
    """One denoising step ``i`` of ``scheduler.timesteps`` -> (latents (float32), old_x0).

    DPM-Solver++ (second order) also takes the previous timestep and keeps the previous x0 prediction; DDIM needs
    neither (``old_x0`` stays None).
    """
    from diffusers import CogVideoXDPMScheduler

    timesteps, t = scheduler.timesteps, scheduler.timesteps[i]
    if isinstance(scheduler, CogVideoXDPMScheduler):
        back = timesteps[i - 1] if i > 0 else None
        latents, old_x0 = scheduler.step(out, old_x0, t, back, latents, generator=generator, return_dict=False)
    else:
        latents = scheduler.step(out, t, latents, generator=generator, return_dict=False)[0]
    return latents.float(), old_x0


def guidance_scales(sampling: SamplingConfig) -> list[float]:
    """The classifier-free guidance scale of every denoising step (1.0 = no guidance on that step).

    Dynamic CFG is a cosine ramp over the steps, from ``1 + g`` at the first step down towards 1 at the last:
    ``1 + g * (1 - cos(pi * ((n - i) / n) ** exponent)) / 2``. It is computed from the step index; diffusers'
    CogVideoX pipelines plug in the timestep value instead (diffusers issue #9641), which makes the scale oscillate.
    Only the first ``guidance_steps_fraction`` of the steps are guided; the rest run the conditional branch alone.
    """
    n = sampling.steps
    guided = math.ceil(sampling.guidance_steps_fraction * n)
    scales = []
    for i in range(n):
        if i >= guided or sampling.guidance_scale <= 1.0:
            scales.append(1.0)
        elif sampling.dynamic_cfg:
            ramp = (1 - math.cos(math.pi * ((n - i) / n) ** sampling.dynamic_cfg_exponent)) / 2
            scales.append(1.0 + sampling.guidance_scale * ramp)
        else:
            scales.append(sampling.guidance_scale)
    return scales


def write_clip(frames, path_stem: str | Path, fps: float = 8) -> tuple[Path, Path]:
    """Write (T, H, W, 3) uint8 frames as ``<stem>.mp4`` and ``<stem>.gif``; returns both paths."""
    from animegamer.data.video import write_gif, write_mp4

    frames = frames.numpy() if isinstance(frames, torch.Tensor) else np.asarray(frames)
    stem = Path(path_stem)
    stem.parent.mkdir(parents=True, exist_ok=True)
    return write_mp4(stem.with_suffix(".mp4"), frames, fps=fps), write_gif(stem.with_suffix(".gif"), frames, fps=fps)
