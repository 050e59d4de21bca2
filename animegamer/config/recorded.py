"""What a trained MLLM checkpoint records about its training, read back at inference: the MLLM's shape and the
history length K it was trained with, so that an inference config does not restate them (and cannot drift from
them).

A stage (b) run writes its resolved config beside its checkpoints (``<run>/config.yaml``, the run directory of
``<run>/checkpoints/step_N`` or ``<run>/checkpoints/latest``); the SpriteWorld chain ships it as
``<ship>/configs/stage_b.yaml`` beside ``<ship>/stage_b``. :func:`apply_training_record` fills every inference
config's MLLM shape from that record and, where ``history_turns`` is left at -1 ("as trained"), K.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from animegamer.config.parts import DataConfig
from animegamer.config.runs import InferenceConfig

# the MLLMConfig fields a stage (b) checkpoint's weights fix; the rest (base weights path, dtype, attention
# kernel, checkpointing, instruction limit) are choices of the run that loads it
MLLM_SHAPE = ("vocabulary", "num_slots", "shot_dim", "resampler_layers", "resampler_gelu", "lora_rank", "lora_alpha",
              "lora_dropout", "lora_targets")
AS_TRAINED = -1  # history_turns: the K of the record (DataConfig's default where there is none)


def recorded_run_config(checkpoint: str | Path) -> Path | None:
    """The stage (b) run config recorded with ``checkpoint`` (a run dir, a step dir, ``checkpoints/latest`` or a
    shipped ``stage_b`` folder), or None when there is none."""
    if not str(checkpoint):
        return None
    path = Path(checkpoint)
    candidates = [path / "config.yaml", path.parent / "configs" / f"{path.name}.yaml"]
    if path.parent.name == "checkpoints":
        candidates.insert(1, path.parent.parent / "config.yaml")
    for candidate in candidates:
        if candidate.is_file():
            data = OmegaConf.load(candidate)
            if OmegaConf.is_dict(data) and data.get("kind") == "stage_b":
                return candidate
    return None


def _record(checkpoint: str) -> tuple[dict[str, Any], int, Path] | None:
    path = recorded_run_config(checkpoint)
    if path is None:
        return None
    data = OmegaConf.load(path)
    mllm = data.get("mllm", {})
    shape = {k: OmegaConf.to_object(mllm[k]) if OmegaConf.is_config(mllm[k]) else mllm[k]
             for k in MLLM_SHAPE if k in mllm}
    k = data.get("data", {}).get("history_turns", DataConfig.history_turns)
    return shape, int(k), path


def apply_training_record(cfg: InferenceConfig) -> InferenceConfig:
    """``cfg`` with the MLLM shape of ``cfg.mllm_checkpoint``'s recorded stage (b) config and, where
    ``history_turns`` is -1, the K it was trained with (DataConfig's default without a record)."""
    record = _record(cfg.mllm_checkpoint)
    if record is None:
        if cfg.history_turns == AS_TRAINED:
            cfg.history_turns = DataConfig.history_turns
        return cfg
    shape, k, _ = record
    cfg.mllm = dataclasses.replace(cfg.mllm, **shape)
    if cfg.history_turns == AS_TRAINED:
        cfg.history_turns = k
    return cfg


def history_turns_note(cfg: InferenceConfig) -> str:
    """One start-up line: which K (history turns) the MLLM reads and why."""
    record = _record(cfg.mllm_checkpoint)
    k = cfg.history_turns
    if record is None:
        return f"K = {k} history turns (no stage (b) record with mllm_checkpoint={cfg.mllm_checkpoint!r})"
    trained, path = record[1], record[2]
    if k == trained:
        return f"K = {k} history turns, as the MLLM was trained ({path})"
    return (f"K = {k} history turns, set by the config: the MLLM was trained with K = {trained} ({path}); "
            f"history_turns=-1 plays as trained")
