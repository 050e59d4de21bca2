"""Streaming decode: the VAE's frames chunk by chunk, together exactly the whole decode."""

import numpy as np
import pytest
import torch

from animegamer.config import DecoderConfig
from animegamer.models.vae import load_vae, vae_decode
from animegamer.sampling.streaming import decode_chunks, latent_frame_batches

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


def _gif_frames(path) -> int:
    from PIL import Image

    with Image.open(path) as image:
        return image.n_frames


def test_the_game_writes_the_first_frames_before_the_rest(tiny_cogvideox_dir, tmp_path):
    """A 17-frame clip decodes in two chunks: its gif holds the first 9 frames while the rest decodes."""
    from animegamer.config import SamplingConfig
    from animegamer.game.renderer import DecoderRenderer
    from animegamer.game.turn import AnimeGamer, Turn, TurnEvents
    from animegamer.models.decoder import AnimationShotDecoder
    from animegamer.states import CharacterState, StateValues

    torch.manual_seed(0)
    decoder = AnimationShotDecoder.from_config(DecoderConfig(pretrained=str(tiny_cogvideox_dir), lora_rank=4,
                                                             lora_alpha=4, motion_embed_dim=16, dtype="fp32")).eval()
    sampling = SamplingConfig(steps=2, height=48, width=64, num_frames=17)
    renderer = DecoderRenderer(decoder, sampling, "cpu")
    shot = torch.randn(226, 32)
    latents = renderer.latents(shot, 3, seed=1)
    chunks = list(renderer.decode(latents))
    frames = renderer.render(shot, 3, seed=1)
    assert [len(f) for f in chunks] == [9, 8] and renderer.chunk_count(latents) == 2
    assert (np.concatenate(chunks) == frames).all() and frames.shape == (17, 48, 64, 3)

    gif = tmp_path / "turn_000.gif"
    heard = []

    class Terminal(TurnEvents):
        early_gif = True

        def stage(self, text, done):
            heard.append(text)
            if text.startswith("first 9 frames"):  # the gif on disk now: the first chunk only
                assert _gif_frames(gif) == 9

    game = AnimeGamer(None, renderer, seed=0)
    turn = Turn(0, "instruction", StateValues(3, 0, 0, 0), CharacterState(), torch.randn(226, 32), 10)
    rendered = game.render_turn(turn, tmp_path, events=Terminal())
    assert f"first 9 frames: {gif}" in heard and heard[-1] == "writing the clip"
    assert turn.gif == str(gif) and _gif_frames(gif) == 17 and turn.clip == str(tmp_path / "turn_000.mp4")
    assert rendered.shape == (17, 48, 64, 3)


def test_a_batch_renders_each_clip_as_it_renders_alone(tiny_cogvideox_dir):
    """render_many draws every clip from its own seed (initial latents and the DPM scheduler's per-step noise), so
    a batch gives each clip of the single renders, up to float rounding; the clips differ from each other."""
    from animegamer.config import SamplingConfig
    from animegamer.game.renderer import DecoderRenderer
    from animegamer.models.decoder import AnimationShotDecoder
    from animegamer.sampling.schedule import initial_noise

    torch.manual_seed(0)
    decoder = AnimationShotDecoder.from_config(DecoderConfig(pretrained=str(tiny_cogvideox_dir), lora_rank=4,
                                                             lora_alpha=4, motion_embed_dim=16, dtype="fp32")).eval()
    renderer = DecoderRenderer(decoder, SamplingConfig(scheduler="dpm", steps=3, height=48, width=64, num_frames=9),
                               "cpu")
    shots = [torch.randn(226, 32, generator=torch.Generator().manual_seed(i)) for i in range(3)]
    levels, seeds = [1, 3, 5], [7, 8, 9]
    alone = np.stack([renderer.render(*clip) for clip in zip(shots, levels, seeds, strict=True)])
    together = np.stack(renderer.render_many(shots, levels, seeds))
    assert together.shape == alone.shape == (3, 9, 48, 64, 3) and together.dtype == np.uint8
    gap = np.abs(together.astype(int) - alone.astype(int))
    assert gap.max() <= 1 and (gap > 0).mean() < 1e-3
    assert np.abs(alone[0].astype(int) - alone[1].astype(int)).mean() > 1  # three different clips
    assert renderer.render_many([], [], []) == []
    with pytest.raises(ValueError, match="2 shots, 1 levels and 2 seeds"):
        renderer.render_many(shots[:2], levels[:1], seeds[:2])

    generators = [torch.Generator().manual_seed(s) for s in seeds]  # one draw per clip, as B single draws
    noise = initial_noise((3, 2, 4), generators)
    singles = [torch.randn((1, 2, 4), generator=torch.Generator().manual_seed(s)) for s in seeds]
    torch.testing.assert_close(noise, torch.cat(singles), rtol=0, atol=0)
    with pytest.raises(ValueError, match="2 generators for a batch of 3"):
        initial_noise((3, 2, 4), generators[:2])
