"""Counting the host synchronisations of a piece of work without a GPU: the calls that, on CUDA, make the host wait
for the device's queue, recorded as they happen (on a CPU or on a GPU).

    with HostSyncCounter(host=[h.shot_embeds for h in history], device=model.device) as syncs:
        predict_turn(model, history, instruction)
    syncs.count, syncs.events          # 3, [("to host", "tolist", "mllm_turn.py:123"), ...]

What counts (``kind``):

    scalar read     aten._local_scalar_dense, is_nonzero, equal: ``.item()``, ``bool(t)``, ``int(t)``, ``if t:``
    data shape      aten.nonzero, masked_select, unique*: an output whose size depends on the values
    to host         ``.cpu()``, ``.numpy()``, ``.tolist()``, ``.to("cpu")`` of a device tensor
    from host       a blocking copy of host data to the device: ``torch.tensor(data, device=...)`` /
                    ``as_tensor``, ``.to(device)`` / ``.cuda()`` of a host tensor (not ``non_blocking`` from pinned
                    memory, which CUDA queues without waiting; on a CPU run every ``non_blocking`` copy is taken
                    as pinned: there is no memory to pin, the code pins where there is a GPU; not an empty one)

On a CPU every tensor lives on the host, so the counter decides which tensors stand for the host's: the ones made
from Python data without a device (``torch.tensor(ids)``), results of ``.cpu()`` / ``.numpy()`` and of work on host
tensors only, and those named in ``host`` (e.g. the game's history shots, kept on the host between turns). Every
other tensor (weights, activations, whatever was made with ``device=``) stands for device memory; ``.to("cpu")`` of
a host tensor is taken as ``.to(model.device)`` (a copy to the device). On a GPU the tensors' own devices decide,
and ``torch.cuda.set_sync_debug_mode`` gives a second count (``research/mllm_host_overhead.py``).
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

SCALAR_OPS = {"_local_scalar_dense", "is_nonzero", "equal"}
SHAPE_OPS = {"nonzero", "masked_select", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
             "nonzero_static_fallback"}
TO_HOST = {"cpu", "numpy", "tolist"}
FROM_HOST_FACTORIES = {"tensor", "as_tensor"}
_SKIP_DIRS = (str(Path(torch.__file__).parent),)


def _where() -> str:
    """file:line of the innermost caller outside torch and this module."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_SKIP_DIRS) and name != __file__:
            return f"{Path(name).name}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _tensors(values) -> list[torch.Tensor]:
    found = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            found.extend(_tensors(value))
    return found


def _target_device(args, kwargs) -> torch.device | None:
    """The device a ``Tensor.to`` call names, if any."""
    candidates = [kwargs.get("device"), *args[1:2]]
    for value in candidates:
        if isinstance(value, (str, torch.device)):
            return torch.device(value)
        if isinstance(value, torch.Tensor):
            return value.device
    return None


class _TensorSet:
    """Tensors by identity, held weakly (a WeakSet compares tensors by value)."""

    def __init__(self, tensors: Iterable[torch.Tensor] = ()):
        self._refs: dict[int, weakref.ref] = {}
        for tensor in tensors:
            self.add(tensor)

    def add(self, tensor: torch.Tensor) -> None:
        key = id(tensor)
        self._refs[key] = weakref.ref(tensor, lambda _, key=key: self._refs.pop(key, None))

    def __contains__(self, tensor: torch.Tensor) -> bool:
        ref = self._refs.get(id(tensor))
        return ref is not None and ref() is tensor


class HostSyncCounter:
    """Context manager recording every host synchronisation (see the module docstring) of the work inside it."""

    def __init__(self, host: Iterable[torch.Tensor] = (), device: torch.device | str = "cpu"):
        self.events: list[tuple[str, str, str]] = []  # (kind, what, file:line)
        self._host = _TensorSet(host)
        self._modes = (_FunctionMode(self), _DispatchMode(self))
        # the work runs on a CPU: host tensors are the tagged ones (module docstring)
        self.simulated = torch.device(device).type == "cpu"

    @property
    def count(self) -> int:
        return len(self.events)

    def by_kind(self) -> dict[str, int]:
        """Number of events of each kind."""
        counts: dict[str, int] = {}
        for kind, _, _ in self.events:
            counts[kind] = counts.get(kind, 0) + 1
        return counts

    def is_host(self, tensor: torch.Tensor) -> bool:
        if tensor.device.type != "cpu":
            return False
        return tensor in self._host if self.simulated else True

    def record(self, kind: str, what: str) -> None:
        self.events.append((kind, what, _where()))

    def __enter__(self) -> HostSyncCounter:
        self.events = []
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)


class _FunctionMode(TorchFunctionMode):
    """Python-level transfers: ``.cpu()``, ``.tolist()``, ``.to(...)``, ``torch.tensor(..., device=)``."""

    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        counter = self.counter
        result = func(*args, **kwargs)
        inputs = _tensors(args) + _tensors(kwargs.values())
        source = inputs[0] if inputs else None
        if name in TO_HOST and source is not None:
            if not counter.is_host(source):
                counter.record("to host", name)
            if isinstance(result, torch.Tensor):
                counter._host.add(result)
        elif name in ("to", "cuda") and source is not None:
            target = torch.device("cuda") if name == "cuda" else _target_device(args, kwargs)
            moved = isinstance(result, torch.Tensor) and result is not source
            if target is None:  # a dtype-only cast stays where it is
                if counter.is_host(source) and isinstance(result, torch.Tensor):
                    counter._host.add(result)
            elif counter.is_host(source) and (target.type != "cpu" or counter.simulated):
                # to the device (on a CPU run, ``.to(cpu)`` of a host tensor is taken as ``.to(model.device)``)
                # non-blocking from pinned memory does not wait; on a CPU run (no memory to pin) a non-blocking
                # copy is taken as one (the code pins it where there is a GPU)
                if not (kwargs.get("non_blocking") and (counter.simulated or _pinned(source))) and source.numel():
                    counter.record("from host", name)
            elif target.type == "cpu" and not counter.simulated and not counter.is_host(source):
                counter.record("to host", "to(cpu)")
                if moved:
                    counter._host.add(result)
        elif name in FROM_HOST_FACTORIES and isinstance(result, torch.Tensor):
            data = args[0] if args else kwargs.get("data")
            from_device_tensor = isinstance(data, torch.Tensor) and not counter.is_host(data)
            if kwargs.get("device") is None and not from_device_tensor:
                counter._host.add(result)
            elif not from_device_tensor and (counter.simulated or result.device.type != "cpu") and result.numel():
                counter.record("from host", name)  # (an empty copy does not wait)
        elif inputs and isinstance(result, torch.Tensor) and all(counter.is_host(t) for t in inputs):
            counter._host.add(result)  # work on host tensors stays on the host
        return result


def _pinned(tensor: torch.Tensor) -> bool:
    try:
        return tensor.is_pinned()
    except RuntimeError:  # no accelerator to pin for
        return False


class _DispatchMode(TorchDispatchMode):
    """Operator-level syncs: scalar reads and data-dependent output shapes of device tensors."""

    def __init__(self, counter: HostSyncCounter):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name in SCALAR_OPS or name in SHAPE_OPS:
            inputs = _tensors(args) + _tensors(kwargs.values())
            if inputs and not all(self.counter.is_host(t) for t in inputs):
                self.counter.record("scalar read" if name in SCALAR_OPS else "data shape", name)
        return func(*args, **kwargs)


def cuda_sync_warnings(fn: Callable[[], object]) -> list[str]:
    """file:line of every synchronizing CUDA call ``fn`` makes (``torch.cuda.set_sync_debug_mode("warn")``)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return [f"{Path(w.filename).name}:{w.lineno}" for w in caught if "synchroniz" in str(w.message)]
