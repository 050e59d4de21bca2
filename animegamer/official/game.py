"""The one place that picks a game's parts: the release's own predictor and renderer under ``compat: released``, the
core's otherwise. Every entry point builds its game through here; the core never imports this package.

    game = build_game(cfg)                                   # an AnimeGamer (animegamer.game.turn)
    predictor = load_predictor(cfg, device, offload)         # its StatePredictor
    renderer = load_renderer(cfg, device, offload)           # its ShotRenderer
    session = build_session(cfg)                             # a GameSession around build_game(cfg)

``compat: released`` (converted official weights, scripts/convert_official.py):

    predictor   the core's MLLM predictor with the release's turn (:func:`animegamer.official.agent.predict_released`):
                its shot pass, 200 free greedy tokens and their parsing; history = the previous ``history_turns``
                turns, i.e. the release's ``max_window`` - 1 (its window rule, B6)
    renderer    the core's renderer with the release's sampler (:class:`ReleasedSampler`,
                :func:`animegamer.official.sampler.sample_released`) and the whole transformer in the release's
                dtype (fp16: SAT's ``fp16: True``), LoRA and motion embedding included

A clip of F latent frames decodes to :func:`vae_frames` (F) frames: the release's frame count is its latent count
(``sampling_num_frames``), and CogVideoX's causal VAE makes 4F - 3 frames of an odd F and 4F of an even one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from animegamer.config import InferenceConfig, SamplingConfig
from animegamer.game.build import build_game as build_core_game
from animegamer.game.build import build_session as build_core_session
from animegamer.game.build import load_mllm_predictor
from animegamer.game.build import load_renderer as load_core_renderer
from animegamer.game.predictor import MLLMPredictor
from animegamer.game.renderer import DecoderRenderer
from animegamer.game.session import GameSession
from animegamer.game.turn import AnimeGamer
from animegamer.io import checkpoint_decoder_dir
from animegamer.models.decoder_parts import DECODER_CONFIG
from animegamer.models.vae import DTYPES
from animegamer.official.agent import predict_released, release_render_level
from animegamer.official.sampler import sample_released
from animegamer.sampling.denoise import check_motion_levels
from animegamer.sampling.presets import effective_sampling
from animegamer.sampling.schedule import Generators

COMPATS = ("fixed", "released")
RELEASE_SAMPLER = "release_sampler"  # decoder_config.json key of a converted decoder: its sampler's settings


def released(cfg: InferenceConfig) -> bool:
    """Whether ``cfg`` plays the release's own predictor and renderer (ValueError for an unknown ``compat``)."""
    if cfg.compat not in COMPATS:
        raise ValueError(f"compat={cfg.compat!r} is not one of {list(COMPATS)}")
    return cfg.compat == "released"


def core_config(cfg: InferenceConfig) -> InferenceConfig:
    """``cfg`` as the core's loaders take it (they build the converted models the same way in both modes)."""
    return dataclasses.replace(cfg, compat="fixed")


def load_predictor(cfg: InferenceConfig, device: str, offload: bool) -> MLLMPredictor:
    """The MLLM predictor of ``cfg`` (model loaded by the core's loader, merged LoRA and offload honoured)."""
    predictor = load_mllm_predictor(core_config(cfg), device, offload)
    if released(cfg):
        predictor.predict = predict_released
    return predictor


def check_released_options(cfg: InferenceConfig) -> None:
    """Rendering options the release's sampler cannot take, in one line (ValueError), before any model loads."""
    if cfg.sampling.preset == "distilled":
        raise ValueError("sampling.preset=distilled samples with the stage (d) student; compat=released samples with "
                         "the release's own sampler: use compat=fixed")
    if cfg.sampling.cache != "none":
        raise ValueError(f"sampling.cache={cfg.sampling.cache} skips calls of our sampler; compat=released samples "
                         "with the release's own sampler: use compat=fixed or sampling.cache=none")
    if cfg.fp8:
        raise ValueError("fp8 is our fast path; compat=released runs the release's fp16 transformer: use compat=fixed")


def release_sampler_settings(decoder_checkpoint: str | Path) -> dict[str, Any]:
    """The release sampler's settings a converted decoder records (ValueError naming the file if it has none)."""
    path = checkpoint_decoder_dir(decoder_checkpoint) / DECODER_CONFIG
    settings = json.loads(path.read_text(encoding="utf-8")).get(RELEASE_SAMPLER) if path.is_file() else None
    if not isinstance(settings, dict):
        raise ValueError(f"{path}: no {RELEASE_SAMPLER} settings: compat=released needs a decoder converted from the "
                         "release (scripts/convert_official.py)")
    return settings


def vae_frames(latent_frames: int, temporal_compression: int = 4) -> int:
    """Frames CogVideoX's causal VAE decodes from ``latent_frames``: the first latent frame of an odd count stays one
    frame, every other is upsampled by ``temporal_compression`` (SAT's VAE and diffusers' decode alike)."""
    if latent_frames < 1:
        raise ValueError(f"latent_frames={latent_frames} must be >= 1")
    if latent_frames == 1:
        return 1
    return temporal_compression * latent_frames - (temporal_compression - 1 if latent_frames % 2 else 0)


@dataclasses.dataclass
class ReleasedSampler:
    """The interface of :class:`animegamer.sampling.presets.PresetSampler` over the release's sampler: the
    latents of ``sampling.steps`` steps of :func:`sample_released` with ``settings`` (the converted decoder's)."""

    decoder: torch.nn.Module
    sampling: SamplingConfig
    settings: dict[str, Any]
    cache: None = None  # no cache hooks: check_released_options refuses them

    @property
    def transformer_calls(self) -> int:
        """Calls per clip, each on both CFG rows (batch 2B), counted 2 as PresetSampler counts a guided call."""
        return 2 * self.sampling.steps

    @property
    def description(self) -> str:
        return f"released: {self.sampling.steps} steps of the release's sampler (DPM-Solver++(2M) SDE, CFG on x0)"

    def latents(self, shot_embeds: torch.Tensor, motion_level: torch.Tensor | None, generator: Generators,
                on_step: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """s_a (B, N, H), levels (B,) -> latents x0 (B, F, C, h, w) float32. The release draws a batch's noise from
        one generator: a list of generators renders its clips one at a time, each as it renders alone."""
        decoder, s = self.decoder, self.sampling
        if motion_level is None:
            raise ValueError("the release's sampler needs the motion level (its flow value)")
        check_motion_levels(motion_level, decoder.num_motion_levels)
        if isinstance(generator, list):
            if len(generator) != shot_embeds.shape[0]:
                raise ValueError(f"{len(generator)} generators for {shot_embeds.shape[0]} clips")
            return torch.cat([self.latents(shot_embeds[i : i + 1], motion_level[i : i + 1], g, on_step)
                              for i, g in enumerate(generator)])
        return sample_released(
            decoder,
            shot_embeds,
            decoder.motion_inputs(motion_level.to(decoder.device)),
            decoder.latent_shape(s.num_frames, s.height, s.width),
            self.settings,
            s.steps,
            s.guidance_scale,
            s.dynamic_cfg_exponent,
            generator=generator,
            on_step=on_step,
        )

    def close(self) -> None:
        """Nothing installed on the decoder to take off."""


def cast_transformer(decoder, dtype: torch.dtype) -> None:
    """The release's whole-transformer dtype (SAT's ``fp16: True``): every floating parameter and buffer of the
    transformer, LoRA and motion embedding included, cast in place; the VAE keeps its own."""
    tensors = [*decoder.transformer.parameters(), *decoder.transformer.buffers()]
    for tensor in tensors:
        if tensor.is_floating_point():
            tensor.data = tensor.data.to(dtype)


def load_released_renderer(cfg: InferenceConfig, device: str, offload: bool) -> DecoderRenderer:
    """The core's renderer of the converted decoder with the release's sampler and dtype."""
    check_released_options(cfg)
    settings = release_sampler_settings(cfg.decoder_checkpoint) if cfg.decoder_checkpoint else None
    if settings is None:
        raise ValueError("compat=released needs the converted decoder_checkpoint (scripts/convert_official.py)")
    core = load_core_renderer(core_config(cfg), device, offload)
    core.sampler.close()
    decoder = core.decoder
    cast_transformer(decoder, DTYPES[settings.get("dtype", "fp32")])
    sampling = effective_sampling(cfg.sampling)
    return DecoderRenderer(decoder, sampling, device, offload, ReleasedSampler(decoder, sampling, settings))


def load_renderer(cfg: InferenceConfig, device: str, offload: bool) -> DecoderRenderer:
    """The renderer of ``cfg``: the release's (``compat: released``) or the core's."""
    return (load_released_renderer if released(cfg) else load_core_renderer)(cfg, device, offload)


def build_game(cfg: InferenceConfig, mllm: bool = True, render: bool = True) -> AnimeGamer:
    """:func:`animegamer.game.build.build_game` with the parts :func:`load_predictor` and
    :func:`load_renderer` pick: what every entry point plays."""
    if released(cfg) and render:
        check_released_options(cfg)
    return build_core_game(cfg, mllm, render, predictor_loader=load_predictor, renderer_loader=load_renderer)


def build_session(cfg: InferenceConfig, render: bool = True, output_dir: str | Path | None = None) -> GameSession:
    """:func:`animegamer.game.build.build_session` with the parts :func:`load_predictor` and
    :func:`load_renderer` pick."""
    if released(cfg) and render:
        check_released_options(cfg)
    return build_core_session(cfg, render, output_dir, predictor_loader=load_predictor, renderer_loader=load_renderer)


def render_levels(cfg: InferenceConfig, states: list[dict[str, Any]]) -> list[int]:
    """The motion level each written turn (``state.json`` records) renders at: its value, or under
    ``compat: released`` the level the release parsed through its own table (1..4 kept, anything else, a failed
    parse's 0 included, its last row). ValueError for a bad ``release_values``."""
    levels = [state["values"]["motion_level"] for state in states]
    if not released(cfg):
        return levels
    return [release_render_level(state["release_values"], cfg.decoder.num_motion_levels)
            if "release_values" in state else level for state, level in zip(states, levels, strict=True)]
