"""Measuring: wall time after warm-up, peak memory, the device's matmul peak, and model FLOPs.

    timing = measure(fn, device, warmup=2, repeats=5)       # Timing(seconds=[...]); .median, .best
    with PeakMemory(device) as mem: fn()                     # mem.peak_gb: peak allocated (GPU) or peak RSS (CPU)
    peak = matmul_peak_flops(device, torch.bfloat16, 8192)   # FLOP/s of one n^3 matmul, best of a few
    flops = count_flops(lambda: model(x))                    # FLOPs of one call (matmuls, convolutions, SDPA)

On a GPU every timed call is bracketed by CUDA events and followed by a synchronize, so queued kernels are counted
where they run; on a CPU ``time.perf_counter`` brackets the call. Warm-up calls (compilation, allocator growth,
cuDNN autotuning) are never timed.
"""

from __future__ import annotations

import os
import resource
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

GB = 1024**3


@dataclass
class Timing:
    """Seconds of each timed call."""

    seconds: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def best(self) -> float:
        return min(self.seconds)


def synchronize(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device | str) -> float:
    """Seconds one call of ``fn`` takes on ``device`` (everything it queued included)."""
    if torch.device(device).type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        synchronize(device)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1000.0
    began = time.perf_counter()
    fn()
    return time.perf_counter() - began


def measure(fn: Callable[[], object], device: torch.device | str, warmup: int = 2, repeats: int = 5) -> Timing:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times timed."""
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    for _ in range(warmup):
        fn()
    synchronize(device)
    return Timing([time_call(fn, device) for _ in range(repeats)])


def _rss_bytes() -> int:
    """Resident set size of this process now (Linux /proc), else its peak so far (getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class PeakMemory:
    """Peak memory of the block: GPU memory allocated by torch on CUDA, process RSS on the CPU.

    On CUDA the allocator's peak counter is reset on entry. A process's RSS has no resettable peak, so on the CPU a
    thread samples it every ``interval`` seconds while the block runs (a peak shorter than that can be missed).
    """

    def __init__(self, device: torch.device | str, interval: float = 0.002):
        self.device = torch.device(device)
        self.interval = interval
        self.peak_bytes = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.peak_bytes = _rss_bytes()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak_bytes = max(self.peak_bytes, _rss_bytes())

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            assert self._thread is not None
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes, _rss_bytes())

    @property
    def peak_gb(self) -> float:
        return self.peak_bytes / GB


def matmul_peak_flops(device: torch.device | str, dtype: torch.dtype, size: int, repeats: int = 10) -> float:
    """FLOP/s of a (size x size) @ (size x size) matmul in ``dtype``: 2 size^3 FLOPs over the best of ``repeats``.

    The denominator of every MFU in the report, measured in the same run on the same device (bf16 8192^3 on a GPU;
    fp32 at a smaller size on a CPU, where bf16 matmuls are not what the models run).
    """
    g = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    b = torch.randn(size, size, device=device, dtype=dtype, generator=g)
    timing = measure(lambda: torch.mm(a, b), device, warmup=3, repeats=repeats)
    return 2 * size**3 / timing.best


_CPU_SDPA_REGISTERED = False


def _register_cpu_sdpa_flops() -> None:
    """torch's FLOP counter knows the CUDA attention kernels but not the CPU one; count it with the same formula."""
    global _CPU_SDPA_REGISTERED
    from torch.utils import flop_counter

    op = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if _CPU_SDPA_REGISTERED or op is None or op in flop_counter.flop_registry:
        _CPU_SDPA_REGISTERED = True
        return
    cuda_formula = flop_counter.flop_registry[torch.ops.aten._scaled_dot_product_flash_attention]
    flop_counter.register_flop_formula(op, get_raw=True)(cuda_formula)
    _CPU_SDPA_REGISTERED = True


def count_flops(fn: Callable[[], object]) -> int:
    """FLOPs of one call of ``fn`` as torch's FlopCounterMode counts them (matmuls, convolutions, attention as full
    non-causal S x S products); elementwise work is not counted."""
    from torch.utils.flop_counter import FlopCounterMode

    _register_cpu_sdpa_flops()
    with FlopCounterMode(display=False) as counter:
        fn()
    return int(counter.get_total_flops())


def mllm_training_flops(tokenwise_params: int, num_layers: int, attention_width: int, row_lengths: list[int]) -> int:
    """Model FLOPs of one training step of a decoder-only LM (the nanoGPT / PaLM convention).

    ``6 N`` per token for the matmuls every token goes through (forward + backward), plus ``12 L d S`` per token
    for attention scores and values over a row of S tokens (counted as if non-causal); ``d`` = query heads x head
    width. Recomputation under gradient checkpointing is not model FLOPs and is not counted.
    """
    tokens = sum(row_lengths)
    return 6 * tokenwise_params * tokens + 12 * num_layers * attention_width * sum(s * s for s in row_lengths)


def device_name(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine()
