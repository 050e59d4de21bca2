"""The stage (e) small causal decoder: CogVideoX's frame layout, streaming, save/load, a tiny fit, compile."""

import json

import pytest
import torch

from animegamer.models.causal_decoder import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    CausalLatentDecoder,
    read_vae_layout,
)
from animegamer.models.trained import load_small_decoder

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny(temporal: int = 4, spatial: int = 8, latent_channels: int = 4) -> CausalLatentDecoder:
    torch.manual_seed(0)
    levels = spatial.bit_length() - 1
    return CausalLatentDecoder(latent_channels, spatial, temporal, (12, 8, 8)[:levels], 1).eval()


@pytest.mark.parametrize("latent_frames, frames", [(1, 1), (2, 5), (5, 17)])
def test_cogvideox_layout_first_latent_one_frame_then_four(latent_frames, frames):
    model = tiny()
    out = model.decode(torch.randn(2, latent_frames, 4, 3, 5))
    assert out.shape == (2, frames, 3, 24, 40) and model.num_frames(latent_frames) == frames
    chunks = model.stream(torch.randn(1, latent_frames, 4, 3, 5))
    assert [c.shape[1] for c in chunks] == [1] + [4] * (latent_frames - 1)


def test_default_size_is_about_ten_million_parameters_for_cogvideox_latents():
    model = CausalLatentDecoder()  # 16 channels, 8x spatial, 4x temporal
    count = sum(p.numel() for p in model.parameters())
    assert 9e6 < count < 11e6
    assert model.decode(torch.randn(1, 2, 16, 2, 2)).shape == (1, 5, 3, 16, 16)


def test_no_temporal_compression_is_one_frame_per_latent():
    model = tiny(temporal=1, spatial=4)
    assert model.decode(torch.randn(1, 3, 4, 4, 6)).shape == (1, 3, 3, 16, 24)


def test_first_frames_come_before_the_last_latent_and_equal_the_whole_decode():
    model = tiny()
    latents = torch.randn(1, 5, 4, 3, 5)
    with torch.no_grad():
        whole = model.decode(latents)  # (1, 17, 3, 24, 40)
        stream = model.stream(latents.clone())
        first = next(stream)
        # the stream holds only what it has read: poisoning the not-yet-decoded latents cannot reach the first frame
        poisoned = latents.clone()
        poisoned[:, 1:] = float("nan")
        first_of_poisoned = next(model.stream(poisoned))
        rest = list(stream)
    assert first.shape[1] == 1 and torch.isfinite(first_of_poisoned).all()
    torch.testing.assert_close(first_of_poisoned, whole[:, :1], rtol=0, atol=1e-5)
    torch.testing.assert_close(torch.cat([first, *rest], 1), whole, rtol=0, atol=1e-5)
    # frames depend on earlier latents (the memory), never on later ones
    changed = latents.clone()
    changed[:, 2] += 1.0
    with torch.no_grad():
        other = model.decode(changed)
    assert torch.equal(other[:, :5], whole[:, :5]) or torch.allclose(other[:, :5], whole[:, :5], atol=1e-6)
    assert not torch.allclose(other[:, 5:9], whole[:, 5:9]) and not torch.allclose(other[:, 9:], whole[:, 9:])


def test_uint8_chunks_are_the_whole_decode():
    model = tiny()
    latents = torch.randn(1, 3, 4, 3, 5)
    chunks = list(model.decode_chunks(latents))
    assert [c.shape for c in chunks] == [(1, 1, 24, 40, 3), (1, 4, 24, 40, 3), (1, 4, 24, 40, 3)]
    assert all(c.dtype == torch.uint8 for c in chunks)
    with torch.no_grad():
        whole = ((model.decode(latents).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 1, 3, 4, 2)
    assert (torch.cat(chunks, 1).int() - whole.int()).abs().max() <= 1


def test_loss_decreases_on_a_tiny_fit():
    torch.manual_seed(1)
    latents = torch.randn(2, 2, 4, 3, 5)
    # smooth frames made from the latents (their first 3 channels, upsampled), which a decoder can learn
    colour = torch.tanh(latents[:, :, :3]).repeat_interleave(8, -1).repeat_interleave(8, -2)  # (2, 2, 3, 24, 40)
    target = torch.cat([colour[:, :1], colour[:, 1:].repeat_interleave(4, 1)], 1)  # (2, 5, 3, 24, 40)
    model = tiny().train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = torch.nn.functional.mse_loss(model.decode(latents), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert all(map(lambda v: v == v, losses)) and losses[-1] < 0.6 * losses[0]


def test_save_and_load_round_trip_and_bad_files(tmp_path):
    model = tiny()
    out = model.save_pretrained(tmp_path / "run" / "small_decoder")
    assert (out / CONFIG_FILE).is_file() and (out / WEIGHTS_FILE).is_file()
    latents = torch.randn(1, 2, 4, 3, 5)
    for loaded in (CausalLatentDecoder.from_pretrained(out), load_small_decoder(out),
                   load_small_decoder(tmp_path / "run")):
        torch.testing.assert_close(loaded.decode(latents), model.decode(latents))
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        load_small_decoder(tmp_path / "nowhere")
    config = json.loads((out / CONFIG_FILE).read_text())
    (out / CONFIG_FILE).write_text(json.dumps({**config, "channels": [4, 4, 4]}))
    with pytest.raises(ValueError, match="does not fit"):
        CausalLatentDecoder.from_pretrained(out)
    (out / CONFIG_FILE).write_text(json.dumps({"format": "something else"}))
    with pytest.raises(ValueError, match="not a small decoder config"):
        CausalLatentDecoder.from_pretrained(out)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="spatial_factor=6"):
        CausalLatentDecoder(4, 6, 1, (8,), 1)
    with pytest.raises(ValueError, match="temporal_factor=3"):
        CausalLatentDecoder(4, 8, 3, (8, 8, 8), 1)
    with pytest.raises(ValueError, match="one width per"):
        CausalLatentDecoder(4, 8, 4, (8, 8), 1)
    with pytest.raises(ValueError, match="made for latents"):
        tiny().check_vae(16, 8, 4)


def test_vae_layout_from_the_tiny_cogvideox(tiny_cogvideox_dir):
    assert read_vae_layout(tiny_cogvideox_dir) == (4, 8, 4)


def test_regional_compile_gives_the_same_frames():
    model = tiny()
    latents = torch.randn(1, 3, 4, 3, 5)
    with torch.no_grad():
        eager = model.decode(latents)
        model.compile_blocks(backend="aot_eager", dynamic=False)
        compiled = model.decode(latents)
        streamed = torch.cat(list(model.stream(latents)), 1)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-5)
    torch.testing.assert_close(streamed, eager, rtol=0, atol=1e-5)
