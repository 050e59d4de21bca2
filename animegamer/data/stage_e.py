"""Stage (e) data: the frozen VAE's latents of each clip (the stage (a) feature store) paired with its real frames.

    item = {"latents": (F, C, h, w) float32   the stored posterior mean, scaled as the transformer sees it
            "frames":  (T, H, W, 3) uint8     the clip read again and fitted exactly as precomputation fitted it}

The clips are the captioned clips of ``data.split`` (by film or in time, as every stage splits). The latents come
from ``data.features_dir`` (scripts/precompute_features.py or stage (a)'s first run), so the VAE is never loaded; the
frames from the manifest's video, resampled to ``data.fps`` and fitted to ``data.num_frames`` x
``data.height`` x ``data.width`` (:func:`animegamer.data.features.fit_frames`). The store's recorded settings must be
these, or a latent would be paired with other frames than the ones it encodes.

Without such a store, :func:`precompute_latents` writes a latents-only one (``latents`` of each clip, and a meta
marked ``latents_only``) with the VAE of a CogVideoX folder: stage (e) can then train on any VAE, e.g. the one of a
shipped checkpoint, without the CLIP and T5 features stage (a) needs. A stage (a) store is never written to.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from animegamer.config import DataConfig, DecoderConfig, StageEConfig
from animegamer.data.features import META_FILE, SKIPPED_FILE, fit_frames, read_skipped
from animegamer.data.manifest import Manifest, read_manifest
from animegamer.data.sequences import build_windows
from animegamer.data.tensor_store import TensorStore
from animegamer.data.video import VideoReadError, read_video
from animegamer.io import atomic_write_json
from animegamer.models.vae import load_vae, vae_encode

PAIRED_SETTINGS = ("height", "width", "num_frames", "fps")
LATENTS_ONLY = "latents_only"  # the meta key of a store precompute_latents wrote


def check_feature_settings(data: DataConfig) -> None:
    """ValueError unless ``data.features_dir`` was computed at this config's clip size, length and rate."""
    meta = Path(data.features_dir) / META_FILE
    if not meta.is_file():
        raise FileNotFoundError(f"no precomputed latents at {data.features_dir} ({META_FILE} is missing): run "
                                "scripts/train_stage_e.py in one process first (it encodes them)")
    try:
        saved = json.loads(meta.read_text()).get("compare", {})
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
        raise ValueError(f"{meta}: not valid JSON ({exc})") from None
    differ = [f"{k}: {saved.get(k)!r} stored, {getattr(data, k)!r} here" for k in PAIRED_SETTINGS
              if saved.get(k) != getattr(data, k)]
    if differ:
        raise ValueError(f"{meta}: the latents were computed with other clip settings ({'; '.join(differ)}); set "
                         "data.height/width/num_frames/fps to the stored ones")


class StageEDataset(Dataset):
    """Latents + real frames of the listed clips (``items``: clip id, video path)."""

    def __init__(self, data: DataConfig, items: list[tuple[str, Path]]):
        if not items:
            raise ValueError(f"no usable clips: nothing in {data.features_dir} matches {data.manifest}")
        self.data, self.items = data, items
        self._store: TensorStore | None = None  # opened lazily: safetensors handles must not cross processes

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._store is None:
            self._store = TensorStore(self.data.features_dir)
        clip_id, video = self.items[index]
        latents = self._store.load(clip_id, ("latents",))["latents"].permute(1, 0, 2, 3).float()  # (F, C, h, w)
        frames, _ = read_video(video, fps=self.data.fps)
        frames = fit_frames(frames, self.data.num_frames, self.data.height, self.data.width)  # (T, H, W, 3) uint8
        return {"latents": latents, "frames": frames}


def stage_e_items(manifest: Manifest, data: DataConfig) -> tuple[list[tuple[str, Path]], list[str]]:
    """(clip id, video) of every captioned clip of ``data.split`` (the stages' film or time split) with stored latents
    and a video file, and one line per clip left out."""
    store = TensorStore(data.features_dir)
    reasons = read_skipped(data.features_dir)
    windows = build_windows(manifest, history_turns=0, split=data.split, test_fraction=data.test_fraction,
                            split_by=data.split_by)
    records = manifest.by_id()
    items, left_out = [], []
    for record in (records[w.current] for w in windows):
        video = manifest.video_path(record)
        if record.clip_id not in store:
            why = reasons.get(record.clip_id, {}).get("reason", "no precomputed latents")
            left_out.append(f"{video} ({record.clip_id}): {why}")
        elif not Path(video).is_file():
            left_out.append(f"{video} ({record.clip_id}): video file not found")
        else:
            items.append((record.clip_id, Path(video)))
    return items, left_out


def build_dataset(cfg: StageEConfig) -> tuple[StageEDataset, list[str]]:
    """The stage (e) dataset of ``cfg.data.manifest`` over ``cfg.data.features_dir``, and the clips left out. The
    first clip is read once here, so an unreadable video or a latent/frame mismatch fails before any model is
    built."""
    data = cfg.data
    check_feature_settings(data)
    items, left_out = stage_e_items(read_manifest(data.manifest), data)
    dataset = StageEDataset(data, items)
    try:
        dataset[0]
    except (VideoReadError, ValueError) as exc:
        raise ValueError(f"{items[0][1]}: {exc}") from None
    return dataset, left_out


def precompute_latents(data: DataConfig, vae_dir: str | Path, device: str | torch.device = "cpu", batch: int = 16,
                       progress: bool = True) -> int:
    """Encode the clips of ``data.split`` that ``data.features_dir`` lacks with the VAE of ``vae_dir``; returns how
    many were written. Only a latents-only store (or none yet) is filled: a stage (a) store is left to stage (a)'s
    precomputation, which writes every field. Unreadable clips are listed in skipped.json."""
    root = Path(data.features_dir)
    meta = root / META_FILE
    settings = {"compare": {k: getattr(data, k) for k in PAIRED_SETTINGS}, "paths": {"vae": str(vae_dir)},
                LATENTS_ONLY: True}
    if meta.is_file():
        try:
            latents_only = json.loads(meta.read_text()).get(LATENTS_ONLY, False)
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as exc:
            raise ValueError(f"{meta}: not valid JSON ({exc})") from None
        if not latents_only:
            return 0
        check_feature_settings(data)
    manifest = read_manifest(data.manifest)
    store, skipped = TensorStore(root), read_skipped(root)
    windows = build_windows(manifest, history_turns=0, split=data.split, test_fraction=data.test_fraction,
                            split_by=data.split_by)
    records = manifest.by_id()
    todo = [records[w.current] for w in windows if w.current not in store and w.current not in skipped]
    if not todo:
        return 0
    root.mkdir(parents=True, exist_ok=True)
    atomic_write_json(meta, settings)
    vae = load_vae(DecoderConfig(pretrained=str(vae_dir), dtype="fp32"), device)
    written = 0
    for start in tqdm(range(0, len(todo), batch), desc="latents", unit="batch", disable=not progress):
        clips, frames = [], []
        for record in todo[start : start + batch]:
            video = manifest.video_path(record)
            try:
                raw, _ = read_video(video, fps=data.fps)
                frames.append(fit_frames(raw, data.num_frames, data.height, data.width))
                clips.append(record.clip_id)
            except (VideoReadError, ValueError) as exc:
                skipped[record.clip_id] = {"video": str(video), "reason": str(exc).removeprefix(f"{video}: ")}
        if clips:
            latents = vae_encode(vae, torch.stack(frames))  # (B, F, C, h, w)
            store.write_shard({c: {"latents": latents[i].permute(1, 0, 2, 3).contiguous()}  # (C, F, h, w)
                               for i, c in enumerate(clips)})
            written += len(clips)
    if skipped:
        atomic_write_json(root / SKIPPED_FILE, skipped)
    return written
