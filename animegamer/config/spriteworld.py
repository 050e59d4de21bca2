"""The SpriteWorld configs: the world (its data), the stand-in pretraining, the tiny LLM and the one-command chain
(scripts/spriteworld/)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from animegamer.config.parts import (
    CLIPConfig,
    DataConfig,
    TrainConfig,
    knob,
)


@dataclass
class SpriteWorldConfig:
    kind: str = "spriteworld"
    output_dir: str = knob("outputs/spriteworld/data", help="clips/, clips.jsonl (+ .meta.json), games/ land here")
    seed: int = knob(0, help="films, poses and the train/test split all follow from it")
    num_films: int = knob(32, help="films = chains of consecutive shots with continuity")
    shots_per_film: int = knob(12, help="consecutive 2 s shots (clips) per film")
    height: int = knob(64, help="frame size of the drawn clips (3:2 like 480x720)")
    width: int = 96
    num_frames: int = knob(17, help="frames per clip (4k + 1, as the VAE wants)")
    fps: int = 8
    characters: list[str] = knob(factory=lambda: ["Qiqi", "Momo", "Kai", "Luna"], help="protagonists, in turn")
    test_fraction: float = knob(0.2, help="fraction of films held out as test games (split by film)")
    blocking: Literal["fixed", "anchored", "free"] = knob(
        "fixed",
        help="fixed: each action staged one way (a small model learns its motion) | anchored: fixed, and paths start "
             "from one spot whatever their speed (the first frame does not tell it) | free: random",
    )
    speed_jitter: float = knob(
        0.1,
        help="a clip's speed = its adverb's x a factor in [1 - j, 1 + j] that no word says",
    )
    memory: bool = knob(
        False,
        help="the memory world (animegamer.spriteworld.memory): each film's own home and a friend who follows, drawn "
             "but never said; instructions leave out what earlier turns fixed (still / later / here / home / friend)",
    )
    back: bool = knob(
        False,
        help="with memory: \"back\" for the place before this one (2+ turns back, past a one-turn history) and films "
             "that make short trips out and back (memory.COME_BACK); off: the memory world of the shipped checkpoint,"
             " bit for bit",
    )
    held_out_pairs: list[str] = knob(
        factory=list,
        help="\"Momo:fly\" (an action) or \"Qiqi:Luna\" (a friend): pairs no training film has, only held-out games",
    )
    workers: int = knob(2, help="threads writing mp4s (each encode runs in its own ffmpeg process)")


@dataclass
class SpriteWorldPretrainConfig:
    """SpriteWorld's stand-in for CogVideoX-2B pretraining (scripts/spriteworld/pretrain.py)."""

    kind: str = "spriteworld_pretrain"
    output_dir: str = knob(
        "outputs/spriteworld/models/CogVideoX",
        help="the CogVideoX folder written (diffusers layout)",
    )
    report_dir: str = knob(
        "outputs/spriteworld/pretrain",
        help="losses (metrics.jsonl), run config, preview contact sheets",
    )
    seed: int = 0
    clip: CLIPConfig = knob(factory=CLIPConfig, help="frozen CLIP of the stage (a) features filled on the way")
    data: DataConfig = knob(factory=DataConfig, help="manifest (train split), stage (a) features_dir, clip size")
    t5_dim: int = knob(32, help="width of the frozen tiny random T5 (text_encoder/) built into output_dir")
    text_tokens: int = knob(
        226,
        help="T5 tokens per caption = the transformer's max_text_seq_length (= shot tokens N later)",
    )
    vae_channels: list[int] = knob(factory=lambda: [8, 16, 32, 32], help="3 downsamples: 8x spatial")
    latent_channels: int = knob(16, help="as CogVideoX-2B")
    clip_training: TrainConfig = knob(
        factory=lambda: TrainConfig(max_steps=0, batch_size=64, lr=1e-3, lr_scheduler="cosine", lr_warmup_steps=50),
        help="CLIP's contrastive pretraining of the stand-in CLIP (clip.checkpoint, rewritten) on the training films' "
             "(frame, caption) pairs, before the stage (a) features are filled with it; max_steps 0 leaves it random",
    )
    vae: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=600, batch_size=8, lr=3e-3))
    vae_frames: int = knob(
        1,
        help="frames per VAE training window (1 or 4k + 1; 1 = single pictures, the cheapest on a CPU)",
    )
    vae_temporal_compression: int = knob(
        4,
        help="frames per latent frame (CogVideoX: 4). A tiny VAE averages a fast figure away inside each group of 4 "
             "frames; 1 keeps every frame (a single-picture VAE applied frame by frame) at the cost of 4x the "
             "transformer's tokens",
    )
    kl_weight: float = knob(1.0e-6, help="KL of the posterior against N(0, I), small as in latent-diffusion VAEs")
    foreground_weight: float = knob(
        0.0,
        help="extra loss weight of pixels off their place's empty scenery (the figures)",
    )
    vae_latent_noise: float = knob(0.0, help="Gaussian noise (x the latents' std) added before decoding, in training")
    resume_vae: bool = knob(
        False,
        help="keep output_dir/vae + data.features_dir of an earlier run; only the transformer trains",
    )
    num_heads: int = knob(4, help="transformer attention heads")
    head_dim: int = knob(16, help="width per head; hidden = num_heads * head_dim")
    num_layers: int = 4
    patch_size: int = knob(
        2,
        help="latent pixels per token side (CogVideoX-2B: 2); 4 on a 4x VAE keeps 8x8 pixels per token",
    )
    transformer: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=500, batch_size=8, lr=1e-3))
    init_transformer: str = knob(
        "",
        help="a transformer folder of this architecture (diffusers layout, safetensors) the transformer starts from: "
             "transformer.max_steps more steps for a trained one; '' starts from the seeded random init",
    )
    transformer_cycles: int = knob(
        1, min=1,
        help="times the transformer's whole schedule runs (transformer.max_steps steps each: warmup, text warmup, "
             "cosine), each cycle from the last one's weights with a fresh optimizer and the same seed (warm "
             "restarts); the same weights as that many runs chained by init_transformer",
    )
    condition_dropout: float = knob(0.1, help="empty-prompt rate, so the base model has an unconditional branch")
    # From scratch, a small model learns to guess the scene from the faint signal left in very noisy latents and
    # never reads the caption, so samples from pure noise ignore it. At the last timestep (zero terminal SNR) the
    # latent is pure noise and only the caption says what to draw.
    text_warmup_steps: int = knob(0, help="first steps trained at the last timestep only (read the caption)")
    pure_noise_fraction: float = knob(0.0, help="fraction of every later batch trained at the last timestep")
    figure_loss_weight: float = knob(
        0.0,
        help="extra weight of the latent cells figures fall in, in the transformer's loss (the background fills the "
             "rest)",
    )
    motion_loss_weight: float = knob(
        0.0,
        help="extra weight of the cells a figure enters or leaves from one latent frame to the next (the motion), "
             "from the same figure masks as figure_loss_weight",
    )
    feature_batch: int = knob(8, help="clips per batch while filling the features (batched VAE encode is much faster)")
    threads: int = knob(1, help="torch CPU threads; 1 runs best on shared cores (OpenMP spin-waits otherwise)")


@dataclass
class SpriteWorldLLMConfig:
    """SpriteWorld's stand-in for Mistral-7B's pretraining (scripts/spriteworld/pretrain_llm.py): the tiny random
    Mistral trained as a causal LM, all parameters, on the text of SpriteWorld's training films."""

    kind: str = "spriteworld_llm"
    pretrained: str = knob(
        "outputs/spriteworld/models/Mistral",
        help="the tiny random Mistral + tokenizer it starts from",
    )
    output_dir: str = knob(
        "outputs/spriteworld/models/Mistral",
        help="the pretrained model + tokenizer (may be `pretrained`)",
    )
    report_dir: str = knob(
        "outputs/spriteworld/pretrain_llm",
        help="losses (metrics.jsonl), config.yaml, summary.json",
    )
    manifest: str = knob(
        "outputs/spriteworld/data/train.jsonl",
        help="its meta's train films (all films without a split)",
    )
    seq_len: int = knob(192, help="tokens per training window (a film's text is ~1400 tokens)")
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=600, batch_size=8, lr=3e-3, lr_scheduler="cosine",
                                            lr_warmup_steps=30)
    )
    seed: int = 0
    threads: int = knob(0, help="torch CPU threads; 0: as the caller")


@dataclass
class SpriteWorldRunConfig:
    """The whole SpriteWorld chain (scripts/spriteworld/train.py): data -> pretraining -> stages a-d -> eval."""

    kind: str = "spriteworld_run"
    output_dir: str = knob(
        "outputs/spriteworld",
        help="every step's outputs; the step configs' outputs/spriteworld moves here",
    )
    ship_dir: str = knob(
        "checkpoints/spriteworld",
        help="the shipped checkpoint; configs' checkpoints/spriteworld moves here",
    )
    configs: str = knob("configs/spriteworld", help="data, pretrain, stage_a/b/c, ablations YAMLs of the chain")
    steps: list[str] = knob(
        factory=lambda: ["data", "pretrain", "pretrain_llm", "stage_a", "stage_b", "stage_c", "stage_d", "stage_e",
                         "ship", "evaluate"],
        help="which steps to run, in this order",
    )
    eval_rows: list[str] = knob(
        factory=list,
        help="rows of ablations.yaml the evaluate step runs (empty = all); the tables keep the other rows' earlier "
             "results unless this call also ran ship (a new checkpoint: earlier rows are dropped)",
    )
    mistral_hidden: int = knob(128, help="hidden size of the tiny random Mistral (animegamer.tiny.build_tiny_mistral)")
    seed: int = knob(0, help="seed of the tiny random CLIP and Mistral")
    threads: int = knob(1, help="torch CPU threads; 1 runs best on shared cores (OpenMP spin-waits otherwise)")
    overrides: dict[str, Any] = knob(
        factory=dict,
        help="per step (data, pretrain, stage_a ... stage_d, inference, eval, ablations): a mapping of the values "
             "that differ from the step's YAML (e.g. the mini run's sizes), or key=value strings (command line: "
             "overrides.stage_b.seed=7)",
    )
