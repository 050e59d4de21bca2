"""The training stage configs, (a)-(e): one per stage script (scripts/train_stage_{a,b,c,d,e}.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from animegamer.config.parts import (
    CLIPConfig,
    DataConfig,
    DecoderConfig,
    EncoderConfig,
    MLLMConfig,
    SamplingConfig,
    T5Config,
    TrainConfig,
    knob,
)


@dataclass
class StageAConfig:
    kind: str = "stage_a"
    output_dir: str = "outputs/stage_a"
    seed: int = 42
    clip: CLIPConfig = field(default_factory=CLIPConfig)
    t5: T5Config = field(default_factory=T5Config)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    warmup_steps: int = knob(10000, help="encoder-only steps before LoRA joins (paper: 10k, then 80k joint)")
    condition_dropout: float = knob(0.1, help="probability of the unconditional shot representation (for CFG)")
    shot_noise: float = knob(
        0.0, min=0,
        help="the decoder reads s_a + N(0, (shot_noise * std(s_a))^2) (std over the batch, no gradient; 0: the "
             "paper's clean s_a), so it learns to render a shot a little off, as the MLLM predicts them; shot targets"
             " stay clean",
    )
    motion_loss_weight: float = knob(
        0.0,
        help="latent cells that change between latent frames weigh 1 + this (0: plain MSE)",
    )
    motion_threshold: float = knob(0.2, help="a cell changes when a channel moves more than this (latent std units)")


@dataclass
class StageBConfig:
    kind: str = "stage_b"
    output_dir: str = "outputs/stage_b"
    seed: int = 42
    mllm: MLLMConfig = field(default_factory=MLLMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=5e-5, max_steps=15000))
    shot_targets: str = knob("outputs/stage_a/shot_targets", help="cached s_a targets from the stage (a) encoder")
    mse_weight: float = knob(0.5, help="alpha")
    cosine_weight: float = knob(0.0, help="beta (0.5 in the cosine-loss ablation)")
    identity_weight: float = knob(
        0.0, min=0,
        help="weight of the identity term (0: the paper's loss): the predicted shot's error along each direction in "
             "which naming another friend moves the encoder's shot, in units of that move (needs the shot targets' "
             "identity swaps, animegamer.data.name_swaps)",
    )
    max_seq_len: int = knob(2048, help="sequences are padded (or packed) to at most this many tokens")
    pack_sequences: bool = False
    history_noise: float = knob(
        0.0, min=0,
        help="the MLLM reads each history shot as s_a + N(0, (history_noise * std)^2) (std over the batch's history "
             "shots, no gradient; 0: the paper's clean teacher-forced history), so reading a turn back survives a "
             "game, whose history is the MLLM's own predicted shots; targets stay clean",
    )
    name_swap_copies: int = knob(
        0, min=0,
        help="each window that shows a friend is also trained this many times with that friend renamed (0: the "
             "paper's data): every instruction's name replaced and every shot that names the friend replaced by its "
             "identity swap for the new name; never to a pair the manifest's held_out_pairs hold out (needs the "
             "shot targets' identity swaps with their names, animegamer.data.name_swaps)",
    )


@dataclass
class StageCConfig:
    kind: str = "stage_c"
    output_dir: str = "outputs/stage_c"
    seed: int = 42
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    mllm: MLLMConfig = field(default_factory=MLLMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=5e-5, max_steps=10000))
    stage_a_checkpoint: str = knob(
        "outputs/stage_a/checkpoints/latest",
        help="decoder LoRA + motion embedding to start from",
    )
    stage_b_checkpoint: str = knob("outputs/stage_b/checkpoints/latest", help="frozen MLLM adapters + resamplers")
    shot_targets: str = knob(
        "outputs/stage_a/shot_targets",
        help="stage (a) s_a of every clip: the teacher-forced history turns the MLLM sees, as in stage (b) training",
    )
    predictions_cache: str = knob(
        "",
        help="MLLM predictions, made once (a TensorStore); \"\" = <output_dir>/predictions",
    )
    history: Literal["teacher", "own"] = knob(
        "teacher",
        help="the history the MLLM predicts from: teacher (stage a targets, the paper's) | own (its own predictions "
             "from the film's start, as a game plays; animegamer.data.stage_c)",
    )
    max_seq_len: int = knob(2048, help="a window longer than this loses its oldest history turns, as in stage (b)")
    condition_dropout: float = knob(0.1, help="probability of the unconditional (zero) shot representation, for CFG")
    motion_loss_weight: float = knob(
        0.0,
        help="as stage (a): changing latent cells weigh 1 + this (0: the paper's plain MSE)",
    )
    motion_threshold: float = 0.2


@dataclass
class StageDConfig:
    kind: str = "stage_d"
    output_dir: str = "outputs/stage_d"
    seed: int = 42
    decoder: DecoderConfig = knob(factory=DecoderConfig, help="as stage (c): its trained parts load into it")
    data: DataConfig = knob(factory=DataConfig, help="manifest (the conditions' motion levels), num_workers")
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-4, max_steps=2000))
    stage_c_checkpoint: str = knob(
        "outputs/stage_c/checkpoints/latest",
        help="the teacher, and where the student starts",
    )
    conditions: str = knob(
        "outputs/stage_c/predictions",
        help="s_a to distil on (TensorStore): stage (c)'s MLLM predictions",
    )
    student_steps: int = knob(4, help="K: the student's sampling steps (one transformer call each, no CFG)")
    teacher: SamplingConfig = knob(
        factory=lambda: SamplingConfig(scheduler="ddim"),
        help="the teacher's sampler (scheduler ddim: its deterministic ODE) and the clip size; the guidance schedule "
             "is folded",
    )


@dataclass
class CausalDecoderConfig:
    """The stage (e) small causal decoder's shape (animegamer.models.causal_decoder)."""

    channels: list[int] = knob(factory=lambda: [256, 128, 64], help="width per 2x upsampling level, coarse first")
    blocks_per_level: int = knob(3, help="memory blocks (2D convs + the previous frame) before each upsampling")


@dataclass
class StageEConfig:
    """Stage (e): a small causal decoder from the frozen VAE's latents to frames (scripts/train_stage_e.py)."""

    kind: str = "stage_e"
    output_dir: str = "outputs/stage_e"
    seed: int = 42
    vae: str = knob("checkpoints/CogVideoX-2b", help="CogVideoX folder whose vae/config.json fixes the latent layout")
    small_decoder: CausalDecoderConfig = field(default_factory=CausalDecoderConfig)
    data: DataConfig = knob(factory=DataConfig, help="manifest + features_dir (latents) + the clip settings")
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=3e-4, max_steps=20000, batch_size=4))
    crop_size: int = knob(
        16, min=0, help="side of the random training crop in latent cells (x the spatial factor in pixels); 0 = all"
    )
