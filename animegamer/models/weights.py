"""Safe weight files: safetensors everywhere, pickles only with ``weights_only=True``."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from animegamer.io import atomic_path


def load_state_dict_file(path: str | Path, device: str = "cpu") -> dict[str, torch.Tensor]:
    """Load a ``.safetensors`` file, or a torch pickle restricted to tensors (``weights_only=True``)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"weights file not found: {path}")
    if path.suffix == ".safetensors":
        return load_file(str(path), device=device)
    return torch.load(str(path), map_location=device, weights_only=True)


def save_state_dict_file(
    state: dict[str, torch.Tensor], path: str | Path, metadata: dict[str, str] | None = None
) -> None:
    """Write safetensors atomically (temp file in the same directory, then rename)."""
    tensors = {k: v.detach().contiguous().cpu() for k, v in state.items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
