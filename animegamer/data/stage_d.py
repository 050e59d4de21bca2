"""Stage (d)'s data: the conditions the student is distilled on, the shot representations s_a of stage (c)'s
predictions cache (``conditions``) with each clip's motion level from the manifest; no clips (the teacher makes the
targets).

    dataset, left_out = build_dataset(cfg)      # cfg: StageDConfig; left_out: one line per condition not used
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from animegamer.config import StageDConfig
from animegamer.data.features import motion_level_of
from animegamer.data.manifest import read_manifest
from animegamer.data.tensor_store import TensorStore


class ConditionDataset(Dataset):
    """What the student is distilled on: shot representations (N, H) and motion levels, no clips (the teacher
    makes the targets). ``items`` are (clip id, motion level) pairs of a TensorStore holding ``shot_embeds``."""

    def __init__(self, store_dir: str | Path, items: list[tuple[str, int]]):
        if not items:
            raise ValueError(f"no conditions to distil on in {store_dir}")
        self.store_dir, self.items = Path(store_dir), items
        self._store = None  # opened lazily: safetensors handles must not cross DataLoader worker processes

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._store is None:
            self._store = TensorStore(self.store_dir)
        clip_id, level = self.items[index]
        shot = self._store.load(clip_id, ("shot_embeds",))["shot_embeds"]  # (N, H)
        return {"shot_embeds": shot.float(), "motion_level": torch.tensor(level, dtype=torch.long)}


def build_dataset(cfg: StageDConfig) -> tuple[ConditionDataset, list[str]]:
    """Every s_a of ``conditions`` whose clip the manifest gives a motion level; the others are reported."""
    records = read_manifest(cfg.data.manifest).by_id()
    store_dir = Path(cfg.conditions)
    if not (store_dir / "index.json").is_file():
        raise FileNotFoundError(f"conditions: no TensorStore at {store_dir} (stage (c)'s predictions cache)")
    items, left_out = [], []
    for clip_id in TensorStore(store_dir).clip_ids():
        if clip_id not in records:
            left_out.append(f"{clip_id}: not in {cfg.data.manifest}")
            continue
        record = records[clip_id]
        if record.motion_level is None and not record.tags:
            left_out.append(f"{clip_id}: no motion level (neither measured nor tagged)")
            continue
        items.append((clip_id, motion_level_of(record)))
    return ConditionDataset(store_dir, items), left_out
