"""The one loader every entry point uses: YAML (with ``base`` files) + ``key=value`` overrides -> a typed, validated
dataclass of :mod:`animegamer.config.parts` / :mod:`animegamer.config.runs`, by the file's ``kind``."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from animegamer.config.prepare import PrepareDataConfig
from animegamer.config.recorded import apply_checkpoint_shapes
from animegamer.config.runs import AblationsConfig, BenchmarkConfig, BenchmarkGenConfig, EvalConfig, InferenceConfig
from animegamer.config.spriteworld import (
    SpriteWorldConfig,
    SpriteWorldLLMConfig,
    SpriteWorldPretrainConfig,
    SpriteWorldRunConfig,
)
from animegamer.config.stages import StageAConfig, StageBConfig, StageCConfig, StageDConfig, StageEConfig


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

_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")  # a config key as the dataclasses spell them
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")  # a field made by parts.device_field
_CHOICE_ERROR = re.compile(r"Invalid value '(.*)', expected one of (\[.*\])")  # OmegaConf's check of a Literal


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    if path.resolve() in seen:
        raise ConfigError(f"{path}: circular 'base' chain")
    try:
        raw = OmegaConf.load(path)
    except Exception as exc:  # yaml.YAMLError and friends
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ConfigError(f"{path}: not valid YAML: {_clip(first)}") from exc  # later lines quote the file
    if not isinstance(raw, DictConfig):
        raise ConfigError(f"{path}: top level must be a mapping")
    _check_key_names(OmegaConf.to_container(raw, resolve=False), path)
    base = raw.pop("base", None)
    if base is None:
        return raw
    parent = _read_yaml((path.parent / str(base)), seen + (path.resolve(),))
    return OmegaConf.merge(parent, raw)


def _check_key_names(node: Any, path: Path, where: str = "") -> None:
    """Every mapping key in a config file is a name (letters, digits, ``_``). Any other file (``base: /etc/passwd``)
    parses as a mapping with one huge key: refused here, without quoting the file."""
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        if isinstance(node, dict) and not (isinstance(key, str) and _KEY.fullmatch(key)):
            place = f"under '{where}'" if where else "at the top level"
            raise ConfigError(f"{path}: not a config file: a key {place} is not a name (letters, digits and _)")
        _check_key_names(value, path, f"{where}.{key}" if where else str(key))


def _check_values(obj: Any, where: str) -> None:
    """The checks a field's metadata asks for (parts.device_field, parts.non_negative); OmegaConf has checked the
    types and the ``Literal`` choices already."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            _check_values(value, f"{where}{f.name}.")
        elif f.metadata.get("device") and not _DEVICE.fullmatch(value):
            raise ConfigError(f"{where}{f.name}={value!r} is not a device (auto, cpu, cuda, cuda:N or mps)")
        elif "min" in f.metadata and value < f.metadata["min"]:
            raise ConfigError(f"{where}{f.name}={value} must be >= {f.metadata['min']}")


def load_config(path: str | Path | None, overrides: list[str] | None = None, schema: type | None = None,
                training_record: bool = True) -> Any:
    """Load a YAML run config, apply ``key=value`` overrides and return the typed dataclass.

    The schema is ``schema`` if given, else the one named by the file's ``kind``. Unknown keys,
    wrong types, values outside a field's ``Literal`` choices and values its metadata rules out (a device,
    a count >= 0) raise :class:`ConfigError` with one message naming the key. With ``training_record``, every
    inference config in it takes the shapes its ``mllm_checkpoint`` and ``decoder_checkpoint`` record in their own
    files (and, at ``history_turns=-1``, the MLLM's K): :func:`animegamer.config.recorded.apply_checkpoint_shapes`.
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
        except TypeError as exc:  # a list onto a mapping (or back): OmegaConf cannot merge the two
            raise ConfigError(f"override {item!r}: {exc} (set the mapping's keys one by one)") from exc
    try:
        cfg = OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{source}: {_describe(exc)}") from exc
    expected = getattr(schema(), "kind", None)
    if expected is not None and cfg.kind != expected:
        raise ConfigError(f"{source}: kind={cfg.kind!r} but this entry point expects kind={expected!r}")
    if training_record:
        for inference in inference_configs(cfg):
            try:
                apply_checkpoint_shapes(inference)
            except ValueError as exc:  # a config restating another shape, or a damaged record
                raise ConfigError(f"{source}: {exc}") from exc
    _check_values(cfg, "")
    return cfg


def inference_configs(cfg: Any) -> list[InferenceConfig]:
    """``cfg`` itself if it is an inference config, else the inference configs among its fields (eval's)."""
    if isinstance(cfg, InferenceConfig):
        return [cfg]
    return [value for f in dataclasses.fields(cfg) if isinstance(value := getattr(cfg, f.name), InferenceConfig)]


def _describe(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    msg = (getattr(exc, "msg", None) or str(exc)).splitlines()[0]  # OmegaConf appends full_key/object_type lines
    if key and (choice := _CHOICE_ERROR.fullmatch(msg)):
        return f"{key}={choice.group(1)!r} is not one of {choice.group(2)}"
    if key:
        return f"key '{_clip(str(key))}': {_clip(msg, 200)}"
    return _clip(msg, 200)


def _clip(text: str, limit: int = 80) -> str:
    """``text`` on one line, cut to ``limit`` characters: a file that is not a config (``base: /etc/passwd``) parses
    as one huge key, and its content must not be echoed into the error."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def to_yaml(cfg: Any) -> str:
    """The resolved config as YAML text (saved beside every run)."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))
