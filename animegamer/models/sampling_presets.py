"""``sampling.preset`` and ``sampling.cache``: how a decoder renders a shot, in one object the inference path holds.

    sampler = PresetSampler.build(decoder, cfg.sampling, cfg.decoder_checkpoint)
    latents = sampler.latents(shot_embeds, motion_level, generator)     # (B, F, C, h, w)
    sampler.transformer_calls                                            # per clip, before any cache skips

Presets: ``standard`` (the sampling fields as given: the paper's 50 DPM-Solver++ steps with dynamic CFG), ``fast``
(12 steps, CFG on the first 40%: :func:`animegamer.inference.session.fast_sampling`) and ``distilled`` (the stage (d)
student's own K-step sampler from its checkpoint's ``sampler.json``, one conditional call per step). A cache method
(:mod:`animegamer.models.cache`) goes on top of any of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from animegamer.config import SamplingConfig
from animegamer.models.cache import MagRatios, TransformerCache
from animegamer.models.fewstep import FewStepSampler, fewstep_sample
from animegamer.models.sampling import Generators, initial_noise


def effective_sampling(sampling: SamplingConfig) -> SamplingConfig:
    """``sampling`` with the ``fast`` preset's settings applied (the other presets leave the fields as they are)."""
    if sampling.preset == "fast":
        from animegamer.inference.session import fast_sampling

        return dataclasses.replace(fast_sampling(sampling), preset="fast")
    return sampling


def guided_calls(sampling: SamplingConfig) -> int:
    """Transformer calls (at batch B) of one clip of the multi-step samplers: 2 per guided step, 1 per other."""
    from animegamer.models.sampling import guidance_scales

    return sum(2 if scale > 1.0 else 1 for scale in guidance_scales(sampling))


def checkpoint_decoder_dir(checkpoint: str | Path) -> Path:
    """The directory holding a checkpoint's trained decoder parts (``decoder/`` of a step dir, or the dir itself)."""
    from animegamer.models.trained import DECODER_DIR
    from animegamer.training.checkpoint import resolve_checkpoint

    path = resolve_checkpoint(checkpoint)
    return path / DECODER_DIR if (path / DECODER_DIR).is_dir() else path


def check_render_options(cfg, device: str) -> None:
    """The rendering options of an inference config that cannot work, before any model loads: one-line
    FileNotFoundError / ValueError (``distilled`` without a stage (d) checkpoint,
    ``magcache`` without its ratios or with ratios for another step count, FP8 off a capable GPU or with
    offloading)."""
    from animegamer.models.fewstep import SAMPLER_FILE
    from animegamer.models.fp8 import fp8_unavailable

    if cfg.sampling.cache == "magcache":
        if not cfg.sampling.magcache_ratios:
            raise ValueError("sampling.cache=magcache needs sampling.magcache_ratios: calibrate them for this "
                             "decoder and sampler with scripts/calibrate_magcache.py")
        sampling = dataclasses.replace(cfg.sampling, preset="fast") if cfg.fast else cfg.sampling
        # the distilled student's step count is in its sampler.json: checked when the sampler is built
        MagRatios.load(cfg.sampling.magcache_ratios,
                       None if sampling.preset == "distilled" else effective_sampling(sampling).steps)

    if cfg.sampling.preset == "distilled":
        if cfg.fast:
            raise ValueError("fast=true and sampling.preset=distilled are two different samplers: pick one")
        if not cfg.decoder_checkpoint:
            raise ValueError("sampling.preset=distilled needs a stage (d) decoder_checkpoint")
        decoder_dir = checkpoint_decoder_dir(cfg.decoder_checkpoint)
        if not (decoder_dir / SAMPLER_FILE).is_file():
            raise FileNotFoundError(f"{decoder_dir / SAMPLER_FILE} is missing: sampling.preset=distilled needs a "
                                    "stage (d) decoder (scripts/train_stage_d.py)")
    if cfg.fp8:
        if cfg.offload == "sequential":
            raise ValueError("fp8 keeps the transformer's FP8 weights on the GPU: it does not combine with "
                             "offload=sequential")
        problem = fp8_unavailable(device)
        if problem:
            raise ValueError(problem)


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
            return decoder.sample(shot_embeds, motion_level, s, generator=generator, decode=False, on_step=on_step)
        if motion_level is not None and not ((motion_level >= 1) & (motion_level <= decoder.num_motion_levels)).all():
            raise ValueError(f"motion levels must be in 1..{decoder.num_motion_levels}, got {motion_level.tolist()}")
        shape = (shot_embeds.shape[0], *decoder.latent_shape(s.num_frames, s.height, s.width))
        noise = initial_noise(shape, generator)  # as decoder.sample draws it
        return fewstep_sample(decoder, shot_embeds, motion_level, self.fewstep, noise, on_step)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.remove()
            self.cache = None
