"""FP8 transformer linears through torchao: which layers, refused where it cannot run, and (GPU) close to bf16."""

import pytest
import torch

from animegamer.models.fp8 import fp8_layer_filter, fp8_unavailable, quantize_transformer_fp8
from tests.helpers.decoders import tiny_lora_decoder


def test_layers_and_refusals(tiny_cogvideox_dir):
    decoder = tiny_lora_decoder(tiny_cogvideox_dir)
    names = [n for n, m in decoder.transformer.named_modules() if fp8_layer_filter(m, n)]
    # per block: q, k, v, out (base layers under the LoRA), AdaLN x2, feed-forward x2; never lora_A / lora_B
    blocks = len(decoder.transformer.transformer_blocks)
    assert len(names) == 8 * blocks and all("lora_" not in n for n in names)
    assert "transformer_blocks.0.attn1.to_q.base_layer" in names and "proj_out" not in names
    assert "CUDA GPU" in fp8_unavailable("cpu")
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        quantize_transformer_fp8(decoder)


@pytest.mark.gpu
def test_fp8_turn_is_close_to_bf16(tiny_cogvideox_dir):
    if fp8_unavailable("cuda"):
        pytest.skip(fp8_unavailable("cuda"))
    decoder = tiny_lora_decoder(tiny_cogvideox_dir, dtype="bf16").to("cuda")
    with pytest.raises(RuntimeError, match="merge the LoRA"):
        quantize_transformer_fp8(decoder)
    decoder.merge_lora()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 2, 4, 8, 12, generator=g).cuda()
    shots, levels = torch.randn(2, 226, 32, generator=g).cuda(), torch.tensor([1, 4])
    t = torch.tensor([900, 300]).cuda()
    with torch.no_grad():
        reference = decoder(x, t, shots, levels)
        converted = quantize_transformer_fp8(decoder)
        out = decoder(x, t, shots, levels)
    assert converted == 8 * len(decoder.transformer.transformer_blocks)
    weight = decoder.transformer.transformer_blocks[0].ff.net[2].weight
    assert "float8" in str(getattr(weight, "qdata", weight).dtype)
    assert torch.isfinite(out).all()
    assert float((out - reference).norm() / reference.norm()) < 0.1
