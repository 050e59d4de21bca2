"""The denoising loop's pieces: CogVideoX schedulers, the initial noise of a clip, one solver step, the guidance
schedule. Used by :func:`animegamer.sampling.denoise.sample`, the presets and the speed harness's
plain loop.
"""

from __future__ import annotations

import math

import torch

from animegamer.config import SamplingConfig


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
