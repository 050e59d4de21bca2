"""``sampling.cache``: diffusers' own caching hooks on the decoder's CogVideoX transformer.

    cache = TransformerCache(decoder.transformer, "first_block")   # any sampler, unchanged, now skips work
    frames = sample(decoder, ...)
    cache.remove()

Denoising steps close in time compute nearly the same thing; each method reuses earlier results instead of
recomputing them, at a quality cost the eval harness measures:

    first_block   FirstBlockCache (ParaAttention): run block 0; if its residual changed by less than
                  ``threshold`` (relative mean) since the last full pass, reuse the other blocks' cached residual
    taylorseer    TaylorSeer: compute the blocks every ``cache_interval`` steps and extrapolate in between with a
                  first-order Taylor series of their outputs
    pab           Pyramid Attention Broadcast: reuse each block's self-attention output for 2 steps in the middle
                  of the trajectory (t in 100..800), the CogVideoX setting of diffusers' docs
    faster        FasterCache: reuse attention outputs (weighted) every other step for t < 681, and the guided
                  batch's unconditional half every 5th step for t < 781 (diffusers' CogVideoX example)
    magcache      MagCache: the blocks' residual shrinks or grows by a ratio per step that depends on the model and
                  the sampler and (the MagCache paper's finding) little on the prompt; skip the blocks (reuse the
                  last residual) while the error the recorded ratios accumulate stays under ``threshold``, at most 3
                  steps in a row, never in the first 20% of steps. The ratios, one per transformer call of a clip,
                  come from a calibration run of the same decoder and sampler (scripts/calibrate_magcache.py ->
                  ``sampling.magcache_ratios``, :class:`MagRatios`), recorded by :func:`calibrate_mag_ratios`.

The hooks are stateful and want to know which call of the loop they see (``transformer.cache_context``). Rather
than writing that into every sampling loop, :class:`TransformerCache` opens the context from the call itself: the
current timestep feeds the methods that depend on it, a timestep that does not decrease starts a new trajectory
and a change of batch size (guidance switching off: 2B -> B) starts the caches afresh (FasterCache keeps the
conditional half itself; MagCache keeps counting its steps and the residual's conditional half), and FasterCache's
unconditional-branch skipping sees only the guided calls (its hook splits every input into [uncond, cond]). So
``sampling.denoise.sample``, the fast preset and the distilled sampler all compose with any method.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from animegamer.io import atomic_write_json, read_format_json

CACHE_METHODS = ("none", "first_block", "taylorseer", "pab", "faster", "magcache")
MAGCACHE_FORMAT = "animegamer-magcache-v1"


@dataclass(frozen=True)
class MagRatios:
    """MagCache's calibrated magnitude ratios: ``ratios[i]`` = mean over tokens of |residual_i| / |residual_{i-1}|
    of the blocks' residual at transformer call i of a clip (1.0 at the first), for one decoder and sampler."""

    ratios: tuple[float, ...]
    sampler: str = ""  # the sampler they were measured with (PresetSampler.description)
    source: dict = field(default_factory=dict)  # decoder, prompts, per-prompt ratios: how they were made

    @property
    def calls(self) -> int:
        return len(self.ratios)

    def save(self, path: str | Path) -> Path:
        atomic_write_json(Path(path), {"format": MAGCACHE_FORMAT, "calls": self.calls, "ratios": list(self.ratios),
                                       "sampler": self.sampler, "source": self.source})
        return Path(path)

    @classmethod
    def load(cls, path: str | Path, calls: int | None = None) -> MagRatios:
        """Read and validate a ratios file (untrusted): FileNotFoundError / ValueError in one line. ``calls``: the
        transformer calls per clip of the sampler they are for (ratios for another step count are refused)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"sampling.magcache_ratios={path}: not found (make it with "
                                    "scripts/calibrate_magcache.py)")
        raw = read_format_json(path, MAGCACHE_FORMAT, "a MagCache ratios file")
        ratios = raw.get("ratios")
        if not (isinstance(ratios, list) and ratios and all(
                isinstance(r, int | float) and not isinstance(r, bool) and math.isfinite(r) and r > 0
                for r in ratios)):
            raise ValueError(f"{path}: 'ratios' must be a non-empty list of positive finite numbers")
        if calls is not None and len(ratios) != calls:
            raise ValueError(f"{path}: ratios for {len(ratios)} transformer calls per clip, but this sampler makes "
                             f"{calls}: calibrate with the same sampling settings (scripts/calibrate_magcache.py)")
        source = raw.get("source", {})
        return cls(tuple(float(r) for r in ratios), str(raw.get("sampler", "")),
                   source if isinstance(source, dict) else {})


def cache_config(method: str, current_timestep, threshold: float = 0.05, guidance_distilled: bool = False,
                 mag_ratios: MagRatios | None = None, calibrate_calls: int = 0):
    """The diffusers config of ``method``; ``current_timestep()`` returns the timestep of the running call.
    ``magcache`` needs ``mag_ratios``, or ``calibrate_calls`` (the calls per clip) to record them."""
    from diffusers.hooks import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        MagCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )
    from diffusers.hooks.faster_cache import _UNCOND_COND_INPUT_KWARGS_IDENTIFIERS

    if method == "magcache":
        if calibrate_calls:
            # one step more than the clip has: the hook's end-of-loop reset (which empties the recorded ratios)
            # never comes inside a clip; TransformerCache starts every clip afresh itself
            return MagCacheConfig(calibrate=True, num_inference_steps=calibrate_calls + 1)
        if mag_ratios is None:
            raise ValueError("sampling.cache=magcache needs sampling.magcache_ratios (scripts/calibrate_magcache.py)")
        return MagCacheConfig(threshold=threshold, mag_ratios=torch.tensor(mag_ratios.ratios),
                              num_inference_steps=mag_ratios.calls)
    if method == "first_block":
        return FirstBlockCacheConfig(threshold=threshold)
    if method == "taylorseer":
        # whole blocks: diffusers' default patterns ("^transformer_blocks.*attn", full match) miss CogVideoX's attn1
        return TaylorSeerCacheConfig(
            cache_interval=5, disable_cache_before_step=3, max_order=1, taylor_factors_dtype=torch.float32,
            cache_identifiers=[r"transformer_blocks\.\d+"],
        )
    if method == "pab":
        return PyramidAttentionBroadcastConfig(
            spatial_attention_block_skip_range=2,
            spatial_attention_timestep_skip_range=(100, 800),
            current_timestep_callback=current_timestep,
        )
    if method == "faster":
        return FasterCacheConfig(
            spatial_attention_block_skip_range=2,
            spatial_attention_timestep_skip_range=(-1, 681),
            current_timestep_callback=current_timestep,
            attention_weight_callback=lambda _: 0.3,
            unconditional_batch_skip_range=5,
            unconditional_batch_timestep_skip_range=(-1, 781),
            tensor_format="BFCHW",  # (B, F, C, h, w), the transformer's latent layout
            is_guidance_distilled=guidance_distilled,
            # the motion level rides in ``ofs`` and is batched [uncond, cond] like the other inputs
            _unconditional_conditional_input_kwargs_identifiers=[*_UNCOND_COND_INPUT_KWARGS_IDENTIFIERS, "ofs"],
        )
    raise ValueError(f"sampling.cache={method!r} is not one of {list(CACHE_METHODS)}")


class TransformerCache:
    """One caching method installed on a CogVideoX transformer, the cache context opened per call (see module
    docstring). :meth:`remove` takes every hook off again.

    ``calibrate_calls`` (magcache only): skip nothing and record the magnitude ratios of each clip of that many
    transformer calls in :attr:`calibration` (one per call so far, 1.0 first)."""

    def __init__(self, transformer: torch.nn.Module, method: str, threshold: float = 0.05,
                 guidance_distilled: bool = False, mag_ratios: MagRatios | None = None, calibrate_calls: int = 0):
        self.transformer, self.method, self.guidance_distilled = transformer, method, guidance_distilled
        self._first_batch = self._batch = 0
        self.timestep: float | None = None  # of the running call; None between trajectories
        self._last: float | None = None
        self._context = None
        self.calibrating = bool(calibrate_calls)
        self.calibration: list[float] = []
        transformer.enable_cache(cache_config(method, self._current_timestep, threshold, guidance_distilled,
                                              mag_ratios, calibrate_calls))
        self._handles = [
            transformer.register_forward_pre_hook(self._enter, with_kwargs=True),
            transformer.register_forward_hook(self._leave),
        ]

    def _current_timestep(self) -> float:
        return self.timestep

    def _mag_state(self):
        """MagCache's shared state (its head hook on block 0 holds the manager); needs the call's context open."""
        from diffusers.hooks import HookRegistry
        from diffusers.hooks.mag_cache import _MAG_CACHE_LEADER_BLOCK_HOOK

        head = HookRegistry.check_if_exists_or_initialize(self.transformer.transformer_blocks[0])
        return head.get_hook(_MAG_CACHE_LEADER_BLOCK_HOOK).state_manager.get_state()

    def _enter(self, module, args, kwargs):
        from diffusers.hooks import HookRegistry

        t = float(kwargs["timestep"].flatten()[0])
        batch = kwargs["hidden_states"].shape[0]
        registry = HookRegistry.check_if_exists_or_initialize(module)
        if self._last is None or t >= self._last:  # back at the noisy end: a new clip
            registry.reset_stateful_hooks()
            self._first_batch = batch  # guidance, when a sampler uses it, is on from the first step
        elif batch != self._batch and self.method not in ("faster", "magcache"):
            # guidance switched off: results cached at batch 2B do not fit batch B (FasterCache's block hooks keep
            # the conditional half by themselves, and a reset mid-trajectory breaks them)
            registry.reset_stateful_hooks()
        batch_changed = self._last is not None and t < self._last and batch != self._batch
        self._last, self._batch, self.timestep = t, batch, t
        if self.method == "faster":
            # FasterCache's denoiser hook splits every input in [uncond, cond] halves: only on guided calls
            from diffusers.hooks.faster_cache import _FASTER_CACHE_DENOISER_HOOK

            guided = batch == self._first_batch and not self.guidance_distilled
            registry.get_hook(_FASTER_CACHE_DENOISER_HOOK).is_guidance_distilled = not guided
        self._context = module.cache_context("denoiser", timestep=t)
        self._context.__enter__()
        if self.method == "magcache" and batch_changed:
            # MagCache counts steps, so it must not restart mid-clip: keep the residual's conditional half, the
            # second of the guided batch [uncond, cond] (the batch the conditional calls now run at)
            state = self._mag_state()
            if state.previous_residual is not None:
                state.previous_residual = state.previous_residual[-batch:]

    def _leave(self, module, args, output):
        if self.calibrating:
            self.calibration = list(self._mag_state().calibration_ratios)
        self._context.__exit__(None, None, None)
        self._context = None

    def reset(self) -> None:
        """Forget every cached result (the next call starts a trajectory whatever its timestep)."""
        from diffusers.hooks import HookRegistry

        HookRegistry.check_if_exists_or_initialize(self.transformer).reset_stateful_hooks()
        self._last = self.timestep = None

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self.transformer.disable_cache()


def calibrate_mag_ratios(transformer: torch.nn.Module, calls: int, clips: Iterable[Callable[[], object]]
                         ) -> list[list[float]]:
    """MagCache's ratios per clip: each of ``clips`` samples one clip (``calls`` transformer calls) while diffusers'
    hook records, in calibration mode (nothing skipped); returns one list of ``calls`` ratios per clip."""
    cache = TransformerCache(transformer, "magcache", calibrate_calls=calls)
    recorded = []
    try:
        for sample in clips:
            sample()
            if len(cache.calibration) != calls:
                raise RuntimeError(f"MagCache calibration saw {len(cache.calibration)} transformer calls in a clip, "
                                   f"expected {calls}")
            recorded.append(cache.calibration)
    finally:
        cache.remove()
    return recorded
