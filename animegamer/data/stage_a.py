"""Stage (a)'s data: the precomputed features of each clip (latents, CLIP frame tokens, T5 caption tokens, motion
level) read from ``data.features_dir`` (written by scripts/precompute_features.py, :mod:`animegamer.data.features`).

    dataset, left_out = build_dataset(cfg)      # cfg: StageAConfig; left_out: one line per clip not used
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch.utils.data import Dataset

from animegamer.config import StageAConfig
from animegamer.data.features import motion_level_of, read_skipped
from animegamer.data.manifest import Manifest, read_manifest
from animegamer.data.tensor_store import TensorStore


class StageADataset(Dataset):
    """Precomputed clips: latents (F, C, h, w), clip_tokens (K, Nc, Dc), text_tokens (Nt, Dt), motion_level."""

    def __init__(self, features_dir: str | Path, items: list[tuple[str, int]]):
        if not items:
            raise ValueError(f"no usable clips: nothing in {features_dir} matches the manifest")
        self.features_dir = Path(features_dir)
        self.items = items
        self._store: TensorStore | None = None  # opened lazily: safetensors handles must not cross processes

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._store is None:
            self._store = TensorStore(self.features_dir)
        clip_id, level = self.items[index]
        fields = self._store.load(clip_id, ("latents", "clip_tokens", "text_tokens"))
        return {
            "latents": fields["latents"].permute(1, 0, 2, 3).float(),  # (C, F, h, w) -> (F, C, h, w)
            "clip_tokens": fields["clip_tokens"].float(),
            "text_tokens": fields["text_tokens"].float(),
            "motion_level": torch.tensor(level, dtype=torch.long),
        }


def stage_a_items(manifest: Manifest, features_dir: str | Path) -> tuple[list[tuple[str, int]], list[str]]:
    """(clip_id, motion level) of every clip with features, and one report line per clip left out (by path)."""
    store = TensorStore(features_dir)
    reasons = read_skipped(features_dir)
    items, left_out = [], []
    for record in manifest.records:
        if record.clip_id in store and record.tags:
            items.append((record.clip_id, motion_level_of(record)))
            continue
        why = reasons.get(record.clip_id, {}).get("reason") or (
            "no tags (not captioned)" if not record.tags else "no precomputed features"
        )
        left_out.append(f"{manifest.video_path(record)} ({record.clip_id}): {why}")
    return items, left_out


def build_dataset(cfg: StageAConfig) -> tuple[StageADataset, list[str]]:
    """The stage (a) dataset of ``cfg.data.manifest`` over ``cfg.data.features_dir``, and the clips left out."""
    items, left_out = stage_a_items(read_manifest(cfg.data.manifest), cfg.data.features_dir)
    return StageADataset(cfg.data.features_dir, items), left_out


def select_frame(clip_tokens: torch.Tensor, frame: str) -> torch.Tensor:
    """(B, K, Nc, Dc) -> (B, Nc, Dc): the first frame's tokens, or a random stored frame per sample.

    ``random`` draws from the global RNG of the calling process, which checkpoints save and restore.
    """
    if frame == "first":
        return clip_tokens[:, 0]
    if frame == "random":
        pick = torch.randint(0, clip_tokens.shape[1], (clip_tokens.shape[0],), device=clip_tokens.device)
        return clip_tokens[torch.arange(clip_tokens.shape[0], device=clip_tokens.device), pick]
    raise ValueError(f"frame={frame!r} is not one of ['first', 'random']")
