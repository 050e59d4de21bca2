"""The one loader every entry point uses: YAML (with ``base`` files) + ``key=value`` overrides -> a typed, validated
dataclass of :mod:`animegamer.config.parts` / :mod:`animegamer.config.runs`, by the file's ``kind``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from animegamer.config.runs import (
    AblationsConfig,
    BenchmarkConfig,
    BenchmarkGenConfig,
    EvalConfig,
    InferenceConfig,
    PrepareDataConfig,
    SpriteWorldConfig,
    SpriteWorldLLMConfig,
    SpriteWorldPretrainConfig,
    SpriteWorldRunConfig,
    StageAConfig,
    StageBConfig,
    StageCConfig,
    StageDConfig,
    StageEConfig,
)


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the file and the key."""


SCHEMAS: dict[str, type] = {
    "stage_a": StageAConfig,
    "stage_b": StageBConfig,
    "stage_c": StageCConfig,
    "stage_d": StageDConfig,
    "stage_e": StageEConfig,
    "inference": InferenceConfig,
    "eval": EvalConfig,
    "prepare_data": PrepareDataConfig,
    "spriteworld": SpriteWorldConfig,
    "spriteworld_pretrain": SpriteWorldPretrainConfig,
    "spriteworld_llm": SpriteWorldLLMConfig,
    "spriteworld_run": SpriteWorldRunConfig,
    "benchmark": BenchmarkConfig,
    "benchmark_gen": BenchmarkGenConfig,
    "ablations": AblationsConfig,
}

_CHOICES: dict[str, tuple[str, ...]] = {
    "projector": ("mlp", "linear"),
    "fusion": ("concat", "add", "cross_attn"),
    "frame": ("first", "random"),
    "dtype": ("fp32", "bf16", "fp16"),
    "vocabulary": ("paper", "released"),
    "mixed_precision": ("no", "bf16", "fp16"),
    "lr_scheduler": ("constant", "cosine", "linear"),
    "report_to": ("tensorboard", "wandb", "csv", "none"),
    "scheduler": ("dpm", "ddim"),
    "offload": ("none", "sequential"),
    "split": ("train", "test", "all"),
    "split_by": ("film", "time"),
    "reader": ("pyav", "decord"),
    "flow": ("dis", "raft"),
    "blocking": ("fixed", "anchored", "free"),
    "flow_preset": ("ultrafast", "fast", "medium"),
    "preset": ("full", "tiny"),
    "compat": ("released", "fixed"),
    "cache": ("none", "first_block", "taylorseer", "pab", "faster", "magcache"),  # models.cache.CACHE_METHODS
    "SamplingConfig.preset": ("standard", "fast", "distilled"),
    "SamplingConfig.vae": ("full", "small"),  # "Class.field": a name other fields also use
    "resampler_gelu": ("tanh", "erf"),
    "StageCConfig.history": ("teacher", "own"),
}


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")  # every config's ``device``
_NON_NEGATIVE = ("history_turns", "shot_noise", "history_noise")  # checked wherever a config has them


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: circular 'base' chain")
    try:
        raw = OmegaConf.load(path)
    except Exception as exc:  # yaml.YAMLError and friends
        raise ConfigError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: top level must be a mapping")
    base = raw.pop("base", None)
    if base is None:
        return raw
    parent = _read_yaml((path.parent / str(base)), seen + (path.resolve(),))
    return OmegaConf.merge(parent, raw)


def _check_choices(obj: Any, where: str) -> None:
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _check_choices(value, f"{where}{f.name}.")
        elif (names := _CHOICES.get(f"{type(obj).__name__}.{f.name}", _CHOICES.get(f.name))) and value not in names:
            raise ConfigError(f"{where}{f.name}={value!r} is not one of {list(names)}")
        elif f.name == "device" and not _DEVICE.fullmatch(value):
            raise ConfigError(f"{where}{f.name}={value!r} is not a device (auto, cpu, cuda, cuda:N or mps)")
        elif f.name in _NON_NEGATIVE and value < 0:
            raise ConfigError(f"{where}{f.name}={value} must be >= 0")


def load_config(path: str | Path | None, overrides: list[str] | None = None, schema: type | None = None) -> Any:
    """Load a YAML run config, apply ``key=value`` overrides and return the typed dataclass.

    The schema is ``schema`` if given, else the one named by the file's ``kind``. Unknown keys,
    wrong types and values outside a field's choices raise :class:`ConfigError` with one message
    naming the key.
    """
    overrides = list(overrides or [])
    source = str(path) if path is not None else "<defaults>"
    data = _read_yaml(Path(path)) if path is not None else OmegaConf.create({})
    if schema is None:
        kind = data.get("kind")
        if kind is None:
            raise ConfigError(f"{source}: missing top-level 'kind' (one of {sorted(SCHEMAS)})")
        if kind not in SCHEMAS:
            raise ConfigError(f"{source}: kind={kind!r} is not one of {sorted(SCHEMAS)}")
        schema = SCHEMAS[kind]
    base = OmegaConf.structured(schema)
    try:
        merged = OmegaConf.merge(base, data)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} is not of the form key=value")
        if item.endswith("="):  # "key=" means the empty string, not null
            item += "''"
        try:
            merged = OmegaConf.merge(merged, OmegaConf.from_dotlist([item]))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"override {item!r}: {_describe(exc)}") from exc
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc
    expected = getattr(schema(), "kind", None)
    if expected is not None and cfg.kind != expected:
        raise ConfigError(f"{source}: kind={cfg.kind!r} but this entry point expects kind={expected!r}")
    _check_choices(cfg, "")
    return cfg


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    msg = (getattr(exc, "msg", None) or str(exc)).splitlines()[0]  # OmegaConf appends full_key/object_type lines
    if key:
        return f"key '{key}': {msg}"
    return msg


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text (saved beside every run)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
