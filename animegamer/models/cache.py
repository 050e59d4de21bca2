"""``sampling.cache``: diffusers' own caching hooks on the decoder's CogVideoX transformer.

    cache = TransformerCache(decoder.transformer, "first_block")   # any sampler, unchanged, now skips work
    frames = decoder.sample(...)
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

MagCache is left out: it needs magnitude ratios calibrated per model and step count (none exist for a LoRA-adapted
CogVideoX-2B; calibrating is a run of its own).

The hooks are stateful and want to know which call of the loop they see (``transformer.cache_context``). Rather
than writing that into every sampling loop, :class:`TransformerCache` opens the context from the call itself: the
current timestep feeds the methods that depend on it, a timestep that does not decrease starts a new trajectory
and a change of batch size (guidance switching off: 2B -> B) starts the caches afresh (FasterCache keeps the
conditional half itself), and FasterCache's
unconditional-branch skipping sees only the guided calls (its hook splits every input into [uncond, cond]). So
``AnimationShotDecoder.sample``, the fast preset and the distilled sampler all compose with any method.
"""

from __future__ import annotations

import torch

CACHE_METHODS = ("none", "first_block", "taylorseer", "pab", "faster")


def cache_config(method: str, current_timestep, threshold: float = 0.05, guidance_distilled: bool = False):
    """The diffusers config of ``method``; ``current_timestep()`` returns the timestep of the running call."""
    from diffusers.hooks import (
        FasterCacheConfig,
        FirstBlockCacheConfig,
        PyramidAttentionBroadcastConfig,
        TaylorSeerCacheConfig,
    )
    from diffusers.hooks.faster_cache import _UNCOND_COND_INPUT_KWARGS_IDENTIFIERS

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
    docstring). :meth:`remove` takes every hook off again."""

    def __init__(self, transformer: torch.nn.Module, method: str, threshold: float = 0.05,
                 guidance_distilled: bool = False):
        self.transformer, self.method, self.guidance_distilled = transformer, method, guidance_distilled
        self._first_batch = self._batch = 0
        self.timestep: float | None = None  # of the running call; None between trajectories
        self._last: float | None = None
        self._context = None
        transformer.enable_cache(cache_config(method, self._current_timestep, threshold, guidance_distilled))
        self._handles = [
            transformer.register_forward_pre_hook(self._enter, with_kwargs=True),
            transformer.register_forward_hook(self._leave),
        ]

    def _current_timestep(self) -> float:
        return self.timestep

    def _enter(self, module, args, kwargs):
        from diffusers.hooks import HookRegistry

        t = float(kwargs["timestep"].flatten()[0])
        batch = kwargs["hidden_states"].shape[0]
        registry = HookRegistry.check_if_exists_or_initialize(module)
        if self._last is None or t >= self._last:  # back at the noisy end: a new clip
            registry.reset_stateful_hooks()
            self._first_batch = batch  # guidance, when a sampler uses it, is on from the first step
        elif batch != self._batch and self.method != "faster":
            # guidance switched off: results cached at batch 2B do not fit batch B (FasterCache's block hooks keep
            # the conditional half by themselves, and a reset mid-trajectory breaks them)
            registry.reset_stateful_hooks()
        self._last, self._batch, self.timestep = t, batch, t
        if self.method == "faster":
            # FasterCache's denoiser hook splits every input in [uncond, cond] halves: only on guided calls
            from diffusers.hooks.faster_cache import _FASTER_CACHE_DENOISER_HOOK

            guided = batch == self._first_batch and not self.guidance_distilled
            registry.get_hook(_FASTER_CACHE_DENOISER_HOOK).is_guidance_distilled = not guided
        self._context = module.cache_context("denoiser", timestep=t)
        self._context.__enter__()

    def _leave(self, module, args, output):
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
