"""sampling.vae=small: the game renders with the stage (e) small decoder, latent frame by latent frame."""

from pathlib import Path

import numpy as np
import pytest
import torch

from animegamer.config import DecoderConfig, SamplingConfig, load_config
from animegamer.data.video import read_video
from animegamer.game.build import build_session
from animegamer.game.renderer import DecoderRenderer
from animegamer.models.causal_decoder import CausalLatentDecoder
from animegamer.models.decoder import AnimationShotDecoder

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny" / "inference.yaml"
pytestmark = pytest.mark.usefixtures("one_thread")


def small_decoder_run(root: Path, latent_channels: int = 4) -> Path:
    """A stage (e) run directory (checkpoints/latest -> step_0000001/small_decoder) for the tiny VAE's latents."""
    torch.manual_seed(0)
    step = root / "checkpoints" / "step_0000001"
    CausalLatentDecoder(latent_channels, 8, 4, (8, 8, 8), 1).save_pretrained(step / "small_decoder")
    (root / "checkpoints" / "latest").write_text("step_0000001\n")
    return root


def test_renderer_streams_the_small_decoders_frames(tiny_cogvideox_dir, tmp_path):
    torch.manual_seed(0)
    decoder = AnimationShotDecoder.from_config(DecoderConfig(pretrained=str(tiny_cogvideox_dir), lora_rank=4,
                                                             lora_alpha=4, motion_embed_dim=16, dtype="fp32")).eval()
    small = CausalLatentDecoder.from_pretrained(small_decoder_run(tmp_path / "e") / "checkpoints/step_0000001"
                                                / "small_decoder")
    sampling = SamplingConfig(steps=2, height=48, width=64, num_frames=17)
    renderer = DecoderRenderer(decoder, sampling, "cpu", small_decoder=small)
    shot = torch.randn(226, 32)
    latents = renderer.latents(shot, 3, seed=1)
    chunks = list(renderer.decode(latents))
    frames = renderer.render(shot, 3, seed=1)
    assert [len(f) for f in chunks] == [1, 4, 4, 4, 4] and renderer.chunk_count(latents) == 5
    assert frames.shape == (17, 48, 64, 3) and (np.concatenate(chunks) == frames).all()
    latents = renderer.sampler.latents(shot[None], torch.tensor([3]), torch.Generator().manual_seed(1))
    with torch.no_grad():
        whole = ((small.decode(latents).clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8).permute(0, 1, 3, 4, 2)
    assert np.abs(whole[0].numpy().astype(int) - frames.astype(int)).max() <= 1
    many = renderer.render_many([shot, shot], [3, 3], [1, 1])
    assert np.abs(many[0].astype(int) - frames.astype(int)).max() <= 1
    full = DecoderRenderer(decoder, sampling, "cpu").render(shot, 3, seed=1)  # the VAE's frames are other frames
    assert full.shape == frames.shape and not np.array_equal(full, frames)


def _cfg(tiny_mistral_dir, tiny_cogvideox_dir, out, *extra):
    return load_config(TINY, [
        f"output_dir={out}", f"mllm.pretrained={tiny_mistral_dir}", f"decoder.pretrained={tiny_cogvideox_dir}",
        "mllm_checkpoint=", "decoder_checkpoint=", "history_turns=2",
        "sampling.steps=2", "sampling.height=48", "sampling.width=64", "sampling.num_frames=9", *extra,
    ])


def test_a_game_plays_with_the_small_decoder(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path):
    run = small_decoder_run(tmp_path / "stage_e")
    cfg = _cfg(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path / "play", "sampling.vae=small",
               f"sampling.small_decoder={run}")
    session = build_session(cfg)
    assert isinstance(session.game.renderer.small_decoder, CausalLatentDecoder)
    turn = session.play("Character: Qiqi; Motion: quickly run; Background: park.")
    assert turn.wait_clip()  # written in the background
    frames, _ = read_video(turn.clip)
    assert frames.shape == (9, 48, 64, 3)


def test_small_decoder_mistakes_fail_before_any_model(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path):
    with pytest.raises(ValueError, match="sampling.vae=small needs sampling.small_decoder"):
        build_session(_cfg(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path / "p", "sampling.vae=small",
                           "sampling.small_decoder="))
    with pytest.raises(FileNotFoundError, match="sampling.small_decoder=.*nowhere.*train_stage_e.py"):
        build_session(_cfg(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path / "p", "sampling.vae=small",
                           f"sampling.small_decoder={tmp_path / 'nowhere'}"))
    other = small_decoder_run(tmp_path / "sixteen", latent_channels=16)
    with pytest.raises(ValueError, match="made for latents"):
        build_session(_cfg(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path / "p", "sampling.vae=small",
                           f"sampling.small_decoder={other}"))
    with pytest.raises(ValueError, match="sampling.vae"):
        _cfg(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path / "p", "sampling.vae=tiny")


def test_shipped_spriteworld_small_decoder_streams_what_the_vae_shows():
    """make demo-fast: the shipped 2-step student decoded by the shipped stage (e) small decoder, one frame per latent
    frame (SpriteWorld's VAE has no temporal compression), close to the VAE's own decode of the same latents."""
    from animegamer.eval.metrics import psnr
    from animegamer.game.build import load_renderer
    from animegamer.sampling.streaming import decode_chunks

    cfg = load_config("configs/spriteworld/inference.yaml", ["sampling.preset=distilled", "sampling.vae=small",
                                                             "decoder_checkpoint=checkpoints/spriteworld/stage_d"])
    renderer = load_renderer(cfg, "cpu", offload=False)
    assert renderer.small_decoder is not None
    shot = torch.randn(cfg.mllm.num_slots, cfg.mllm.shot_dim, generator=torch.Generator().manual_seed(0))
    latents = renderer.latents(shot, 3, seed=0)
    chunks = list(renderer.decode(latents))
    frames = renderer.render(shot, 3, seed=0)
    assert [len(f) for f in chunks] == [1] * 9 and renderer.chunk_count(latents) == 9
    assert frames.shape == (9, 64, 96, 3) and frames.std() > 5
    latents = renderer.sampler.latents(shot[None], torch.tensor([3]), torch.Generator().manual_seed(0))
    full = torch.cat(list(decode_chunks(renderer.decoder.vae, latents)), 1)[0].numpy()
    assert psnr(frames, full) > 20.0  # dB: the same picture, a little softer
