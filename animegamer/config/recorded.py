"""What a trained checkpoint's own files say about its model, read back wherever the checkpoint is named, so that
no config restates it (or can drift from it).

    <mllm checkpoint>/mllm_layout.json       vocabulary, num_slots, shot_dim, resampler_layers, resampler_gelu and
                                             the K (``history_turns``) the MLLM was trained with
    <mllm checkpoint>/adapter_config.json    peft's: the LoRA's r, alpha, dropout and target modules
    <decoder checkpoint>/decoder_config.json the LoRA (rank, alpha, targets) and the motion-level input (scope,
                                             levels, embedding width)

A checkpoint is any path :func:`animegamer.io.resolve_checkpoint` takes (a run dir, ``checkpoints/latest``, a step
dir, a shipped ``stage_b`` / ``stage_c`` folder). :func:`apply_checkpoint_shapes` gives an inference config the
shapes of the checkpoints it names and, where ``history_turns`` is -1 ("as trained"), the MLLM's K;
:func:`adopt` is the rule, also used where a decoder checkpoint is loaded (:func:`animegamer.models.trained.
load_decoder`): a field the config leaves at its default takes the checkpoint's value; a field the config sets
to another value is an error that names both.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, NamedTuple

from animegamer.config.parts import DataConfig
from animegamer.config.runs import InferenceConfig
from animegamer.io import checkpoint_decoder_dir, read_json_bounded, resolve_checkpoint

MLLM_LAYOUT = "mllm_layout.json"
ADAPTER_CONFIG = "adapter_config.json"  # peft's LoRA config, beside the adapter weights
DECODER_CONFIG = "decoder_config.json"

# the MLLMConfig fields a stage (b) checkpoint's weights fix; the rest (base weights path, dtype, attention
# kernel, checkpointing, instruction limit, KV cache) are choices of the run that loads it
MLLM_SHAPE = ("vocabulary", "num_slots", "shot_dim", "resampler_layers", "resampler_gelu", "lora_rank", "lora_alpha",
              "lora_dropout", "lora_targets")
# the DecoderConfig fields a decoder checkpoint's weights fix (how it samples, motion_guidance, it records too:
# adopted when its parts load)
DECODER_SHAPE = ("lora_rank", "lora_alpha", "lora_targets", "motion_scope", "num_motion_levels", "motion_embed_dim")
AS_TRAINED = -1  # history_turns: the K the checkpoint records (DataConfig's default where it records none)

_LORA_KEYS = {"r": "lora_rank", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout",
              "target_modules": "lora_targets"}
_CHOICES = {"vocabulary": ("paper", "released"), "resampler_gelu": ("tanh", "erf")}


class Record(NamedTuple):
    """The shape fields a checkpoint's files record, the K it was trained with (MLLM; None if unrecorded), the
    file that says so and, for fields another file gives (the MLLM's LoRA: peft's adapter config), that file."""

    shape: dict[str, Any]
    history_turns: int | None
    source: Path
    elsewhere: dict[str, Path] = {}


def _object(path: Path) -> dict[str, Any]:
    data = read_json_bounded(path)  # a damaged file: a ValueError naming it
    if not isinstance(data, dict):
        raise ValueError(f"{path}: a JSON object expected")
    return data


def _checked(path: Path, key: str, value: Any) -> Any:
    """``value`` if it is what the config field ``key`` can hold, else a ValueError naming the file and key (the
    file may come from anyone; its values go into a typed config without OmegaConf's checks)."""
    if key in _CHOICES:
        ok = value in _CHOICES[key]
    elif key == "lora_targets":
        ok = isinstance(value, list) and bool(value) and all(isinstance(v, str) and 0 < len(v) <= 200 for v in value)
    elif key == "lora_dropout":
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        ok = number and math.isfinite(value) and 0 <= value < 1
    elif key == "motion_scope":
        ok = isinstance(value, bool)
    else:  # counts and widths
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 1 << 20
    if not ok:
        raise ValueError(f"{path}: {key}={str(value)[:60]!r} is not a valid value")
    return value


def mllm_record(checkpoint: str | Path) -> Record | None:
    """What the MLLM checkpoint ``checkpoint`` records (:class:`Record`), or None where it holds no layout."""
    if not str(checkpoint):
        return None
    try:
        path = resolve_checkpoint(checkpoint)
    except FileNotFoundError:
        return None
    if not (path / MLLM_LAYOUT).is_file():
        return None
    layout = _object(path / MLLM_LAYOUT)
    shape = {k: _checked(path / MLLM_LAYOUT, k, layout[k]) for k in MLLM_SHAPE if k in layout}
    lora: dict[str, Any] = {}
    if (path / ADAPTER_CONFIG).is_file():
        adapter = _object(path / ADAPTER_CONFIG)
        lora = {field: _checked(path / ADAPTER_CONFIG, field, adapter[key])
                for key, field in _LORA_KEYS.items() if key in adapter}
    k = layout.get("history_turns")
    k = None if k is None else _checked(path / MLLM_LAYOUT, "history_turns", k)
    return Record(shape | lora, k, path / MLLM_LAYOUT, dict.fromkeys(lora, path / ADAPTER_CONFIG))


def decoder_record(checkpoint: str | Path) -> Record | None:
    """What the decoder checkpoint ``checkpoint`` (or its ``decoder/`` folder) records, or None where it holds no
    ``decoder_config.json``."""
    if not str(checkpoint):
        return None
    try:
        path = checkpoint_decoder_dir(checkpoint) / DECODER_CONFIG
    except FileNotFoundError:
        return None
    if not path.is_file():
        return None
    saved = _object(path)
    return Record({k: _checked(path, k, saved[k]) for k in DECODER_SHAPE if k in saved}, None, path)


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, list) and isinstance(b, list):
        return sorted(a) == sorted(b)  # LoRA targets: a set, whatever order a file lists them in
    return a == b


def adopt(section: Any, record: Record | None, where: str) -> Any:
    """``section`` (an MLLMConfig or DecoderConfig) with the shape ``record`` holds: a field left at its default
    takes the recorded value; a field set to another value raises ValueError naming the config key and the file."""
    if record is None:
        return section
    defaults = type(section)()
    changes = {}
    for key, value in record.shape.items():
        mine = getattr(section, key)
        if _same(mine, value):
            continue
        if not _same(mine, getattr(defaults, key)):
            source = record.elsewhere.get(key, record.source)
            raise ValueError(f"{where}.{key}={mine!r}, but {source} records {value!r}: the checkpoint "
                             f"says its shape, leave {where}.{key} out of the config")
        changes[key] = value
    return dataclasses.replace(section, **changes) if changes else section


def apply_checkpoint_shapes(cfg: InferenceConfig) -> InferenceConfig:
    """``cfg`` with the MLLM shape ``cfg.mllm_checkpoint`` records and the decoder shape ``cfg.decoder_checkpoint``
    records (:func:`adopt`) and, where ``history_turns`` is -1, the K the MLLM was trained with (DataConfig's
    default where none is recorded)."""
    mllm = mllm_record(cfg.mllm_checkpoint)
    cfg.mllm = adopt(cfg.mllm, mllm, "mllm")
    cfg.decoder = adopt(cfg.decoder, decoder_record(cfg.decoder_checkpoint), "decoder")
    if cfg.history_turns == AS_TRAINED:
        trained = mllm.history_turns if mllm is not None else None
        cfg.history_turns = DataConfig.history_turns if trained is None else trained
    return cfg


def with_decoder_checkpoint(cfg: InferenceConfig, checkpoint: str | Path) -> InferenceConfig:
    """A copy of ``cfg`` that plays the decoder of ``checkpoint`` (the evaluation's stage (a) decoder, a student):
    the shape fields ``cfg.decoder_checkpoint`` gave go back to their defaults, then ``checkpoint``'s are adopted.
    A field the config set to a value of its own stays, and is checked against ``checkpoint`` (:func:`adopt`)."""
    decoder, given = cfg.decoder, decoder_record(cfg.decoder_checkpoint)
    if given is not None:
        defaults = type(decoder)()
        decoder = dataclasses.replace(decoder, **{k: getattr(defaults, k) for k, v in given.shape.items()
                                                  if _same(getattr(decoder, k), v)})
    decoder = adopt(decoder, decoder_record(checkpoint), "decoder")
    return dataclasses.replace(cfg, decoder_checkpoint=str(checkpoint), decoder=decoder)


def history_turns_note(cfg: InferenceConfig) -> str:
    """One start-up line: which K (history turns) the MLLM reads and why."""
    record = mllm_record(cfg.mllm_checkpoint)
    k = cfg.history_turns
    if record is None or record.history_turns is None:
        return f"K = {k} history turns (no K recorded with mllm_checkpoint={cfg.mllm_checkpoint!r})"
    if k == record.history_turns:
        return f"K = {k} history turns, as the MLLM was trained ({record.source})"
    return (f"K = {k} history turns, set by the config: the MLLM was trained with K = {record.history_turns} "
            f"({record.source}); history_turns=-1 plays as trained")
