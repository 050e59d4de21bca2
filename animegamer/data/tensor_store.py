"""A directory of safetensors shards keyed by clip id: precomputed features and cached shot targets.

    store/index.json                {"clip_id": "shard_00000.safetensors", ...}
    store/shard_00000.safetensors   tensors named "<clip_id>/<field>"

Writes are atomic per shard and the index is rewritten atomically after each shard, so an interrupted
precompute resumes from the clips it has not written yet.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import safe_open

from animegamer.io import atomic_write_json
from animegamer.models.weights import save_state_dict_file

INDEX = "index.json"


class TensorStore:
    """Read and append per-clip tensors. ``fields`` of a clip come back as a dict of CPU tensors."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        index_file = self.root / INDEX
        self.index: dict[str, str] = json.loads(index_file.read_text()) if index_file.is_file() else {}
        self._handles: dict[str, object] = {}

    def __contains__(self, clip_id: str) -> bool:
        return clip_id in self.index

    def __len__(self) -> int:
        return len(self.index)

    def clip_ids(self) -> list[str]:
        return list(self.index)

    def load(self, clip_id: str, fields: tuple[str, ...] | None = None,
             optional: tuple[str, ...] = ()) -> dict[str, torch.Tensor]:
        """A clip's tensors: all of them, or ``fields`` (each must be there) plus those of ``optional`` it has."""
        if clip_id not in self.index:
            raise KeyError(f"{clip_id!r} is not in the store at {self.root}")
        shard = self.index[clip_id]
        handle = self._handles.get(shard)
        if handle is None:
            handle = safe_open(str(self.root / shard), framework="pt", device="cpu")
            self._handles[shard] = handle
        prefix = f"{clip_id}/"
        names = [k for k in handle.keys() if k.startswith(prefix)]
        out = {k[len(prefix) :]: handle.get_tensor(k) for k in names}
        if fields is not None:
            missing = [f for f in fields if f not in out]
            if missing:
                raise KeyError(f"{clip_id!r} has no {missing} in {self.root}")
            out = {f: out[f] for f in (*fields, *optional) if f in out}
        return out

    def write_shard(self, items: dict[str, dict[str, torch.Tensor]]) -> Path | None:
        """Append one shard holding ``{clip_id: {field: tensor}}``; returns its path (None if empty)."""
        if not items:
            return None
        self.root.mkdir(parents=True, exist_ok=True)
        number = len({*self.index.values()})
        while (self.root / f"shard_{number:05d}.safetensors").exists():
            number += 1
        name = f"shard_{number:05d}.safetensors"
        flat = {f"{cid}/{field}": t for cid, fields in items.items() for field, t in fields.items()}
        save_state_dict_file(flat, self.root / name)
        self.index.update({cid: name for cid in items})
        atomic_write_json(self.root / INDEX, self.index)
        self._handles.pop(name, None)
        return self.root / name
