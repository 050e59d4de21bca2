import pytest
import torch

from animegamer.config import EncoderConfig
from animegamer.models.clip_image import CLIPImageFeatures
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.t5_text import T5TextFeatures
from tests.helpers.clips import make_clip_frames

TEXTS = ["Character: Qiqi; Motion: run fast; Background: forest.", "Qiqi sleeps in the bedroom"]


@pytest.fixture(scope="module")
def extractors(tiny_clip_config, tiny_t5_config):
    return CLIPImageFeatures.from_config(tiny_clip_config), T5TextFeatures.from_config(tiny_t5_config)


def test_clip_features_shape_and_determinism(extractors, tiny_clip_config):
    clip, _ = extractors
    frames = torch.from_numpy(make_clip_frames(2, 48, 64)[:, :, :, :]).permute(0, 3, 1, 2)  # (2, 3, H, W)
    a, b = clip(frames), clip(frames)
    assert a.shape == (2, clip.num_tokens, clip.width) == (2, 16, 32)
    assert torch.equal(a, b) and torch.isfinite(a).all()
    # the second-to-last block differs from the last block's output
    out = clip.visual.forward_intermediates(clip.preprocess(frames), indices=[2], intermediates_only=True,
                                           output_fmt="NLC")["image_intermediates"][0]
    assert not torch.allclose(a, out)
    # loading again from disk gives the same numbers
    again = CLIPImageFeatures.from_config(tiny_clip_config)
    assert torch.equal(again(frames), a)


def test_clip_keeps_cls_when_asked(tiny_clip_config):
    from dataclasses import replace

    clip = CLIPImageFeatures.from_config(replace(tiny_clip_config, drop_cls=False))
    out = clip(torch.rand(1, 3, 40, 40))
    assert out.shape == (1, 17, 32)


def test_t5_features_shape_and_determinism(extractors, tiny_t5_config):
    _, t5 = extractors
    a = t5(TEXTS)
    assert a.shape == (2, 226, 32) and torch.isfinite(a).all()
    assert torch.equal(a, t5(TEXTS))
    assert torch.equal(T5TextFeatures.from_config(tiny_t5_config)(TEXTS), a)
    assert not torch.allclose(a[0], a[1])


def test_missing_weights_give_clear_errors(tiny_clip_config, tmp_path):
    from dataclasses import replace

    from animegamer.config import T5Config

    with pytest.raises(FileNotFoundError, match="checkpoints/README.md"):
        CLIPImageFeatures.from_config(replace(tiny_clip_config, checkpoint=str(tmp_path / "none.safetensors")))
    with pytest.raises(FileNotFoundError, match="checkpoints/README.md"):
        T5TextFeatures.from_config(T5Config(path=str(tmp_path / "nope")))


VARIANTS = [(p, f, m) for p in ("mlp", "linear") for f in ("concat", "add", "cross_attn") for m in (True, False)]


@pytest.mark.parametrize("projector, fusion, mixing", VARIANTS)
def test_encoder_variants(extractors, projector, fusion, mixing):
    clip, t5 = extractors
    frames = torch.from_numpy(make_clip_frames(2, 48, 64)).permute(0, 3, 1, 2)
    clip_tokens, text_tokens = clip(frames), t5(TEXTS)
    num_tokens = 226 if (mixing or fusion != "concat") else 226 + 16
    cfg = EncoderConfig(clip_dim=32, clip_tokens=16, text_dim=32, text_tokens=226, hidden_dim=24,
                        num_tokens=num_tokens, projector=projector, fusion=fusion, token_mixing=mixing,
                        cross_attn_heads=4)
    torch.manual_seed(0)
    enc = ActionAwareEncoder.from_config(cfg)
    out = enc(clip_tokens, text_tokens)
    assert out.shape == (2, num_tokens, 24) and torch.isfinite(out).all()
    out.pow(2).mean().backward()
    grads = {n: p.grad for n, p in enc.named_parameters()}
    assert all(g is not None for g in grads.values()), [n for n, g in grads.items() if g is None]
    assert grads["clip_proj.0.weight" if projector == "mlp" else "clip_proj.weight"].abs().sum() > 0
    assert all(p.grad is None for p in clip.parameters()) and all(p.grad is None for p in t5.parameters())
    assert not any(p.requires_grad for p in clip.parameters())


def test_encoder_uses_the_frame():
    torch.manual_seed(0)
    enc = ActionAwareEncoder(clip_dim=8, clip_tokens=4, text_dim=8, text_tokens=6, hidden_dim=16, num_tokens=6)
    text = torch.randn(1, 6, 8)
    with torch.no_grad():
        enc.token_mix.weight.add_(0.1)
    a, b = enc(torch.randn(1, 4, 8), text), enc(torch.randn(1, 4, 8), text)
    assert not torch.allclose(a, b)


def test_encoder_rejects_bad_shapes():
    enc = ActionAwareEncoder(clip_dim=8, clip_tokens=4, text_dim=8, text_tokens=6, hidden_dim=16, num_tokens=6)
    with pytest.raises(ValueError, match="expected 4 CLIP"):
        enc(torch.randn(1, 5, 8), torch.randn(1, 6, 8))
    with pytest.raises(ValueError, match="projector"):
        ActionAwareEncoder(projector="conv")
    with pytest.raises(ValueError, match="num_tokens"):
        ActionAwareEncoder(8, 4, 8, 6, 16, num_tokens=6, token_mixing=False)


def test_token_mixing_starts_near_text_passthrough():
    torch.manual_seed(0)
    enc = ActionAwareEncoder(clip_dim=8, clip_tokens=4, text_dim=8, text_tokens=6, hidden_dim=16, num_tokens=6)
    weight = enc.token_mix.weight.detach()
    assert torch.equal(weight[:, :6], torch.eye(6))
    assert 0 < weight[:, 6:].abs().max() < 0.1
