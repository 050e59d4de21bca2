"""Frames before the whole clip is decoded: the CogVideoX VAE decode, handed out chunk by chunk.

    for frames in decode_chunks(decoder.vae, latents):   # uint8 (B, t, H, W, 3), t = 9 then 8 for 5 latent frames
        show(frames)

The CogVideoX VAE already decodes a clip in batches of latent frames (``num_latent_frames_batch_size``, 2; the first
batch also takes the odd one), carrying a causal convolution cache from one batch to the next, and concatenates
them at the end. :func:`decode_chunks` runs the same batches in the same order and yields each one as soon as it is
ready, so the chunks put together are exactly the frames of one whole decode (the first 9 of 17 frames come after
3 of the 5 latent frames). A tiled decode (``vae_tiling``) is not causal in this sense and comes as one chunk.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def to_uint8_frames(video: torch.Tensor) -> torch.Tensor:
    """VAE output (B, 3, T, H, W) in [-1, 1] -> uint8 (B, T, H, W, 3) on the CPU."""
    video = ((video.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
    return video.permute(0, 2, 3, 4, 1).cpu()


def latent_frame_batches(num_latent_frames: int, batch: int) -> list[tuple[int, int]]:
    """(start, end) latent frames of each of the VAE's decode batches, the leftover frames in the first one."""
    leftover = num_latent_frames % batch
    count = max(num_latent_frames // batch, 1)
    return [(0 if i == 0 else batch * i + leftover, min(batch * (i + 1) + leftover, num_latent_frames))
            for i in range(count)]


@torch.no_grad()
def decode_chunks(vae, latents: torch.Tensor) -> Iterator[torch.Tensor]:
    """Scaled latents (B, F, C, h, w) -> uint8 frames (B, t, H, W, 3), one chunk per VAE decode batch."""
    param = next(vae.parameters())
    z = latents.permute(0, 2, 1, 3, 4) / vae.config.scaling_factor  # (B, C, F, h, w)
    z = z.to(device=param.device, dtype=param.dtype)
    height, width = z.shape[-2:]
    if vae.use_tiling and (width > vae.tile_latent_min_width or height > vae.tile_latent_min_height):
        yield to_uint8_frames(vae.decode(z).sample)
        return
    conv_cache = None
    for start, end in latent_frame_batches(z.shape[2], vae.num_latent_frames_batch_size):
        part = z[:, :, start:end]
        if vae.post_quant_conv is not None:
            part = vae.post_quant_conv(part)
        video, conv_cache = vae.decoder(part, conv_cache=conv_cache)  # (B, 3, t, H, W)
        yield to_uint8_frames(video)
