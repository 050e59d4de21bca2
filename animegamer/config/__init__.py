"""Typed configuration schemas and the one loader every entry point uses.

Every run config is a YAML file holding values only. ``load_config(path, overrides)`` merges it
onto the dataclass schema named by its top-level ``kind`` (``stage_a``, ``stage_b`` ...), applies
``key=value`` overrides (OmegaConf dot-list) and returns a typed, validated dataclass.

A YAML may name a ``base`` file (path relative to itself); the base is loaded first and the file's
values are merged on top, so tiny and ablation configs state only what differs.
"""

from omegaconf import MISSING

from animegamer.config.loading import SCHEMAS, ConfigError, load_config, to_yaml
from animegamer.config.parts import (
    CLIPConfig,
    DataConfig,
    DecoderConfig,
    EncoderConfig,
    MLLMConfig,
    SamplingConfig,
    T5Config,
    TrainConfig,
)
from animegamer.config.prepare import CaptionConfig, PrepareDataConfig
from animegamer.config.runs import (
    AblationRow,
    AblationsConfig,
    AblationStep,
    BenchmarkConfig,
    BenchmarkGenConfig,
    EvalConfig,
    InferenceConfig,
    JudgeConfig,
)
from animegamer.config.spriteworld import (
    SpriteWorldConfig,
    SpriteWorldLLMConfig,
    SpriteWorldPretrainConfig,
    SpriteWorldRunConfig,
)
from animegamer.config.stages import (
    CausalDecoderConfig,
    StageAConfig,
    StageBConfig,
    StageCConfig,
    StageDConfig,
    StageEConfig,
)
from animegamer.config_docs import config_help  # --help text from the schemas' knob(help=...)

__all__ = [
    "MISSING",
    "SCHEMAS",
    "AblationRow",
    "AblationStep",
    "AblationsConfig",
    "BenchmarkConfig",
    "BenchmarkGenConfig",
    "CLIPConfig",
    "CaptionConfig",
    "CausalDecoderConfig",
    "ConfigError",
    "DataConfig",
    "DecoderConfig",
    "EncoderConfig",
    "EvalConfig",
    "InferenceConfig",
    "JudgeConfig",
    "MLLMConfig",
    "PrepareDataConfig",
    "SamplingConfig",
    "SpriteWorldConfig",
    "SpriteWorldLLMConfig",
    "SpriteWorldPretrainConfig",
    "SpriteWorldRunConfig",
    "StageAConfig",
    "StageBConfig",
    "StageCConfig",
    "StageDConfig",
    "StageEConfig",
    "T5Config",
    "TrainConfig",
    "config_help",
    "load_config",
    "to_yaml",
]
