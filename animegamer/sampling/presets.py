"""``sampling.preset`` and ``sampling.cache``: how a decoder renders a shot, in one object the inference path holds.

    sampler = PresetSampler.build(decoder, cfg.sampling, cfg.decoder_checkpoint)
    latents = sampler.latents(shot_embeds, motion_level, generator)     # (B, F, C, h, w)
    sampler.transformer_calls                                            # per clip, before any cache skips

Presets: ``standard`` (the sampling fields as given: the paper's 50 DPM-Solver++ steps with dynamic CFG), ``fast``
(12 steps, CFG on the first 40%: :func:`fast_sampling`) and ``distilled`` (the stage (d)
student's own K-step sampler from its checkpoint's ``sampler.json``, one conditional call per step). A cache method
(:mod:`animegamer.sampling.cache`) goes on top of any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from animegamer.config import SamplingConfig
from animegamer.io import checkpoint_decoder_dir
from animegamer.sampling.cache import MagRatios, TransformerCache
from animegamer.sampling.denoise import check_motion_levels, sample
from animegamer.sampling.fewstep import FewStepSampler, fewstep_sample
from animegamer.sampling.schedule import Generators, guidance_scales, initial_noise

FAST_STEPS = 12


def fast_sampling(sampling: SamplingConfig) -> SamplingConfig:
    """The fast preset: DPM-Solver++(2M) in 12 steps, classifier-free guidance on the first 40% of them only.

    Guidance matters most while the layout forms (high noise); the late steps refine detail and run the
    conditional branch alone, which halves their cost. 17 transformer calls instead of 99 at the paper's settings.
    The quality cost is measured by scripts/evaluate.py (SpriteWorld ablations, docs/spriteworld.md).
    """
    steps = min(sampling.steps, FAST_STEPS)
    return dataclasses.replace(sampling, scheduler="dpm", steps=steps, guidance_steps_fraction=0.4, preset="fast")


def effective_sampling(sampling: SamplingConfig) -> SamplingConfig:
    """``sampling`` with the ``fast`` preset's settings applied (the other presets leave the fields as they are)."""
    return fast_sampling(sampling) if sampling.preset == "fast" else sampling


def guided_calls(sampling: SamplingConfig) -> int:
    """Transformer calls (at batch B) of one clip of the multi-step samplers: 2 per guided step, 1 per other."""
    return sum(2 if scale > 1.0 else 1 for scale in guidance_scales(sampling))


@dataclass
class PresetSampler:
    """The decoder, the effective sampling settings, the distilled sampler (``distilled`` only) and the installed
    cache hooks (``cache`` != none). :meth:`close` takes the hooks off the transformer again."""

    decoder: torch.nn.Module
    sampling: SamplingConfig
    fewstep: FewStepSampler | None = None
    cache: TransformerCache | None = None

    @classmethod
    def build(cls, decoder, sampling: SamplingConfig, checkpoint: str | Path | None = None) -> PresetSampler:
        """Read the preset (``distilled`` reads ``sampler.json`` of ``checkpoint``) and install the cache hooks."""
        fewstep = None
        if sampling.preset == "distilled":
            if not checkpoint:
                raise ValueError("sampling.preset=distilled needs a stage (d) decoder_checkpoint")
            num_train = int(decoder.scheduler_config.get("num_train_timesteps", 1000))
            fewstep = FewStepSampler.load(checkpoint_decoder_dir(checkpoint), num_train)
        effective = effective_sampling(sampling)
        if fewstep is not None:  # the student's own steps on the DDIM ODE it was distilled on
            effective = dataclasses.replace(effective, steps=fewstep.steps, scheduler="ddim", guidance_scale=1.0)
        cache = None
        if sampling.cache != "none":
            # MagCache's ratios are per transformer call: one call per step (guided steps run both branches in one)
            ratios = None
            if sampling.cache == "magcache":
                if not sampling.magcache_ratios:
                    raise ValueError("sampling.cache=magcache needs sampling.magcache_ratios "
                                     "(scripts/calibrate_magcache.py)")
                ratios = MagRatios.load(sampling.magcache_ratios, effective.steps)
            cache = TransformerCache(decoder.transformer, sampling.cache, sampling.cache_threshold,
                                     guidance_distilled=fewstep is not None, mag_ratios=ratios)
        return cls(decoder, effective, fewstep, cache)

    @property
    def transformer_calls(self) -> int:
        """Calls per clip at batch B before a cache skips any work (a guided call counts 2: it runs batch 2B)."""
        return self.fewstep.steps if self.fewstep is not None else guided_calls(self.sampling)

    @property
    def description(self) -> str:
        if self.fewstep is not None:
            text = f"distilled: {self.fewstep.steps} steps at t={list(self.fewstep.timesteps)}, no CFG"
        else:
            text = f"{self.sampling.preset}: {self.sampling.steps} {self.sampling.scheduler} steps"
        return text + (f", cache {self.cache.method}" if self.cache is not None else "")

    def latents(self, shot_embeds: torch.Tensor, motion_level: torch.Tensor | None, generator: Generators,
                on_step: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """s_a (B, N, H), levels (B,) -> the final latents (B, F, C, h, w) of the preset's sampler;
        ``on_step(step, steps)`` after every denoising step."""
        decoder, s = self.decoder, self.sampling
        if self.fewstep is None:
            return sample(decoder, shot_embeds, motion_level, s, generator=generator, decode=False, on_step=on_step)
        check_motion_levels(motion_level, decoder.num_motion_levels)
        shape = (shot_embeds.shape[0], *decoder.latent_shape(s.num_frames, s.height, s.width))
        noise = initial_noise(shape, generator)  # as sample draws it
        return fewstep_sample(decoder, shot_embeds, motion_level, self.fewstep, noise, on_step)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.remove()
            self.cache = None
