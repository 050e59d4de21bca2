"""Reading the release's pickled weight files safely.

The release ships PyTorch pickles (``mp_rank_00_model_states.pt``, ``pytorch_model.bin``). Unpickling can run
arbitrary code, so they are read with ``torch.load(weights_only=True)``: PyTorch's restricted unpickler, which
rebuilds tensors, dicts, lists and plain numbers and refuses every other global. A file that needs anything else
(a hostile or an unexpected file) is refused with one message naming it. Zip-format files are memory-mapped, so a
14 GB agent file costs page cache, not a second copy in RAM.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch
import yaml

from animegamer.io import MAX_RECORD_BYTES, check_regular_file, read_text_bounded
from animegamer.models.weights import MAX_WEIGHTS_BYTES


class ReleaseFileError(ValueError):
    """A release file that is missing, damaged, or holds something other than weights."""


def load_release_pickle(path: str | Path) -> object:
    """The object stored in a release pickle, with tensors on the CPU (memory-mapped when the format allows)."""
    path = Path(path)
    try:  # a pipe would block, a device read without end, a link to itself loop
        check_regular_file(path, MAX_WEIGHTS_BYTES)
    except FileNotFoundError:
        raise ReleaseFileError(f"{path}: file not found") from None
    except ValueError as exc:
        raise ReleaseFileError(str(exc)) from None
    mmap = zipfile.is_zipfile(path)  # the legacy (non-zip) format cannot be memory-mapped
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as exc:
        raise ReleaseFileError(f"{path}: refused, it holds more than weights ({_refusal(exc)[:200]})") from exc
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ReleaseFileError(f"{path}: not a readable PyTorch weights file (damaged or truncated?): {exc}") from exc


def _refusal(exc: pickle.UnpicklingError) -> str:
    """What the restricted unpickler refused, without PyTorch's advice around it: loading the file with
    ``weights_only`` off would run whatever code it holds, which is never what to do with a file that needs it."""
    for line in str(exc).splitlines():
        line = line.strip()
        advice = "weights_only" in line or line.startswith(("Weights only load failed", "Check the documentation"))
        if line and not advice:
            return line
    return "it needs Python objects other than tensors"


def tensor_dict(obj: object, path: str | Path, what: str) -> dict[str, torch.Tensor]:
    """``obj`` checked to be a flat ``{str: Tensor}`` state dict; ``what`` names it in the error message."""
    if not isinstance(obj, dict) or not obj:
        raise ReleaseFileError(f"{path}: expected {what} (a non-empty dict of tensors), got {type(obj).__name__}")
    for key, value in obj.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            raise ReleaseFileError(f"{path}: {what} entry {key!r} is {type(value).__name__}, not a tensor")
    return obj


def read_release_yaml(path: str | Path | None, what: str) -> dict[str, Any]:
    """A release YAML (``what`` names it in messages) as a mapping; ``None``: ``{}`` (the released values apply)."""
    if path is None:
        return {}
    path = Path(path)
    try:
        text = read_text_bounded(path, MAX_RECORD_BYTES)  # never a pipe or a device; UTF-8 or a one-line error
    except FileNotFoundError:
        raise ReleaseFileError(f"{path}: {what} not found") from None
    except ValueError as exc:
        raise ReleaseFileError(str(exc)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ReleaseFileError(f"{path}: not a readable YAML file ({str(exc).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ReleaseFileError(f"{path}: expected a mapping at the top of the {what}")
    return data
