"""The compiled fast path: the 4-step student and the small decoder under regional torch.compile give the eager
frames (CPU: a light backend; GPU: inductor), and FP8 per-tensor on the large linears only."""

import pytest
import torch

from animegamer.models.causal_decoder import CausalLatentDecoder
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.fp8 import fp8_large_layer_filter, fp8_layer_filter, fp8_unavailable, quantize_transformer_fp8
from animegamer.sampling.fewstep import FewStepSampler, fewstep_sample
from tests.helpers.decoders import tiny_lora_decoder

pytestmark = pytest.mark.usefixtures("one_thread")
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _student(tiny_cogvideox_dir, dtype="fp32") -> AnimationShotDecoder:
    decoder = tiny_lora_decoder(tiny_cogvideox_dir, dtype)
    decoder.merge_lora()
    return decoder


def _inputs(device="cpu"):
    g = torch.Generator().manual_seed(0)
    noise = torch.randn(2, 2, 4, 8, 12, generator=g)  # (B, F, C, h, w): 5 frames of 64x96
    return noise.to(device), torch.randn(2, 226, 32, generator=g).to(device), torch.tensor([1, 4])


def _small(device="cpu") -> CausalLatentDecoder:
    torch.manual_seed(0)
    return CausalLatentDecoder(4, 8, 4, (16, 16, 8), 2).eval().to(device)


@pytest.fixture
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_student_and_small_decoder_compiled_on_cpu_give_the_eager_frames(tiny_cogvideox_dir, fresh_dynamo):
    student, small = _student(tiny_cogvideox_dir), _small()
    sampler = FewStepSampler((999, 749, 499, 249))
    noise, shots, levels = _inputs()
    with torch.no_grad():
        latents = fewstep_sample(student, shots, levels, sampler, noise)
        frames = small.decode(latents)
        student.compile_blocks(backend="aot_eager", dynamic=False)
        small.compile_blocks(backend="aot_eager", dynamic=False)
        compiled_latents = fewstep_sample(student, shots, levels, sampler, noise)
        compiled_frames = torch.cat(list(small.stream(compiled_latents)), 1)
    assert all(hasattr(b, "_compiled_call_impl") and b._compiled_call_impl is not None for b in small.memory_blocks)
    torch.testing.assert_close(compiled_latents, latents, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_frames, frames, rtol=1e-4, atol=1e-4)


def test_fp8_large_only_keeps_the_adaln_linears_and_granularity_is_checked(tiny_cogvideox_dir):
    student = _student(tiny_cogvideox_dir)
    modules = dict(student.transformer.named_modules())
    every = {n for n, m in modules.items() if fp8_layer_filter(m, n)}
    large = {n for n, m in modules.items() if fp8_large_layer_filter(m, n)}
    blocks = len(student.transformer.transformer_blocks)
    assert len(large) == 6 * blocks and large < every  # q, k, v, out, feed-forward x2
    assert {n.split(".", 2)[2] for n in every - large} == {"norm1.linear", "norm2.linear"}
    with pytest.raises(ValueError, match="granularity='column'"):
        quantize_transformer_fp8(student, granularity="column")


@pytest.mark.gpu
@needs_cuda
# mode="reduce-overhead" (CUDA graphs) does not hold under regional compile: every block replays the same graph, and
# a replay overwrites the output the next block still reads (RuntimeError "accessing tensor output of CUDAGraphs that
# has been overwritten by a subsequent run", H200, torch 2.11)
@pytest.mark.parametrize("mode", ["default"])
def test_inductor_on_cuda_gives_the_eager_frames(tiny_cogvideox_dir, fresh_dynamo, mode):
    student, small = _student(tiny_cogvideox_dir, "bf16").cuda(), _small("cuda").to(torch.bfloat16)
    sampler = FewStepSampler((999, 749, 499, 249))
    noise, shots, levels = _inputs("cuda")
    shots = shots.to(torch.bfloat16)
    with torch.no_grad():
        latents = fewstep_sample(student, shots, levels, sampler, noise)
        frames = small.decode(latents.to(torch.bfloat16)).float()
        student.compile_blocks(mode=mode, dynamic=False)
        small.compile_blocks(mode=mode, dynamic=False)
        for _ in range(2):  # the second call runs the compiled graphs
            compiled = fewstep_sample(student, shots, levels, sampler, noise)
            streamed = torch.cat(list(small.stream(compiled.to(torch.bfloat16))), 1).float()
    assert float((compiled - latents).norm() / latents.norm()) < 0.02
    assert float((streamed - frames).norm() / frames.norm()) < 0.05


@pytest.mark.gpu
@needs_cuda
def test_fp8_per_tensor_on_large_linears_under_compile_is_close_to_bf16(tiny_cogvideox_dir, fresh_dynamo):
    if fp8_unavailable("cuda"):
        pytest.skip(fp8_unavailable("cuda"))
    student = _student(tiny_cogvideox_dir, "bf16").cuda()
    sampler = FewStepSampler((999, 749, 499, 249))
    noise, shots, levels = _inputs("cuda")
    shots = shots.to(torch.bfloat16)
    with torch.no_grad():
        reference = fewstep_sample(student, shots, levels, sampler, noise)
        converted = quantize_transformer_fp8(student, granularity="tensor", large_only=True)
        student.compile_blocks(dynamic=False)
        out = fewstep_sample(student, shots, levels, sampler, noise)
    assert converted == 6 * len(student.transformer.transformer_blocks)
    ff = student.transformer.transformer_blocks[0].ff.net[2].weight
    assert "float8" in str(getattr(ff, "qdata", ff).dtype)
    adaln = student.transformer.transformer_blocks[0].norm1.linear.weight
    assert adaln.dtype == torch.bfloat16 and "float8" not in type(adaln).__name__.lower()
    assert torch.isfinite(out).all() and float((out - reference).norm() / reference.norm()) < 0.1
