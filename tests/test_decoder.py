"""AnimationShotDecoder on a tiny CogVideoX: motion embedding, text-projection bypass, save/load, sampling."""

import json
import math
from dataclasses import replace

import pytest
import torch

from animegamer.config import DecoderConfig, SamplingConfig
from animegamer.config.recorded import DECODER_SHAPE, decoder_record
from animegamer.data.video import probe_video, read_video
from animegamer.game.turn import clip_stem, write_clip
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.trained import load_decoder
from animegamer.sampling.denoise import sample
from animegamer.sampling.schedule import guidance_scales
from tests.helpers.clips import make_clip_frames


@pytest.fixture(autouse=True, scope="module")
def single_torch_thread():
    """Tiny models run fastest on one thread; two workers x two threads on two busy cores mostly spin."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(path, **kw) -> DecoderConfig:
    base = dict(
        pretrained=str(path),
        lora_rank=4,
        lora_alpha=4,
        motion_embed_dim=16,
        gradient_checkpointing=False,
        dtype="fp32",
    )
    return DecoderConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def decoder(tiny_cogvideox_dir):
    torch.manual_seed(0)
    return AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir)).eval()


def _inputs(batch=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, 3, 4, 6, 8, generator=g)  # (B, F, C, h, w): 9 frames of 48x64
    shots = torch.randn(batch, 226, 32, generator=g)
    return latents, torch.tensor([10, 700])[:batch], shots


def test_motion_embedding_starts_as_noop_then_changes_output(tiny_cogvideox_dir):
    from diffusers import CogVideoXTransformer3DModel

    torch.manual_seed(0)
    decoder = AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir))
    plain = CogVideoXTransformer3DModel.from_pretrained(str(tiny_cogvideox_dir / "transformer"))
    plain.patch_embed.text_proj = torch.nn.Identity()  # the same bypass, and no motion embedding
    latents, t, shots = _inputs()
    with torch.no_grad():
        reference = plain(latents, shots, t, return_dict=False)[0]
        out_1 = decoder(latents, t, shots, torch.tensor([1, 1]))
        out_5 = decoder(latents, t, shots, torch.tensor([5, 5]))
    torch.testing.assert_close(out_1, reference, rtol=0, atol=1e-6)
    torch.testing.assert_close(out_5, reference, rtol=0, atol=1e-6)

    with torch.no_grad():
        torch.nn.init.normal_(decoder.transformer.ofs_embedding.linear_2.weight, std=0.5)
        out_1 = decoder(latents, t, shots, torch.tensor([1, 1]))
        out_5 = decoder(latents, t, shots, torch.tensor([5, 5]))
    assert (out_1 - out_5).abs().max() > 1e-3
    assert (out_1 - reference).abs().max() > 1e-3


def test_trainable_parts_and_text_projection(decoder, tiny_cogvideox_dir):
    trainable = {n for n, p in decoder.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n or "ofs_embedding" in n for n in trainable)
    assert len(decoder.lora_parameters()) == 2 * 4 * 2  # A and B x 4 projections x 2 layers
    assert all(p.dtype == torch.float32 for p in decoder.trainable_parameters())
    assert isinstance(decoder.transformer.patch_embed.text_proj, torch.nn.Identity)

    encoder = ActionAwareEncoder(clip_dim=32, clip_tokens=16, text_dim=32, hidden_dim=32)
    decoder.copy_text_projection_to(encoder.text_proj)
    from safetensors.torch import load_file

    pretrained = load_file(str(tiny_cogvideox_dir / "transformer" / "diffusion_pytorch_model.safetensors"))
    assert torch.equal(encoder.text_proj.weight, pretrained["patch_embed.text_proj.weight"])
    with pytest.raises(ValueError, match="text projection"):
        decoder.copy_text_projection_to(torch.nn.Linear(64, 32))
    with pytest.raises(ValueError, match="226"):
        decoder(*_inputs()[:2], torch.zeros(2, 100, 32), torch.tensor([1, 2]))


def test_save_and_load_trained_roundtrip(tiny_cogvideox_dir, tmp_path):
    torch.manual_seed(0)
    a = AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir))
    with torch.no_grad():
        for p in a.trainable_parameters():
            p.normal_()
    a.save_trained(tmp_path / "dec")
    names = sorted(p.name for p in (tmp_path / "dec").iterdir())
    assert names == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "decoder_config.json",
        "motion_embedding.safetensors",
    ]
    torch.manual_seed(1)
    b = AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir))
    b.load_trained(tmp_path / "dec")
    for pa, pb in zip(a.trainable_parameters(), b.trainable_parameters(), strict=True):
        assert torch.equal(pa, pb)
    latents, t, shots = _inputs()
    with torch.no_grad():
        torch.testing.assert_close(
            a(latents, t, shots, torch.tensor([2, 4])), b(latents, t, shots, torch.tensor([2, 4]))
        )
    with pytest.raises(ValueError, match="lora_rank"):
        AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir, lora_rank=8)).load_trained(tmp_path / "dec")
    # the files record the decoder's whole shape: load_decoder builds it from a config that does not restate it
    record = decoder_record(tmp_path / "dec")
    assert set(record.shape) == set(DECODER_SHAPE)
    assert {k: getattr(_config(tiny_cogvideox_dir), k) for k in DECODER_SHAPE} == record.shape
    c = load_decoder(tmp_path / "dec", DecoderConfig(pretrained=str(tiny_cogvideox_dir), dtype="fp32"))
    for pa, pc in zip(a.trainable_parameters(), c.trainable_parameters(), strict=True):
        assert torch.equal(pa, pc)
    with pytest.raises(ValueError, match=r"decoder\.motion_embed_dim=8, but .*decoder_config\.json records"):
        load_decoder(tmp_path / "dec", _config(tiny_cogvideox_dir, motion_embed_dim=8))
    with pytest.raises(FileNotFoundError, match="decoder_config"):
        b.load_trained(tmp_path / "nothing")


def test_motion_guidance_drops_the_level_with_the_shot(tiny_cogvideox_dir, tmp_path):
    with pytest.raises(ValueError, match="motion scope"):
        AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir, motion_scope=False, motion_guidance=True))
    torch.manual_seed(0)
    guided = AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir, motion_guidance=True)).eval()
    plain = AnimationShotDecoder.from_config(_config(tiny_cogvideox_dir)).eval()
    shots, levels, dropped = torch.randn(2, 226, 32), torch.tensor([3, 4]), torch.tensor([True, False])

    g_shots, g_levels = guided.drop_conditions(shots, levels, dropped)
    assert g_levels.tolist() == [0, 4] and guided.unconditional_levels(levels).tolist() == [0, 0]
    assert torch.equal(g_shots[0], torch.zeros(226, 32)) and torch.equal(g_shots[1], shots[1])
    p_shots, p_levels = plain.drop_conditions(shots, levels, dropped)
    assert p_levels.tolist() == [3, 4] and plain.unconditional_levels(levels).tolist() == [3, 4]
    assert torch.equal(p_shots, g_shots)

    # the null level is a value of its own for a trained embedding, and sampling's unconditional branch uses it
    with torch.no_grad():
        torch.nn.init.normal_(guided.transformer.ofs_embedding.linear_2.weight, std=0.5)
    latents, t, _ = _inputs()
    with torch.no_grad():
        assert (guided(latents, t, shots, torch.tensor([0, 0])) - guided(latents, t, shots, levels)).abs().max() > 1e-3
    sampling = SamplingConfig(steps=2, height=48, width=64, num_frames=9, guidance_scale=4.0, dynamic_cfg=False)
    with_null = sample(guided, shots, levels, sampling, decode=False)
    guided.motion_guidance = False
    assert (sample(guided, shots, levels, sampling, decode=False) - with_null).abs().max() > 1e-4
    no_cfg = replace(sampling, guidance_scale=1.0)  # one branch only: the null level never enters
    unguided = sample(guided, shots, levels, no_cfg, decode=False)
    guided.motion_guidance = True
    assert torch.equal(sample(guided, shots, levels, no_cfg, decode=False), unguided)

    # a checkpoint records how its level was dropped, and loading adopts it (files without it: plain)
    guided.save_trained(tmp_path / "dec")
    assert json.loads((tmp_path / "dec" / "decoder_config.json").read_text())["motion_guidance"] is True
    plain.load_trained(tmp_path / "dec")
    assert plain.motion_guidance
    saved = json.loads((tmp_path / "dec" / "decoder_config.json").read_text())
    del saved["motion_guidance"]
    (tmp_path / "dec" / "decoder_config.json").write_text(json.dumps(saved))
    plain.load_trained(tmp_path / "dec")
    assert not plain.motion_guidance


def test_missing_checkpoint_names_the_readme(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoints/README.md"):
        AnimationShotDecoder.from_config(_config(tmp_path / "nowhere"))


def test_vae_roundtrip_shapes(decoder):
    frames = torch.from_numpy(make_clip_frames(9, 48, 64))[None]  # (1, 9, 48, 64, 3)
    latents = decoder.encode_video(frames)
    assert latents.shape == (1, 3, 4, 6, 8) and latents.dtype == torch.float32
    assert decoder.latent_shape(9, 48, 64) == (3, 4, 6, 8)
    video = decoder.decode_latents(latents)
    assert video.shape == (1, 9, 48, 64, 3) and video.dtype == torch.uint8
    with pytest.raises(ValueError, match="4k \\+ 1"):
        decoder.latent_shape(8, 48, 64)


def test_guidance_schedule():
    s = SamplingConfig(steps=10, guidance_scale=6.0, dynamic_cfg=True, dynamic_cfg_exponent=5.0)
    scales = guidance_scales(s)
    assert scales[0] == pytest.approx(7.0)  # 1 + g at the first step
    assert all(a >= b for a, b in zip(scales[:-1], scales[1:], strict=True))  # ramps down
    assert scales[-1] == pytest.approx(1.0, abs=1e-3)
    assert scales[5] == pytest.approx(1 + 6 * (1 - math.cos(math.pi * 0.5**5)) / 2)
    flat = guidance_scales(SamplingConfig(steps=4, guidance_scale=3.0, dynamic_cfg=False, guidance_steps_fraction=0.5))
    assert flat == [3.0, 3.0, 1.0, 1.0]
    assert guidance_scales(SamplingConfig(steps=3, guidance_scale=1.0)) == [1.0, 1.0, 1.0]


def test_fast_preset_calls_the_transformer_17_times_instead_of_99():
    from animegamer.sampling.presets import fast_sampling

    paper = SamplingConfig(scheduler="ddim", steps=50, guidance_scale=6.0, dynamic_cfg=True)
    fast = fast_sampling(paper)
    assert (fast.scheduler, fast.steps, fast.guidance_scale, fast.height) == ("dpm", 12, 6.0, paper.height)
    calls = lambda s: sum(2 if g > 1.0 else 1 for g in guidance_scales(s))  # noqa: E731
    assert (calls(paper), calls(fast)) == (99, 17)  # dynamic CFG is 1.0 only at the last of 50 steps
    assert fast_sampling(SamplingConfig(steps=8)).steps == 8  # never more steps than asked for


@pytest.mark.parametrize("scheduler", ["dpm", "ddim"])
def test_sampling_writes_playable_clips(decoder, tmp_path, scheduler):
    sampling = SamplingConfig(
        scheduler=scheduler,
        steps=3,
        height=48,
        width=64,
        num_frames=9,
        guidance_scale=4.0,
        guidance_steps_fraction=0.67,
    )
    shots = torch.randn(2, 226, 32, generator=torch.Generator().manual_seed(0))
    frames = sample(decoder, shots, torch.tensor([1, 5]), sampling)
    assert frames.shape == (2, 9, 48, 64, 3) and frames.dtype == torch.uint8
    again = sample(decoder, shots, torch.tensor([1, 5]), sampling)
    assert torch.equal(frames, again)  # seeded
    other = sample(decoder, shots, torch.tensor([1, 5]), sampling, generator=torch.Generator().manual_seed(1))
    assert not torch.equal(frames, other)
    with pytest.raises(ValueError, match="motion levels"):
        sample(decoder, shots, torch.tensor([0, 6]), sampling)
    mp4, gif = write_clip(frames[0], clip_stem(tmp_path, 0), fps=sampling.fps)
    info = probe_video(mp4)
    assert (info.height, info.width, info.num_frames) == (48, 64, 9) and info.fps == pytest.approx(8)
    decoded, _ = read_video(mp4)
    assert decoded.shape == (9, 48, 64, 3)
    from PIL import Image

    with Image.open(gif) as im:
        assert im.size == (64, 48) and im.n_frames == 9
