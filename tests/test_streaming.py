"""Streaming decode: the VAE's frames chunk by chunk, together exactly the whole decode."""

import pytest
import torch

from animegamer.config import DecoderConfig
from animegamer.models.sampling import load_vae, vae_decode
from animegamer.models.streaming import decode_chunks, latent_frame_batches

pytestmark = pytest.mark.usefixtures("one_thread")


def test_latent_frame_batches_follow_the_vae():
    assert latent_frame_batches(5, 2) == [(0, 3), (3, 5)]
    assert latent_frame_batches(4, 2) == [(0, 2), (2, 4)]
    assert latent_frame_batches(1, 2) == [(0, 1)]
    assert latent_frame_batches(7, 2) == [(0, 3), (3, 5), (5, 7)]


def test_chunks_make_up_the_whole_decode(tiny_cogvideox_dir):
    vae = load_vae(DecoderConfig(pretrained=str(tiny_cogvideox_dir), dtype="fp32"))
    latents = torch.randn(2, 5, 4, 6, 8, generator=torch.Generator().manual_seed(0))  # (B, F, C, h, w): 17 frames
    whole = vae_decode(vae, latents)
    chunks = list(decode_chunks(vae, latents))
    assert [c.shape[1] for c in chunks] == [9, 8] and chunks[0].dtype == torch.uint8
    torch.testing.assert_close(torch.cat(chunks, dim=1), whole, rtol=0, atol=0)
    vae.enable_tiling(tile_sample_min_height=16, tile_sample_min_width=16)  # tiles: one chunk, the same call
    tiled = list(decode_chunks(vae, latents))
    assert len(tiled) == 1
    torch.testing.assert_close(tiled[0], vae_decode(vae, latents), rtol=0, atol=0)
