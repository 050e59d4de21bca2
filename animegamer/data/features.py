"""Precomputed stage (a) features, the stage (a) dataset, and the cached shot targets for stage (b).

    features_dir/ (a TensorStore, one entry per captioned clip)
        latents      (C, F, h, w) float32   scaled VAE posterior mean of the clip's first ``num_frames`` frames
        clip_tokens  (K, Nc, Dc)            CLIP tokens of K evenly spaced frames; index 0 is the first frame
        text_tokens  (226, Dt)              T5 tokens of the motion text, ``ShotTags.motion_text()``
        features_meta.json                  the settings the features were computed with (checked on resume)
        skipped.json                        clips left out and why (missing/corrupt video, too short, no tags)

    <stage a output_dir>/shot_targets/ (a TensorStore)
        shot_embeds  (N, H) float32         s_a of the trained encoder from the first frame + motion text

Precomputation is resumable: clips already in the store are skipped, and so are clips listed in skipped.json
(unless ``retry_skipped``). A bad clip never stops the run; it is reported by path and listed.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from animegamer.config import DataConfig, StageAConfig
from animegamer.data.manifest import ClipRecord, read_manifest
from animegamer.data.name_swaps import (
    SWAP_NAMES_FIELD,
    SWAP_SHOT_FIELD,
    SWAP_TEXT_FIELD,
    names_tensor,
    rename,
    swap_pairs,
)
from animegamer.data.tensor_store import TensorStore
from animegamer.data.video import VideoReadError, read_video
from animegamer.io import atomic_write_json
from animegamer.models.clip_image import CLIPImageFeatures
from animegamer.models.t5_text import T5TextFeatures
from animegamer.models.vae import load_vae, vae_encode

META_FILE = "features_meta.json"
SKIPPED_FILE = "skipped.json"
SOURCE_FILE = "source.json"
FEATURE_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
# A clip may be this many frames short of ``num_frames`` (one latent frame's worth); the last frame is repeated.
# 2 s at 8 fps gives 16 frames where the VAE wants 17 (4k + 1).
MAX_PAD_FRAMES = 4


# --------------------------------------------------------------------------------------------
# Frames
# --------------------------------------------------------------------------------------------


def fit_frames(frames: np.ndarray, num_frames: int, height: int, width: int) -> torch.Tensor:
    """(T, H', W', 3) uint8 -> (num_frames, height, width, 3) uint8: resize to cover, centre crop, pad the end.

    Raises ValueError when the clip is more than :data:`MAX_PAD_FRAMES` frames short.
    """
    if len(frames) + MAX_PAD_FRAMES < num_frames:
        raise ValueError(f"too short: {len(frames)} frames, need {num_frames}")
    x = torch.from_numpy(np.ascontiguousarray(frames[:num_frames])).permute(0, 3, 1, 2).float()  # (T, 3, H', W')
    h, w = x.shape[-2:]
    if (h, w) != (height, width):
        scale = max(height / h, width / w)
        new_h, new_w = max(height, round(h * scale)), max(width, round(w * scale))
        x = F.interpolate(x, size=(new_h, new_w), mode="bilinear", align_corners=False, antialias=True)
        top, left = (new_h - height) // 2, (new_w - width) // 2
        x = x[..., top : top + height, left : left + width]
    if len(x) < num_frames:
        x = torch.cat([x, x[-1:].expand(num_frames - len(x), -1, -1, -1)])
    return x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).contiguous()  # (T, H, W, 3)


def clip_frame_indices(num_frames: int, k: int) -> list[int]:
    """K evenly spaced frame indices, the first always 0 (the first frame, as in the paper)."""
    return np.round(np.linspace(0, num_frames - 1, k)).astype(int).tolist() if k > 1 else [0]


def motion_level_of(record: ClipRecord) -> int:
    """The clip's motion level: the flow-based value from the manifest, else the captioned ``<ML>`` tag."""
    if record.motion_level is not None:
        return record.motion_level
    return record.shot_tags().values.motion_level


# --------------------------------------------------------------------------------------------
# Precompute
# --------------------------------------------------------------------------------------------


def feature_settings(cfg: StageAConfig) -> dict:
    """What the stored features depend on. Paths are recorded; only shape/meaning-defining keys are compared
    (identity swaps only when asked for: features without them serve a run that asks for none)."""
    swaps = {"identity_swaps": cfg.data.identity_swaps} if cfg.data.identity_swaps else {}
    return {
        "compare": {
            **swaps,
            "clip_arch": cfg.clip.arch,
            "clip_image_size": cfg.clip.image_size,
            "clip_layer": cfg.clip.layer,
            "clip_drop_cls": cfg.clip.drop_cls,
            "t5_max_length": cfg.t5.max_length,
            "height": cfg.data.height,
            "width": cfg.data.width,
            "num_frames": cfg.data.num_frames,
            "fps": cfg.data.fps,
            "clip_frames": cfg.data.clip_frames,
        },
        "paths": {"clip": cfg.clip.checkpoint, "t5": cfg.t5.path, "vae": cfg.decoder.pretrained},
    }


def _check_settings(root: Path, settings: dict) -> None:
    meta = root / META_FILE
    if not meta.is_file():
        return
    old = json.loads(meta.read_text()).get("compare", {})
    diff = {k: (old.get(k), v) for k, v in settings["compare"].items() if old.get(k) != v}
    if diff:
        changes = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in diff.items())
        raise ValueError(
            f"features in {root} were computed with other settings ({changes}); "
            f"delete that directory or set data.features_dir to a new one"
        )


def read_skipped(features_dir: str | Path) -> dict[str, dict]:
    """``{clip_id: {"video": path, "reason": text}}`` of clips precomputation left out."""
    path = Path(features_dir) / SKIPPED_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


@dataclass
class PrecomputeSummary:
    written: int = 0
    present: int = 0
    skipped: dict[str, dict] = field(default_factory=dict)  # clip_id -> {"video", "reason"}

    def __str__(self) -> str:
        skipped = f", {len(self.skipped)} skipped (listed in {SKIPPED_FILE})" if self.skipped else ""
        return f"features: {self.written} written, {self.present} already present{skipped}"


class FeatureExtractor:
    """VAE latents, CLIP tokens and T5 tokens of one clip, with the frozen models of a stage (a) config."""

    def __init__(self, cfg: StageAConfig, device: str | torch.device = "cpu"):
        on_gpu = torch.device(device).type == "cuda"
        text_dtype = torch.bfloat16 if on_gpu else torch.float32  # T5-XXL is 19 GB in fp32
        self.cfg, self.device = cfg, torch.device(device)
        self.vae = load_vae(cfg.decoder, device)
        self.clip = CLIPImageFeatures.from_config(cfg.clip).to(device)
        self.t5 = T5TextFeatures.from_config(cfg.t5, dtype=text_dtype).to(device)
        self.store_dtype = FEATURE_DTYPES[cfg.data.feature_dtype]

    @torch.no_grad()
    def __call__(self, frames: torch.Tensor, motion_text: str, swaps: Sequence[tuple[str, str]] = ()
                 ) -> dict[str, torch.Tensor]:
        """frames (T, H, W, 3) uint8 at the configured size -> the stored fields of one clip; ``swaps``: its
        identity swaps' (old, new) names (:func:`~animegamer.data.name_swaps.swap_pairs`; their texts' T5 tokens
        stored as ``swap_text_tokens`` (S, 226, Dt) and the names as ``swap_names`` when there are any)."""

        latents = vae_encode(self.vae, frames[None])[0]  # (F, C, h, w)
        picks = clip_frame_indices(len(frames), self.cfg.data.clip_frames)
        clip_tokens = self.clip(frames[picks].permute(0, 3, 1, 2).to(self.device))  # (K, Nc, Dc)
        text_tokens = self.t5([motion_text, *(rename(motion_text, old, new) for old, new in swaps)])  # (1 + S, ...)
        out = {
            "latents": latents.permute(1, 0, 2, 3).float().cpu().contiguous(),  # (C, F, h, w)
            "clip_tokens": clip_tokens.to(self.store_dtype).cpu().contiguous(),
            "text_tokens": text_tokens[0].to(self.store_dtype).cpu().contiguous(),
        }
        if swaps:
            out[SWAP_TEXT_FIELD] = text_tokens[1:].to(self.store_dtype).cpu().contiguous()
            out[SWAP_NAMES_FIELD] = names_tensor(swaps)
        return out


def count_pending_clips(data: DataConfig) -> int:
    """Clips of the manifest neither in the feature store nor listed as skipped (precomputation still to do)."""
    store, skipped = TensorStore(data.features_dir), read_skipped(data.features_dir)
    return sum(r.clip_id not in store and r.clip_id not in skipped for r in read_manifest(data.manifest).records)


def precompute_features(
    cfg: StageAConfig,
    device: str | torch.device = "cpu",
    retry_skipped: bool = False,
    shard_size: int = 32,
    progress: bool = True,
) -> PrecomputeSummary:
    """Fill ``cfg.data.features_dir`` for every captioned clip of ``cfg.data.manifest`` not yet in it."""
    if cfg.data.feature_dtype not in FEATURE_DTYPES:
        raise ValueError(f"data.feature_dtype={cfg.data.feature_dtype!r} is not one of {sorted(FEATURE_DTYPES)}")
    manifest = read_manifest(cfg.data.manifest)
    root = Path(cfg.data.features_dir)
    settings = feature_settings(cfg)
    _check_settings(root, settings)
    store = TensorStore(root)
    skipped = {} if retry_skipped else read_skipped(root)
    summary = PrecomputeSummary(present=sum(r.clip_id in store for r in manifest.records))
    todo = [r for r in manifest.records if r.clip_id not in store and r.clip_id not in skipped]

    def skip(record: ClipRecord, reason: str) -> None:
        video = str(manifest.video_path(record))
        reason = reason.removeprefix(f"{video}: ")  # VideoReadError names the file already
        skipped[record.clip_id] = {"video": video, "reason": reason}
        tqdm.write(f"skipped {video} ({record.clip_id}): {reason}")

    # identity swaps name the manifest's characters (its clips' subjects) in place of those a caption names
    names = sorted({tags.subject for r in manifest.records if r.tags and (tags := r.shot_tags()) is not None})
    extractor = None
    pending: dict[str, dict[str, torch.Tensor]] = {}
    for record in tqdm(todo, desc="precompute features", unit="clip", disable=not progress or not todo):
        if not record.tags:
            skip(record, "no tags (not captioned)")
            continue
        try:
            frames, _ = read_video(manifest.video_path(record), fps=cfg.data.fps)
            frames = fit_frames(frames, cfg.data.num_frames, cfg.data.height, cfg.data.width)
        except (VideoReadError, ValueError) as exc:
            skip(record, str(exc))
            continue
        if extractor is None:
            root.mkdir(parents=True, exist_ok=True)
            atomic_write_json(root / META_FILE, settings)
            extractor = FeatureExtractor(cfg, device)
        tags = record.shot_tags()
        swaps = swap_pairs(tags.motion_text(), tags.subject, names, cfg.data.identity_swaps) \
            if cfg.data.identity_swaps else []
        pending[record.clip_id] = extractor(frames, tags.motion_text(), swaps)
        summary.written += 1
        if len(pending) >= shard_size:
            store.write_shard(pending)
            pending = {}
    store.write_shard(pending)
    summary.skipped = {cid: v for cid, v in skipped.items() if cid not in store}
    if summary.skipped or (root / SKIPPED_FILE).is_file():
        atomic_write_json(root / SKIPPED_FILE, summary.skipped)
    return summary


# --------------------------------------------------------------------------------------------
# Shot targets for stage (b)
# --------------------------------------------------------------------------------------------


@torch.no_grad()
def write_shot_targets(
    encoder: torch.nn.Module,
    features_dir: str | Path,
    out_dir: str | Path,
    source: dict | None = None,
    batch_size: int = 16,
    device: str | torch.device = "cpu",
    progress: bool = True,
) -> Path:
    """s_a (N, H) float32 of every clip in ``features_dir``, from its first frame + motion text, as a TensorStore;
    a clip whose features hold identity swaps' text tokens also gets their shots, (S, N, H) ``swap_shots``
    (:mod:`animegamer.data.name_swaps`).

    Built in ``<out_dir>.tmp`` and swapped in when complete, so a reader never sees targets of two encoders.
    ``source`` (e.g. the checkpoint path and step) is written to ``source.json`` beside them.
    """
    features = TensorStore(features_dir)
    clip_ids = features.clip_ids()
    if not clip_ids:
        raise ValueError(f"no precomputed features in {features_dir}")
    out, tmp = Path(out_dir), Path(f"{out_dir}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    targets = TensorStore(tmp)
    was_training = encoder.training
    encoder.eval()
    for start in tqdm(range(0, len(clip_ids), batch_size), desc="shot targets", disable=not progress):
        ids = clip_ids[start : start + batch_size]
        rows = [features.load(cid, ("clip_tokens", "text_tokens"), optional=(SWAP_TEXT_FIELD, SWAP_NAMES_FIELD))
                for cid in ids]
        clip_tokens = torch.stack([r["clip_tokens"][0] for r in rows]).float().to(device)  # (B, Nc, Dc), first frame
        text_tokens = torch.stack([r["text_tokens"] for r in rows]).float().to(device)  # (B, Nt, Dt)
        shots = encoder(clip_tokens, text_tokens).float().cpu()  # (B, N, H)
        shard = {cid: {"shot_embeds": shot.contiguous()} for cid, shot in zip(ids, shots, strict=True)}
        swapped = [(i, r[SWAP_TEXT_FIELD]) for i, r in enumerate(rows) if len(r.get(SWAP_TEXT_FIELD, ()))]
        if swapped:  # identity swaps: the same first frame with another friend named (data.name_swaps)
            frames = torch.cat([clip_tokens[i : i + 1].expand(len(t), -1, -1) for i, t in swapped])
            swap_shots = encoder(frames, torch.cat([t for _, t in swapped]).float().to(device)).float().cpu()
            for (i, _), part in zip(swapped, swap_shots.split([len(t) for _, t in swapped]), strict=True):
                shard[ids[i]][SWAP_SHOT_FIELD] = part.contiguous()  # (S, N, H)
                if SWAP_NAMES_FIELD in rows[i]:  # who each swap names for whom (older features lack it)
                    shard[ids[i]][SWAP_NAMES_FIELD] = rows[i][SWAP_NAMES_FIELD]
        targets.write_shard(shard)
    encoder.train(was_training)
    atomic_write_json(tmp / SOURCE_FILE, {"features_dir": str(features_dir), **(source or {})})
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    return out
