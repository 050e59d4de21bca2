"""sampling.cache (diffusers' cache hooks) and sampling.preset (standard | fast | distilled) on the tiny decoder."""

import typing

import pytest
import torch

from animegamer.config import DecoderConfig, InferenceConfig, SamplingConfig, load_config
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.sampling.cache import CACHE_METHODS, TransformerCache
from animegamer.sampling.denoise import sample
from animegamer.sampling.fewstep import FewStepSampler, fewstep_sample
from animegamer.sampling.presets import PresetSampler, effective_sampling, guided_calls

pytestmark = pytest.mark.usefixtures("one_thread")
SAMPLING = SamplingConfig(steps=20, height=64, width=96, num_frames=5)  # 2 latent frames of 8x12


@pytest.fixture(scope="module")
def decoder(tiny_cogvideox_dir):
    torch.manual_seed(0)
    cfg = DecoderConfig(pretrained=str(tiny_cogvideox_dir), lora_rank=4, lora_alpha=4, motion_embed_dim=16,
                        gradient_checkpointing=False, dtype="fp32")
    return AnimationShotDecoder.from_config(cfg).eval()


@pytest.fixture
def block_calls(decoder):
    """How many times the blocks' attention projections ran: a cached step or block does not run them."""
    count = [0]
    handles = [b.attn1.to_q.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
               for b in decoder.transformer.transformer_blocks]
    yield count
    for h in handles:
        h.remove()


def _sample(decoder, sampling, seed=0):
    shots = torch.randn(1, 226, 32, generator=torch.Generator().manual_seed(5))
    return sample(decoder, shots, torch.tensor([3]), sampling, generator=torch.Generator().manual_seed(seed),
                          decode=False)


@pytest.mark.parametrize("method", [m for m in CACHE_METHODS if m not in ("none", "magcache")])  # test_magcache
@pytest.mark.parametrize("preset", ["standard", "fast"])
def test_each_cache_skips_work_and_composes_with_the_presets(decoder, block_calls, method, preset):
    sampler = PresetSampler.build(decoder, SamplingConfig(**{**vars(SAMPLING), "preset": preset}))
    block_calls[0] = 0
    reference = _sample(decoder, sampler.sampling)
    full = block_calls[0]
    assert full == len(decoder.transformer.transformer_blocks) * sampler.sampling.steps  # one call per step

    cache = TransformerCache(decoder.transformer, method, threshold=0.5)
    try:
        block_calls[0] = 0
        cached = _sample(decoder, sampler.sampling)
        skipped = full - block_calls[0]
        again = _sample(decoder, sampler.sampling)  # a new clip: the caches start afresh
    finally:
        cache.remove()
    assert torch.isfinite(cached).all()
    assert 0 < skipped < full, (method, preset, skipped, full)
    torch.testing.assert_close(again, cached, rtol=0, atol=0)
    assert float((cached - reference).norm() / reference.norm()) < 0.5  # an approximation of the same clip
    torch.testing.assert_close(_sample(decoder, sampler.sampling), reference, rtol=0, atol=0)  # hooks gone


def test_transformer_calls_per_preset():
    assert guided_calls(SamplingConfig()) == 99  # the paper: 49 guided steps x 2 + 1
    assert guided_calls(effective_sampling(SamplingConfig(preset="fast"))) == 17  # 5 guided x 2 + 7


def test_distilled_preset_reads_the_students_sampler(decoder, block_calls, tmp_path):
    FewStepSampler((999, 749, 499, 249), teacher={"steps": 20}).save(tmp_path)
    sampling = SamplingConfig(**{**vars(SAMPLING), "preset": "distilled"})
    sampler = PresetSampler.build(decoder, sampling, tmp_path)
    assert sampler.transformer_calls == 4 and "distilled: 4 steps" in sampler.description
    shots = torch.randn(2, 226, 32, generator=torch.Generator().manual_seed(1))
    levels = torch.tensor([1, 4])
    block_calls[0] = 0
    steps = []
    latents = sampler.latents(shots, levels, torch.Generator().manual_seed(3), on_step=lambda *s: steps.append(s))
    assert block_calls[0] == 4 * len(decoder.transformer.transformer_blocks)  # 4 calls, no unconditional branch
    assert steps == [(1, 4), (2, 4), (3, 4), (4, 4)]
    noise = torch.randn(2, 2, 4, 8, 12, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(latents, fewstep_sample(decoder, shots, levels, sampler.fewstep, noise))
    with pytest.raises(ValueError, match="motion levels"):
        sampler.latents(shots, torch.tensor([0, 9]), torch.Generator())

    cached = PresetSampler.build(decoder, SamplingConfig(**{**vars(sampling), "cache": "faster"}), tmp_path)
    try:
        out = cached.latents(shots, levels, torch.Generator().manual_seed(3))
    finally:
        cached.close()
    assert torch.isfinite(out).all() and out.shape == latents.shape
    with pytest.raises(ValueError, match="decoder_checkpoint"):
        PresetSampler.build(decoder, sampling, "")
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        PresetSampler.build(decoder, sampling, tmp_path / "elsewhere")
    (tmp_path / "stage_c").mkdir()
    with pytest.raises(FileNotFoundError, match="needs a stage \\(d\\) decoder"):
        PresetSampler.build(decoder, sampling, tmp_path / "stage_c")  # a decoder without sampler.json


def test_config_choices():
    cfg = load_config(None, ["sampling.preset=distilled", "sampling.cache=pab"], schema=InferenceConfig)
    assert (cfg.sampling.preset, cfg.sampling.cache) == ("distilled", "pab")
    from animegamer.config import ConfigError
    from animegamer.config.parts import CacheMethod

    assert typing.get_args(CacheMethod) == CACHE_METHODS
    with pytest.raises(ConfigError, match="sampling.cache='mag'"):
        load_config(None, ["sampling.cache=mag"], schema=InferenceConfig)
    with pytest.raises(ConfigError, match="sampling.preset='tiny'"):
        load_config(None, ["sampling.preset=tiny"], schema=InferenceConfig)


def test_renderer_uses_the_preset_and_bad_options_fail_early(decoder, tmp_path):
    from animegamer.game.build import check_render_options
    from animegamer.game.renderer import DecoderRenderer

    FewStepSampler((999, 749, 499, 249)).save(tmp_path / "decoder")  # a step dir: decoder/ inside
    overrides = ["sampling.preset=distilled", f"decoder_checkpoint={tmp_path}", "sampling.height=64",
                 "sampling.width=96", "sampling.num_frames=5"]
    cfg = load_config(None, overrides, schema=InferenceConfig)
    check_render_options(cfg, "cpu")
    renderer = DecoderRenderer(decoder, cfg.sampling, "cpu", sampler=PresetSampler.build(decoder, cfg.sampling,
                                                                                       tmp_path))
    heard = []
    frames = renderer.render(torch.randn(226, 32), 3, seed=0, progress=lambda text, done: heard.append(text))
    assert frames.shape[1:] == (64, 96, 3) and frames.dtype == "uint8"
    assert heard == ["denoising 1/4", "denoising 2/4", "denoising 3/4", "denoising 4/4", "decoding"]
    assert renderer.sampling.steps == 4 and renderer.sampler.fewstep.steps == 4

    bad = {
        f"decoder_checkpoint={tmp_path / 'decoder' / 'none'}": (FileNotFoundError, "not found"),
        "fp8=true": (ValueError, "compile=true"),
        "fp8=true compile=true": (ValueError, "CUDA GPU"),
    }
    (tmp_path / "decoder" / "none").mkdir()
    bad[f"decoder_checkpoint={tmp_path / 'decoder' / 'none'}"] = (FileNotFoundError, "needs a stage \\(d\\)")
    for override, (error, message) in bad.items():
        with pytest.raises(error, match=message):
            check_render_options(load_config(None, [*overrides, *override.split()], schema=InferenceConfig), "cpu")
    with pytest.raises(ValueError, match="offload"):
        check_render_options(load_config(None, ["fp8=true", "compile=true", "offload=sequential"],
                                         schema=InferenceConfig), "cuda")
