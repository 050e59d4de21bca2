"""The decoder's denoising loop: CogVideoX's scheduler over the decoder's transformer, conditioned on s_a and the
motion level, with classifier-free guidance while a step's scale is above 1. The few-step student's loop is in
sampling/fewstep.py, the release's in official/sampler.py; both draw their noise as :func:`start_sampling` does.

    frames = sample(decoder, shot_embeds, motion_level, sampling)      # (B, T, H, W, 3) uint8
    latents = sample(decoder, shot_embeds, motion_level, sampling, decode=False)

``decoder``: an :class:`animegamer.models.decoder.AnimationShotDecoder` (only its transformer call, its shapes and
its VAE decode are used, so this layer does not import the models).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from animegamer.config import SamplingConfig
from animegamer.sampling.schedule import Generators, build_scheduler, guidance_scales, initial_noise, scheduler_step


def check_motion_levels(motion_level: torch.Tensor | None, num_levels: int) -> None:
    """ValueError unless every level is in 1..``num_levels`` (None: no level, nothing to check)."""
    if motion_level is not None and not ((motion_level >= 1) & (motion_level <= num_levels)).all():
        raise ValueError(f"motion levels must be in 1..{num_levels}, got {motion_level.tolist()}")


def start_sampling(decoder: Any, batch: int, sampling: SamplingConfig, generator: Generators):
    """The scheduler set to ``sampling.steps``, the guidance scale of every step and the initial latents.

    Latents are drawn on the generator's device (CPU by default) so a seed gives the same clip on any device.
    """
    scheduler = build_scheduler(sampling.scheduler, decoder.scheduler_config)
    scheduler.set_timesteps(sampling.steps, device=decoder.device)
    shape = (batch, *decoder.latent_shape(sampling.num_frames, sampling.height, sampling.width))
    latents = initial_noise(shape, generator).to(decoder.device)
    return scheduler, guidance_scales(sampling), latents * scheduler.init_noise_sigma  # (B, F, C, h, w)


@torch.no_grad()
def sample(
    decoder: Any,
    shot_embeds: torch.Tensor,
    motion_level: torch.Tensor | None,
    sampling: SamplingConfig,
    generator: Generators | None = None,
    progress: bool = False,
    decode: bool = True,
    on_step: Callable[[int, int], None] | None = None,
) -> torch.Tensor:
    """Render clips: s_a (B, N, H) and levels (B,) -> uint8 frames (B, T, H, W, 3).

    ``on_step(step, steps)`` is called after every denoising step (the games' progress line).

    ``decode=False`` returns the final latents (B, F, C, h, w) instead and leaves the VAE decode to the caller
    (the benchmark times the two apart).

    The denoising loop, written out: start from Gaussian latents; at each step run the conditional and the
    unconditional (null s_a) branch in one batch while guidance is on, combine them with that step's scale,
    and let the scheduler step (DPM-Solver++ keeps the previous x0 prediction for its second order). The
    unconditional branch keeps the levels, or gets the null level with ``motion_guidance``.
    """
    from tqdm.auto import tqdm

    batch = shot_embeds.shape[0]
    device = decoder.device
    check_motion_levels(motion_level, decoder.num_motion_levels)
    if generator is None:
        generator = torch.Generator().manual_seed(sampling.seed)
    scheduler, scales, latents = start_sampling(decoder, batch, sampling, generator)
    timesteps = scheduler.timesteps
    cond = shot_embeds.to(device)
    null = decoder.null_shot_embeds(batch, device, cond.dtype)
    levels = motion_level.to(device) if motion_level is not None else None
    null_levels = decoder.unconditional_levels(levels)
    old_x0 = None
    for i, t in enumerate(tqdm(timesteps, desc="denoise", disable=not progress, leave=False)):
        guided = scales[i] > 1.0
        model_in = torch.cat([latents, latents]) if guided else latents  # (2B | B, F, C, h, w)
        model_in = scheduler.scale_model_input(model_in, t)
        out = decoder(
            model_in,
            t.expand(model_in.shape[0]),
            torch.cat([null, cond]) if guided else cond,
            torch.cat([null_levels, levels]) if guided and levels is not None else levels,
        )
        if guided:
            uncond, conditional = out.chunk(2)
            out = uncond + scales[i] * (conditional - uncond)
        latents, old_x0 = scheduler_step(scheduler, out, i, latents, old_x0, generator)
        if on_step is not None:
            on_step(i + 1, len(timesteps))
    return decoder.decode_latents(latents) if decode else latents
