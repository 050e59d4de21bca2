"""FP8 matmuls for the decoder's transformer through torchao (dynamic scaling): an H100-class GPU option.

    decoder.merge_lora()                  # the LoRA folded into the base weights first
    converted = quantize_transformer_fp8(decoder, granularity="tensor", large_only=True)
    decoder.compile_blocks()              # FP8 pays off only under torch.compile

The chosen ``nn.Linear`` layers of the transformer blocks get float8 e4m3 weights with a scale per tensor (or per
output channel, ``granularity="row"``) and cast their input to float8 on the fly with a scale computed from that very
input (dynamic scaling: no calibration data, nothing to go stale when the shot representation changes); the matmul
runs on the FP8 tensor cores and accumulates in higher precision. ``large_only`` converts the attention projections
and the feed-forward only: the AdaLN modulation linears read the small timestep embedding, where the casts cost more
than the FP8 GEMM saves. The embeddings, the final projection and the VAE stay in bf16. The linear layers are about
a third of a compiled denoising step (attention is another third), so FP8 can cut at most part of that third; eager
FP8 is slower than bf16 (docs/performance.md), which is why the inference option ``fp8`` (per-tensor, large only)
requires ``compile``.

Needs a CUDA GPU of compute capability >= 8.9 (Ada, Hopper) and torchao (``pip install animegamer[fp8]``).
"""

from __future__ import annotations

import torch
from torch import nn

MIN_CAPABILITY = (8, 9)


def fp8_unavailable(device: torch.device | str) -> str:
    """Why FP8 cannot run on ``device`` ("" when it can)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return "fp8 needs a CUDA GPU (compute capability >= 8.9: Ada or Hopper)"
    capability = torch.cuda.get_device_capability(device)
    if capability < MIN_CAPABILITY:
        return f"fp8 needs compute capability >= 8.9; this GPU has {capability[0]}.{capability[1]}"
    try:
        import torchao  # noqa: F401
    except ImportError:
        return "fp8 needs torchao: pip install 'animegamer[fp8]'"
    return ""


def fp8_layer_filter(module: nn.Module, name: str) -> bool:
    """The transformer blocks' linear layers whose sizes the FP8 GEMM takes (multiples of 16); never LoRA's own
    small matrices (an unmerged adapter would keep its bf16 path)."""
    return (
        isinstance(module, nn.Linear)
        and name.startswith("transformer_blocks.")
        and "lora_" not in name
        and module.in_features % 16 == 0
        and module.out_features % 16 == 0
    )


def fp8_large_layer_filter(module: nn.Module, name: str) -> bool:
    """:func:`fp8_layer_filter` without the AdaLN modulation linears (``norm1/norm2.linear``): their input is the
    small timestep embedding, so the cast to float8 and the scaling cost more than the FP8 GEMM saves."""
    return fp8_layer_filter(module, name) and ".norm" not in name


GRANULARITIES = ("row", "tensor")


def quantize_transformer_fp8(decoder, granularity: str = "row", large_only: bool = False) -> int:
    """Swap the decoder's transformer-block linears to FP8 with dynamic scaling in place; returns how many.

    ``granularity``: ``row`` (a scale per output channel / input row) or ``tensor`` (one scale per tensor: fewer
    reductions, the faster kernel under ``torch.compile``, where torchao's FP8 beats bf16; eager it does not).
    ``large_only`` keeps the AdaLN modulation linears in bf16 (:func:`fp8_large_layer_filter`).
    The LoRA must be merged first (:meth:`AnimationShotDecoder.merge_lora`): FP8 weights are not trainable, and an
    unmerged adapter would run beside them in bf16. Raises ValueError for an unknown granularity, RuntimeError where
    FP8 cannot run.
    """
    from peft.tuners.tuners_utils import BaseTunerLayer

    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity={granularity!r} is not one of {GRANULARITIES}")
    problem = fp8_unavailable(decoder.device)
    if problem:
        raise RuntimeError(problem)
    if any(isinstance(m, BaseTunerLayer) and not m.merged for m in decoder.transformer.modules()):
        raise RuntimeError("merge the LoRA before fp8 (merge_lora: true): FP8 weights cannot carry an adapter")
    from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, PerTensor, quantize_

    keep = fp8_large_layer_filter if large_only else fp8_layer_filter
    names = [name for name, module in decoder.transformer.named_modules() if keep(module, name)]
    scale = PerRow() if granularity == "row" else PerTensor()
    quantize_(decoder.transformer, Float8DynamicActivationFloat8WeightConfig(granularity=scale), filter_fn=keep)
    return len(names)
