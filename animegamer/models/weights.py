"""Safe weight files: safetensors everywhere, pickles only with ``weights_only=True``.

A file that exists but cannot be read (truncated by a full disk or an interrupted copy, corrupt) raises
:class:`DamagedFileError` naming it, instead of a library's message that names no file.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from animegamer.io import atomic_path, atomic_write_json, check_regular_file, read_json_bounded

MAX_WEIGHTS_BYTES = 64 << 30  # one weights file (Mistral-7B in one bf16 file is 14.5 GB)
MAX_HEADER_BYTES = 100 << 20  # a safetensors header (safetensors' own limit)


class DamagedFileError(ValueError):
    """A weights file that exists but is truncated or corrupt; the message names the file."""


def check_safetensors(path: str | Path) -> None:
    """Raise :class:`DamagedFileError` unless ``path`` is a complete safetensors file: its header parses and the
    tensors it describes end exactly at the end of the file. Reads only the header, so whole checkpoints are
    checked in milliseconds before any model is built. A path that is not a regular file (a named pipe would
    block, a device read without end, a link to itself), or a file past ``MAX_WEIGHTS_BYTES``, is a one-line
    ``ValueError`` before it is opened."""
    path = Path(path)
    size = check_regular_file(path, MAX_WEIGHTS_BYTES).st_size
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        header_len = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if header_len < 0 or header_len > min(size - 8, MAX_HEADER_BYTES):
            raise DamagedFileError(f"{path}: damaged or truncated safetensors file (no complete header)")
        raw = fh.read(header_len)
    try:
        header = json.loads(raw)
        end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError):
        raise DamagedFileError(f"{path}: damaged safetensors file (unreadable header)") from None
    if 8 + header_len + end != size:
        raise DamagedFileError(
            f"{path}: damaged or truncated safetensors file "
            f"({size} bytes, its header describes {8 + header_len + end})"
        )


def load_state_dict_file(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Load a ``.safetensors`` file, or a torch pickle restricted to tensors (``weights_only=True``).

    ``FileNotFoundError`` for nothing at ``path``; a one-line ``ValueError`` for what is not a regular file or is
    too big (checked before opening), :class:`DamagedFileError` for a damaged file."""
    path = Path(path)
    try:
        check_regular_file(path, MAX_WEIGHTS_BYTES)
    except FileNotFoundError:
        raise FileNotFoundError(f"weights file not found: {path}") from None
    try:
        if path.suffix == ".safetensors":
            check_safetensors(path)
            return load_file(str(path), device=device)
        return torch.load(str(path), map_location=device, weights_only=True)
    except (SafetensorError, RuntimeError, EOFError, pickle.UnpicklingError) as exc:
        lines = str(exc).strip().splitlines()
        raise DamagedFileError(f"{path}: damaged or not a weights file ({lines[0] if lines else exc!r})") from None


def sort_adapter_targets(out_dir: str | Path) -> None:
    """Rewrite ``out_dir/adapter_config.json`` (peft's) with its ``target_modules`` sorted: peft writes a set, in
    an order that changes from run to run with Python's string hashing, so two equal LoRAs' folders would differ."""
    path = Path(out_dir) / "adapter_config.json"
    config = read_json_bounded(path)
    if isinstance(config, dict) and isinstance(config.get("target_modules"), list):
        config["target_modules"] = sorted(config["target_modules"])
        atomic_write_json(path, config)


def save_state_dict_file(
    state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Write safetensors atomically (temp file in the same directory, then rename)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
