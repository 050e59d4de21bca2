"""The decoder side of a turn (:class:`animegamer.game.turn.ShotRenderer`): s_a + motion level -> latents with
the ``sampling.preset`` / ``sampling.cache`` sampler (:mod:`animegamer.sampling.presets`), then the VAE decode
chunk by chunk (:mod:`animegamer.sampling.streaming`), or with ``sampling.vae=small`` the stage (e) small causal
decoder (:class:`animegamer.models.causal_decoder.CausalLatentDecoder`) latent frame by latent frame.

    renderer = DecoderRenderer(decoder, cfg.sampling, "cuda")
    latents = renderer.latents(shot_embeds, motion_level, seed)        # (1, F, C, h, w)
    for frames in renderer.decode(latents): ...                        # (t, H, W, 3) uint8, as soon as decoded
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np
import torch

from animegamer.config import SamplingConfig
from animegamer.game.turn import on_device
from animegamer.models.causal_decoder import CausalLatentDecoder
from animegamer.sampling.presets import PresetSampler
from animegamer.sampling.streaming import decode_chunks, latent_frame_batches


class DecoderRenderer:
    """Renders a shot representation with the decoder: (N, H) s_a + motion level -> (T, H, W, 3) uint8. With
    ``offload`` the decoder sits on the CPU and moves to ``device`` only while it samples or decodes (a small
    decoder stays on ``device``)."""

    def __init__(self, decoder, sampling: SamplingConfig, device: str, offload: bool = False,
                 sampler: PresetSampler | None = None, small_decoder: CausalLatentDecoder | None = None):
        self.decoder, self.device, self.offload = decoder, device, offload
        self.small_decoder = small_decoder  # sampling.vae=small: decodes the latents in place of the VAE
        # sampling.preset / sampling.cache (animegamer.sampling.presets); plain settings without one
        self.sampler = sampler if sampler is not None else PresetSampler(decoder, sampling)
        self.sampling = self.sampler.sampling
        self.fps = sampling.fps

    def latents(self, shot_embeds: torch.Tensor, motion_level: int, seed: int,
                on_step: Callable[[int, int], None] | None = None) -> torch.Tensor:
        """(N, H) s_a -> the clip's final latents (1, F, C, h, w), drawn from ``seed``'s generator."""
        generator = torch.Generator().manual_seed(seed)
        with on_device(self.decoder, self.device, self.offload):
            return self.sampler.latents(
                shot_embeds[None].to(self.decoder.dtype),  # (1, N, H)
                torch.tensor([motion_level]),
                generator,
                on_step=on_step,
            )

    def chunk_count(self, latents: torch.Tensor) -> int:
        if self.small_decoder is not None:
            return self.small_decoder.num_chunks(latents.shape[1])
        return len(latent_frame_batches(latents.shape[1], self.decoder.vae.num_latent_frames_batch_size))

    def decode(self, latents: torch.Tensor) -> Iterator[np.ndarray]:
        """(1, F, C, h, w) latents -> uint8 frames (t, H, W, 3), one chunk per VAE decode batch (small decoder:
        per latent frame) as it is ready."""
        if self.small_decoder is not None:
            for chunk in self.small_decoder.decode_chunks(latents):  # (1, t, H, W, 3) uint8
                yield chunk[0].numpy()
            return
        with on_device(self.decoder, self.device, self.offload):
            for chunk in decode_chunks(self.decoder.vae, latents):  # (1, t, H, W, 3) uint8
                yield chunk[0].numpy()

    def render(self, shot_embeds: torch.Tensor, motion_level: int, seed: int,
               progress: Callable[[str, float], None] | None = None) -> np.ndarray:
        """One whole clip (T, H, W, 3): :meth:`latents` then :meth:`decode`; ``progress`` hears "denoising
        step/steps" after every step, then "decoding", with the fraction done (the decode counted as one more
        step)."""
        on_step = (lambda step, steps: progress(f"denoising {step}/{steps}", step / (steps + 1))) if progress else None
        latents = self.latents(shot_embeds, motion_level, seed, on_step)
        if progress:
            progress("decoding", 1 - 1 / (self.sampling.steps + 1))
        return np.concatenate(list(self.decode(latents)))

    def render_many(self, shots: Sequence[torch.Tensor], motion_levels: Sequence[int],
                    seeds: Sequence[int]) -> list[np.ndarray]:
        """Several clips in one batch (the evaluation's way to fill a CPU): each drawn from its own seed's
        generator, as :meth:`latents` draws it alone, so a clip differs from its single render by float rounding
        only. A cache method decides its skips for the whole batch: with one, the clips render one at a time."""
        if not len(shots) == len(motion_levels) == len(seeds):
            raise ValueError(f"{len(shots)} shots, {len(motion_levels)} levels and {len(seeds)} seeds")
        if not shots:
            return []
        if self.sampler.cache is not None:
            return [self.render(*clip) for clip in zip(shots, motion_levels, seeds, strict=True)]
        generators = [torch.Generator().manual_seed(seed) for seed in seeds]
        with on_device(self.decoder, self.device, self.offload):
            latents = self.sampler.latents(
                torch.stack(list(shots)).to(self.decoder.dtype),  # (B, N, H)
                torch.tensor(list(motion_levels)),
                generators,
            )  # (B, F, C, h, w)
            chunks = (self.small_decoder.decode_chunks(latents) if self.small_decoder is not None
                      else decode_chunks(self.decoder.vae, latents))
            frames = torch.cat(list(chunks), dim=1)  # (B, T, H, W, 3) uint8
        return list(frames.numpy())
