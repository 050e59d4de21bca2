"""Typed configuration schemas and the one loader every entry point uses.

Every run config is a YAML file holding values only. ``load_config(path, overrides)`` merges it
onto the dataclass schema named by its top-level ``kind`` (``stage_a``, ``stage_b`` ...), applies
``key=value`` overrides (OmegaConf dot-list) and returns a typed, validated dataclass.

A YAML may name a ``base`` file (path relative to itself); the base is loaded first and the file's
values are merged on top, so tiny and ablation configs state only what differs.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING, DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from animegamer.config_docs import config_help  # --help text from the field comments below


class ConfigError(ValueError):
    """A config file or override is invalid; the message names the file and the key."""


# --------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------


@dataclass
class CLIPConfig:
    arch: str = "ViT-H-14"  # open_clip model name (a registered config; tests register tiny ones)
    checkpoint: str = "checkpoints/clip/open_clip_vit_h14.safetensors"  # local weights file (.safetensors/.bin)
    model_config: str = ""  # JSON of a custom open_clip model config to register first (tiny models)
    image_size: int = 224  # input resolution; frames are resized + centre-cropped to it
    layer: int = -2  # residual block whose output is used; -2 = second-to-last, as in the paper
    drop_cls: bool = True  # drop the class token (256 patch tokens remain for ViT-H-14 at 224 px)


@dataclass
class T5Config:
    path: str = "checkpoints/CogVideoX-2b"  # diffusers-layout dir (text_encoder/, tokenizer/) or a T5 dir
    text_encoder_subfolder: str = "text_encoder"  # "" when `path` is the T5 directory itself
    tokenizer_subfolder: str = "tokenizer"
    max_length: int = 226  # padded/truncated to this many tokens, as CogVideoX does


@dataclass
class EncoderConfig:
    clip_dim: int = 1280  # width of the CLIP tokens (1280 ViT-H-14, 768 ViT-B-16)
    clip_tokens: int = 256  # number of CLIP tokens after dropping CLS (256 ViT-H-14/224, 196 ViT-B-16)
    text_dim: int = 4096  # T5 hidden size (4096 for T5-XXL)
    text_tokens: int = 226  # T5 sequence length
    hidden_dim: int = 1920  # output width = decoder hidden size (1920 for CogVideoX-2B)
    num_tokens: int = 226  # output tokens N of s_a; replaces the decoder's 226 text tokens
    projector: str = "mlp"  # CLIP projector: mlp (Linear-GELU-Linear) | linear
    fusion: str = "concat"  # how CLIP and text tokens meet: concat | add | cross_attn
    token_mixing: bool = True  # Linear over the token axis (226 + N_clip -> N); off = released decoder
    cross_attn_heads: int = 8  # heads of the cross_attn fusion variant
    frame: str = "first"  # which frame feeds CLIP: first | random (applied in the data path)


@dataclass
class DecoderConfig:
    pretrained: str = "checkpoints/CogVideoX-2b"  # diffusers-layout dir: transformer/, vae/, scheduler/
    lora_rank: int = 64  # LoRA rank on the attention projections
    lora_alpha: int = 64  # LoRA alpha (scale alpha / rank)
    lora_targets: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    motion_scope: bool = True  # inject the motion level into the timestep embedding
    num_motion_levels: int = 5  # motion levels 1..num_motion_levels
    motion_embed_dim: int = 256  # width of the sinusoidal motion-level embedding
    motion_guidance: bool = False  # condition dropout drops the level too (null level 0), CFG amplifies it
    gradient_checkpointing: bool = True  # recompute transformer blocks in backward
    dtype: str = "bf16"  # weights/compute dtype of the frozen parts: fp32 | bf16 | fp16
    vae_slicing: bool = False  # decode the VAE batch one sample at a time
    vae_tiling: bool = False  # decode the VAE in spatial tiles (less memory)


@dataclass
class MLLMConfig:
    pretrained: str = "checkpoints/Mistral-7B-v0.1"  # transformers dir with a MistralForCausalLM and tokenizer
    vocabulary: str = "paper"  # special-token spelling: paper (<VS><ANIME_i>) | released (<img><frame_i>)
    num_slots: int = 226  # query slots per turn (= shot tokens N)
    shot_dim: int = 1920  # width of a shot representation s_a
    resampler_layers: int = 2  # MLP depth of the input/output resamplers
    resampler_gelu: str = "tanh"  # resampler GELU: tanh (our checkpoints) | erf (the release, converted)
    lora_rank: int = 32
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    gradient_checkpointing: bool = True
    dtype: str = "bf16"  # fp32 | bf16 | fp16
    attn_implementation: str = "sdpa"  # eager | sdpa | flash_attention_2
    max_instruction_tokens: int = 96  # an instruction longer than this is rejected before any model runs


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


@dataclass
class DataConfig:
    manifest: str = "data/clips.jsonl"  # JSONL clip manifest (animegamer.data.manifest)
    features_dir: str = "data/features"  # precomputed VAE latents / CLIP / T5 shards
    height: int = 480
    width: int = 720
    num_frames: int = 17  # frames per clip fed to the VAE (4k + 1)
    fps: int = 8
    history_turns: int = 3  # K: earlier turns in the MLLM window
    # also train each turn with every shorter history, down to none: a model that always sees the previous shot
    # can learn to copy it instead of reading the instruction, and then fails on a game's first turn
    all_history_lengths: bool = False
    sequence_stride: int = 1  # step between consecutive stage (b) windows of a film
    min_sequence_turns: int = 1  # drop films shorter than this
    split: str = "train"  # which split of the manifest to use: train | test | all
    test_fraction: float = 0.2  # fraction held out (by film, or 8:2 in time for a single film)
    split_by: str = "film"  # film | time (the paper's single-film ablation)
    num_workers: int = 2  # DataLoader workers
    clip_frames: int = 4  # frames per clip whose CLIP tokens are precomputed: index 0 = first, rest for frame=random
    feature_dtype: str = "bf16"  # storage dtype of precomputed CLIP/T5 tokens (latents stay fp32): fp32 | bf16 | fp16


CAPTION_SYSTEM_PROMPT = "You annotate anime clips for a training dataset. Follow the requested output format exactly."
CAPTION_CHARACTERS_PROMPT = (
    "The first {num_references} images are reference pictures of known characters ({reference_list}). "
    "The next {num_frames} images are frames sampled in time order from one anime clip. "
    "Which of the known characters appear in the clip? Answer with one line of the form <C>name, name</C> "
    "using only these names: {names}; or <C>none</C> if none of them appears."
)
CAPTION_DESCRIBE_PROMPT = (
    "These {num_frames} images are frames sampled in time order from one anime clip. "
    "Known characters in the clip: {characters}. "
    "Its measured motion level is {motion_level} on a scale from 1 (nearly still) to {num_levels} (very fast).\n"
    "Describe the clip in exactly one line with these tags, in this order, and nothing else:\n"
    "<S>the main character: a name from the known characters if one appears, else a short noun such as Girl</S>"
    "<MD>what the character does, a short verb phrase</MD>"
    "<EV>the environment or background, a short noun phrase</EV>"
    "<MA>one adverb for how the motion is performed, in keeping with the motion level</MA>"
    "<SC>1 if the character interacts with another character, else 0</SC>"
    "<ET>1 if the character is doing something for fun or leisure, else 0</ET>"
    "<ST>-1 if the activity tires the character, 1 if it restores stamina (resting, eating, sleeping), else 0</ST>\n"
    "Example: <S>Girl</S><MD>run</MD><EV>Forest</EV><MA>slowly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>"
)
CAPTION_RETRY_PROMPT = "That answer is not valid: {error}. Answer again with exactly one line in the required format."


@dataclass
class CaptionConfig:
    """The two captioning steps of the paper's supplement (animegamer.data.captioning); prompts are templates."""

    backend: dict[str, Any] = field(default_factory=dict)  # animegamer.llm.make_backend spec: {type: openai,
    # base_url, model, api_key} for any OpenAI-compatible server (vLLM, LMDeploy), or {type: transformers, path,
    # device, dtype} for a local vision-language model directory
    num_frames: int = 8  # frames sampled evenly from each clip and shown to the model
    image_size: int = 448  # longer side of every image sent (frames and character references)
    max_attempts: int = 3  # tries per step; an answer still invalid after them marks the clip caption_status=invalid
    max_tokens: int = 200
    temperature: float = 0.2
    workers: int = 4  # clips captioned concurrently (HTTP backends; a local transformers model always uses 1)
    system_prompt: str = CAPTION_SYSTEM_PROMPT
    # step 1 uses {num_references} {reference_list} {num_frames} {names}; step 2 {num_frames} {characters}
    # {motion_level} {num_levels}; the retry {error}
    characters_prompt: str = CAPTION_CHARACTERS_PROMPT  # step 1: which reference characters appear
    describe_prompt: str = CAPTION_DESCRIBE_PROMPT  # step 2: the structured tag line given the motion level
    retry_prompt: str = CAPTION_RETRY_PROMPT  # follow-up message after an invalid answer


@dataclass
class PrepareDataConfig:
    kind: str = "prepare_data"
    output_dir: str = "data"  # clips/, clips.jsonl, features/ land here
    films: list[str] = field(default_factory=list)  # film files or directories of films
    height: int = 480
    width: int = 720
    clip_seconds: float = 2.0  # fixed clip length
    fps: int = 8  # clips are resampled to this frame rate
    scene_threshold: float = 27.0  # PySceneDetect ContentDetector threshold
    min_scene_seconds: float = 2.0  # scenes shorter than one clip are dropped
    crop_black_borders: bool = True
    black_threshold: int = 16  # luma below this counts as black border
    reader: str = "pyav"  # video backend: pyav | decord
    cut_check_threshold: float = 0.35  # colour-histogram change (0..1) between clip frames that is a cut; 0: off
    max_decode_errors: int = 10  # a film with more decoder errors (corrupt data) is skipped and reported
    workers: int = 2  # parallel film workers
    flow: str = "dis"  # optical flow: dis (OpenCV) | raft (torchvision, weights on disk)
    raft_weights: str = ""  # local RAFT weights file when flow=raft
    flow_threshold: float = 0.2  # relative threshold r dropping near-static pixels
    flow_robust_quantile: float = 0.99  # "max" in r * max is this quantile of a frame pair's magnitudes (1 = max)
    flow_preset: str = "medium"  # DIS preset: ultrafast | fast | medium
    flow_device: str = "cpu"  # RAFT device: cpu | cuda
    motion_levels: int = 5
    refit_motion_bins: bool = False  # refit level edges on all clips on a rerun (default: keep the stored edges)
    caption: bool = False  # run the VLM captioner after cutting
    captioner: CaptionConfig = field(default_factory=CaptionConfig)  # see animegamer.data.captioning
    characters: str = ""  # character registry JSON (name -> reference images)


@dataclass
class SpriteWorldConfig:
    kind: str = "spriteworld"
    output_dir: str = "outputs/spriteworld/data"  # clips/, clips.jsonl (+ .meta.json), games/ land here
    seed: int = 0  # films, poses and the train/test split all follow from it
    num_films: int = 32  # films = chains of consecutive shots with continuity
    shots_per_film: int = 12  # consecutive 2 s shots (clips) per film
    height: int = 64  # frame size of the drawn clips (3:2 like 480x720)
    width: int = 96
    num_frames: int = 17  # frames per clip (4k + 1, as the VAE wants)
    fps: int = 8
    characters: list[str] = field(default_factory=lambda: ["Qiqi", "Momo", "Kai", "Luna"])  # protagonists, in turn
    test_fraction: float = 0.2  # fraction of films held out as test games (split by film)
    blocking: str = "fixed"  # fixed: each action staged one way (a small model learns its motion) | anchored: fixed,
    # and paths start from one spot whatever their speed (the first frame does not tell it) | free: random
    speed_jitter: float = 0.1  # a clip's speed = its adverb's x a factor in [1 - j, 1 + j] that no word says
    # the memory world (animegamer.spriteworld.memory): each film's own home and a friend who follows, drawn
    # but never said; instructions leave out what earlier turns fixed (still / later / here / home / friend)
    memory: bool = False
    # "Momo:fly" (an action) or "Qiqi:Luna" (a friend): pairs no training film has, only held-out games
    held_out_pairs: list[str] = field(default_factory=list)
    workers: int = 2  # threads writing mp4s (each encode runs in its own ffmpeg process)


@dataclass
class SpriteWorldPretrainConfig:
    """SpriteWorld's stand-in for CogVideoX-2B pretraining (scripts/spriteworld/pretrain.py)."""

    kind: str = "spriteworld_pretrain"
    output_dir: str = "outputs/spriteworld/models/CogVideoX"  # the CogVideoX folder written (diffusers layout)
    report_dir: str = "outputs/spriteworld/pretrain"  # losses (metrics.jsonl), run config, preview contact sheets
    seed: int = 0
    clip: CLIPConfig = field(default_factory=CLIPConfig)  # frozen CLIP of the stage (a) features filled on the way
    data: DataConfig = field(default_factory=DataConfig)  # manifest (train split), stage (a) features_dir, clip size
    t5_dim: int = 32  # width of the frozen tiny random T5 (text_encoder/) built into output_dir
    text_tokens: int = 226  # T5 tokens per caption = the transformer's max_text_seq_length (= shot tokens N later)
    vae_channels: list[int] = field(default_factory=lambda: [8, 16, 32, 32])  # 3 downsamples: 8x spatial
    latent_channels: int = 16  # as CogVideoX-2B
    vae: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=600, batch_size=8, lr=3e-3))
    vae_frames: int = 1  # frames per VAE training window (1 or 4k + 1; 1 = single pictures, the cheapest on a CPU)
    # frames per latent frame (CogVideoX: 4). A tiny VAE averages a fast figure away inside each group of 4 frames;
    # 1 keeps every frame (a single-picture VAE applied frame by frame) at the cost of 4x the transformer's tokens
    vae_temporal_compression: int = 4
    kl_weight: float = 1.0e-6  # KL of the posterior against N(0, I), small as in latent-diffusion VAEs
    foreground_weight: float = 0.0  # extra loss weight of pixels off their place's empty scenery (the figures)
    vae_latent_noise: float = 0.0  # Gaussian noise (x the latents' std) added before decoding, in training
    resume_vae: bool = False  # keep output_dir/vae + data.features_dir of an earlier run; only the transformer trains
    num_heads: int = 4  # transformer attention heads
    head_dim: int = 16  # width per head; hidden = num_heads * head_dim
    num_layers: int = 4
    patch_size: int = 2  # latent pixels per token side (CogVideoX-2B: 2); 4 on a 4x VAE keeps 8x8 pixels per token
    transformer: TrainConfig = field(default_factory=lambda: TrainConfig(max_steps=500, batch_size=8, lr=1e-3))
    condition_dropout: float = 0.1  # empty-prompt rate, so the base model has an unconditional branch
    # From scratch, a small model learns to guess the scene from the faint signal left in very noisy latents and
    # never reads the caption, so samples from pure noise ignore it. At the last timestep (zero terminal SNR) the
    # latent is pure noise and only the caption says what to draw: the first text_warmup_steps train there only,
    # and pure_noise_fraction of every later batch stays there.
    text_warmup_steps: int = 0
    pure_noise_fraction: float = 0.0
    # extra weight of the latent cells figures fall in, in the transformer's loss (the background fills the rest)
    figure_loss_weight: float = 0.0
    # extra weight of the cells a figure enters or leaves from one latent frame to the next (the motion), from the
    # same figure masks as figure_loss_weight
    motion_loss_weight: float = 0.0
    feature_batch: int = 8  # clips per batch while filling the features (batched VAE encode is much faster)
    threads: int = 1  # torch CPU threads; 1 runs best on shared cores (OpenMP spin-waits otherwise)


@dataclass
class SpriteWorldLLMConfig:
    """SpriteWorld's stand-in for Mistral-7B's pretraining (scripts/spriteworld/pretrain_llm.py): the tiny random
    Mistral trained as a causal LM, all parameters, on the text of SpriteWorld's training films."""

    kind: str = "spriteworld_llm"
    pretrained: str = "outputs/spriteworld/models/Mistral"  # the tiny random Mistral + tokenizer it starts from
    output_dir: str = "outputs/spriteworld/models/Mistral"  # the pretrained model + tokenizer (may be `pretrained`)
    report_dir: str = "outputs/spriteworld/pretrain_llm"  # losses (metrics.jsonl), config.yaml, summary.json
    manifest: str = "outputs/spriteworld/data/train.jsonl"  # its meta's train films (all films without a split)
    seq_len: int = 192  # tokens per training window (a film's text is ~1400 tokens)
    train: TrainConfig = field(
        default_factory=lambda: TrainConfig(max_steps=600, batch_size=8, lr=3e-3, lr_scheduler="cosine",
                                            lr_warmup_steps=30)
    )
    seed: int = 0
    threads: int = 0  # torch CPU threads; 0: as the caller


@dataclass
class SpriteWorldRunConfig:
    """The whole SpriteWorld chain (scripts/spriteworld/train.py): data -> pretraining -> stages a-d -> eval."""

    kind: str = "spriteworld_run"
    output_dir: str = "outputs/spriteworld"  # every step's outputs; the step configs' outputs/spriteworld moves here
    ship_dir: str = "checkpoints/spriteworld"  # the shipped checkpoint; configs' checkpoints/spriteworld moves here
    configs: str = "configs/spriteworld"  # data, pretrain, stage_a/b/c, ablations YAMLs of the chain
    steps: list[str] = field(  # which steps to run, in this order
        default_factory=lambda: ["data", "pretrain", "pretrain_llm", "stage_a", "stage_b", "stage_c", "stage_d",
                                 "ship", "evaluate"]
    )
    mistral_hidden: int = 128  # hidden size of the tiny random Mistral (animegamer.tiny.build_tiny_mistral)
    seed: int = 0  # seed of the tiny random CLIP and Mistral
    threads: int = 1  # torch CPU threads; 1 runs best on shared cores (OpenMP spin-waits otherwise)
    # key=value overrides per step (data, pretrain, stage_a ... stage_d, ablations), e.g. the mini run's sizes
    overrides: dict[str, list[str]] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    max_steps: int = 1000  # optimizer steps
    batch_size: int = 1  # per device
    grad_accum: int = 1
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_scheduler: str = "constant"  # constant | cosine | linear (all with warm-up)
    lr_warmup_steps: int = 0
    max_grad_norm: float = 1.0
    mixed_precision: str = "no"  # no | bf16 | fp16 (accelerate)
    checkpoint_every: int = 500
    keep_checkpoints: int = 3  # older step checkpoints are deleted
    log_every: int = 10
    report_to: str = "tensorboard"  # tensorboard | wandb | csv | none
    resume: str = ""  # "" | latest | path to a checkpoint dir
    # resume even if a process's saved RNG state is missing or unreadable (fresh random streams, recorded in
    # run_info.json); otherwise that is an error, since the resume would not be exact
    allow_rng_reset: bool = False
    compile: bool = False  # torch.compile the trained blocks


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
    warmup_steps: int = 10000  # encoder-only steps before LoRA joins (paper: 10k, then 80k joint)
    condition_dropout: float = 0.1  # probability of the unconditional shot representation (for CFG)
    motion_loss_weight: float = 0.0  # latent cells that change between latent frames weigh 1 + this (0: plain MSE)
    motion_threshold: float = 0.2  # a cell changes when a channel moves more than this (latent std units)


@dataclass
class StageBConfig:
    kind: str = "stage_b"
    output_dir: str = "outputs/stage_b"
    seed: int = 42
    mllm: MLLMConfig = field(default_factory=MLLMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=5e-5, max_steps=15000))
    shot_targets: str = "outputs/stage_a/shot_targets"  # cached s_a targets from the stage (a) encoder
    mse_weight: float = 0.5  # alpha
    cosine_weight: float = 0.0  # beta (0.5 in the cosine-loss ablation)
    max_seq_len: int = 2048  # sequences are padded (or packed) to at most this many tokens
    pack_sequences: bool = False


@dataclass
class StageCConfig:
    kind: str = "stage_c"
    output_dir: str = "outputs/stage_c"
    seed: int = 42
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    mllm: MLLMConfig = field(default_factory=MLLMConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=5e-5, max_steps=10000))
    stage_a_checkpoint: str = "outputs/stage_a/checkpoints/latest"  # decoder LoRA + motion embedding to start from
    stage_b_checkpoint: str = "outputs/stage_b/checkpoints/latest"  # frozen MLLM adapters + resamplers
    # stage (a) s_a of every clip: the teacher-forced history turns the MLLM sees, as in stage (b) training
    shot_targets: str = "outputs/stage_a/shot_targets"
    predictions_cache: str = ""  # MLLM predictions, made once (a TensorStore); "" = <output_dir>/predictions
    max_seq_len: int = 2048  # a window longer than this loses its oldest history turns, as in stage (b)
    condition_dropout: float = 0.1  # probability of the unconditional (zero) shot representation, for CFG
    motion_loss_weight: float = 0.0  # as stage (a): changing latent cells weigh 1 + this (0: the paper's plain MSE)
    motion_threshold: float = 0.2


@dataclass
class StageDConfig:
    kind: str = "stage_d"
    output_dir: str = "outputs/stage_d"
    seed: int = 42
    decoder: DecoderConfig = field(default_factory=DecoderConfig)  # as stage (c): its trained parts load into it
    data: DataConfig = field(default_factory=DataConfig)  # manifest (the conditions' motion levels), num_workers
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=1e-4, max_steps=2000))
    stage_c_checkpoint: str = "outputs/stage_c/checkpoints/latest"  # the teacher, and where the student starts
    conditions: str = "outputs/stage_c/predictions"  # s_a to distil on (TensorStore): stage (c)'s MLLM predictions
    student_steps: int = 4  # K: the student's sampling steps (one transformer call each, no CFG)
    # the teacher's sampler (scheduler ddim: its deterministic ODE) and the clip size; the guidance schedule is folded
    teacher: SamplingConfig = field(default_factory=lambda: SamplingConfig(scheduler="ddim"))


# --------------------------------------------------------------------------------------------
# Inference, evaluation, benchmark
# --------------------------------------------------------------------------------------------


@dataclass
class SamplingConfig:
    scheduler: str = "dpm"  # dpm (CogVideoXDPMScheduler) | ddim (CogVideoXDDIMScheduler)
    steps: int = 50
    guidance_scale: float = 6.0
    dynamic_cfg: bool = True  # cosine ramp of the guidance scale over the steps
    dynamic_cfg_exponent: float = 5.0
    guidance_steps_fraction: float = 1.0  # apply CFG on the first fraction of steps only (fast preset)
    height: int = 480
    width: int = 720
    num_frames: int = 17
    fps: int = 8
    seed: int = 42
    # standard: the fields above | fast: 12 steps, CFG on the first 40% | distilled: the stage (d) student's recorded
    # few-step sampler, one call per step and no CFG (decoder_checkpoint must be a stage (d) run)
    preset: str = "standard"
    # diffusers' cache hooks on the transformer: none | first_block | taylorseer | pab | faster | magcache
    cache: str = "none"
    # first_block: block 0's relative residual change under which the rest is reused; magcache: accumulated error
    cache_threshold: float = 0.05
    magcache_ratios: str = ""  # magcache: the JSON of scripts/calibrate_magcache.py for this decoder and sampler


@dataclass
class InferenceConfig:
    kind: str = "inference"
    output_dir: str = "outputs/game"  # results of inference_MLLM.py, read by inference_Decoder.py
    seed: int = 42
    game: str = "game_demo/demo.txt"  # instruction file, one turn per line
    clip: CLIPConfig = field(default_factory=CLIPConfig)
    t5: T5Config = field(default_factory=T5Config)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    mllm: MLLMConfig = field(default_factory=MLLMConfig)
    decoder_checkpoint: str = "outputs/stage_c/checkpoints/latest"  # trained decoder parts (or stage a)
    mllm_checkpoint: str = "outputs/stage_b/checkpoints/latest"  # trained MLLM parts
    history_turns: int = 1  # K; 1 reproduces the released demo
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    device: str = "auto"  # auto | cpu | cuda
    offload: str = "none"  # none | sequential (each model on the GPU only while it runs)
    fast: bool = False  # the fast preset (fewer steps, partial CFG)
    compile: bool = False  # torch.compile the decoder's transformer blocks (first turn compiles; same outputs)
    compile_vae: bool = False  # torch.compile the VAE decoder too: 2x faster decode, ~150 s to compile (GPU)
    merge_lora: bool = False  # fold the LoRA into the base weights at load (same outputs up to weight rounding)
    fp8: bool = False  # FP8 transformer linears via torchao, dynamic scaling (LoRA merged first; Ada/Hopper GPU)
    compat: str = "fixed"  # converted official weights: released (the release's numerics, quirks included) | fixed


BENCHMARK_SYSTEM_PROMPT = "You write stories for an anime life-simulation game. You answer with tag lines only."

BENCHMARK_PROMPT = """Write story {number} of a life-simulation game for the anime character {character}: \
{turns} turns, each one short animation shot of {character}'s daily life. Consecutive turns continue one coherent \
day (places and activities follow from each other), with a mix of calm and energetic moments.

Answer with exactly {turns} lines, one per turn, and nothing else. Each line holds exactly these tags in this order:
<S>character</S><MD>motion</MD><EV>environment</EV><ML>motion level</ML><MA>manner</MA><SC>social</SC>\
<ET>entertainment</ET><ST>stamina</ST>
- S: always {character}
- MD: what {character} does, a short verb phrase without semicolons
- EV: where and when, a short phrase without semicolons
- ML: how much motion the shot shows, 1 (almost still) to 5 (fast, large movement)
- MA: how the motion is done, one adverb (may be empty)
- SC: 1 if {character} interacts with someone, else 0
- ET: 1 if it is a leisure or fun activity, else 0
- ST: -1 if the activity is tiring, 1 if it is restful or restoring (sleeping, eating), else 0

Example line:
<S>{character}</S><MD>run along the river</MD><EV>park at sunset</EV><ML>4</ML><MA>happily</MA><SC>0</SC>\
<ET>1</ET><ST>-1</ST>"""

BENCHMARK_RETRY_PROMPT = """Your answer was rejected: {error}
Answer again with exactly {turns} tag lines for {character} and nothing else."""

JUDGE_SYSTEM_PROMPT = "You are a strict, consistent evaluator of an anime life-simulation game."

JUDGE_PROMPT = """A player gave the anime character {character} one instruction per turn, and the game answered each \
with a short animation. {references}You see {frames_per_turn} frames of each turn's animation, in order:

{instructions}

Rate the whole game from 1 (very poor) to 10 (excellent) on:
- overall: overall quality as an animated life simulation
- instruction_following: each animation shows what its instruction asks (action and background)
- contextual_coherence: consecutive animations fit together as one continuing story
- character_consistency: the character keeps the same look, as {character}, in every turn

Answer with only a JSON object holding the four integer scores, for example:
{"overall": 6, "instruction_following": 7, "contextual_coherence": 5, "character_consistency": 8}"""

JUDGE_RETRY_PROMPT = "Your previous answer was rejected: {error}. Answer with only the JSON object of four scores."


@dataclass
class JudgeConfig:
    backend: dict[str, Any] = field(default_factory=dict)  # animegamer.llm.make_backend spec; empty = no judge
    frames_per_turn: int = 2  # frames sampled evenly from each turn's clip and shown to the judge
    max_image_side: int = 360  # frames are downscaled to at most this many pixels on the long side; 0 = as is
    max_attempts: int = 3  # requests per game before a malformed judgement is recorded as failed
    temperature: float = 0.0
    max_tokens: int = 256
    system_prompt: str = JUDGE_SYSTEM_PROMPT
    prompt: str = JUDGE_PROMPT  # placeholders: {character} {references} {frames_per_turn} {instructions}
    retry_prompt: str = JUDGE_RETRY_PROMPT  # appended to the prompt after a malformed answer; {error}


@dataclass
class BenchmarkGenConfig:
    kind: str = "benchmark_gen"
    output_dir: str = "data/benchmark"  # <output_dir>/<game_id>/{game.txt,ground_truth.jsonl} + benchmark.json
    characters: list[str] = field(default_factory=list)  # character names (the paper: 20 characters)
    games_per_character: int = 10  # the paper: about 2,000 rounds = 20 characters x 10 games x 10 turns
    turns: int = 10  # shots per game
    backend: dict[str, Any] = field(  # animegamer.llm.make_backend spec (openai endpoint or local transformers)
        default_factory=lambda: {"type": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "default"}
    )
    max_attempts: int = 3  # answers per game; a game whose answers all fail validation is reported, not stored
    temperature: float = 0.9
    max_tokens: int = 2048
    system_prompt: str = BENCHMARK_SYSTEM_PROMPT
    prompt: str = BENCHMARK_PROMPT  # placeholders: {character} {turns} {number}
    retry_prompt: str = BENCHMARK_RETRY_PROMPT  # sent after a rejected answer; {error} {turns} {character}


@dataclass
class EvalConfig:
    kind: str = "eval"
    output_dir: str = "outputs/eval"
    seed: int = 42
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    benchmark: str = "data/benchmark"  # benchmark dir, games/ dir (<film>.jsonl) or clips.jsonl (its test films)
    # animegamer | gc_baseline | reconstruction | ground_truth | random | majority (animegamer.eval.systems)
    systems: list[str] = field(default_factory=lambda: ["animegamer"])
    metrics_clip: CLIPConfig = field(default_factory=CLIPConfig)  # CLIP used by CLIP-I / CLIP-T
    clip_scale: float = 1.0  # CLIP-I / CLIP-T scale: 1 = raw cosine, 100 = the "CLIPScore" convention
    frames_per_clip: int = 0  # frames sampled evenly per clip for CLIP-I / CLIP-T / DreamSim; 0 = every frame
    dreamsim_path: str = ""  # local DreamSim weights; empty = reported as missing
    max_games: int = 0  # 0 = all
    judge: JudgeConfig = field(default_factory=JudgeConfig)  # LLM-as-judge; skipped while judge.backend is empty
    # Clip manifest of the training data: its meta gives the flow settings + level bin edges that ACC-F / MAE-F
    # measure generated clips with, and its train split the majority classes; "" = compare predicted levels
    motion_manifest: str = ""
    motion_calibration_clips: int = 64  # clips flow-scored to refit the level edges when the meta has none by flow
    characters: str = ""  # character registry JSON; its images are the CLIP-I reference when a game has no GT clips
    stage_a_checkpoint: str = "outputs/stage_a/checkpoints/latest"  # encoder + decoder of gc_baseline/reconstruction
    gc_reference: str = ""  # gc_baseline's fixed reference frame: "" = mid-grey, an image file, or a dir of <name>.png
    gc_motion_level: int = 0  # gc_baseline's motion level: 0 = most common level of motion_manifest, else 1..5


@dataclass
class AblationStep:
    script: str = "stage_a"  # the stage script to run: stage_a | stage_b | stage_c (scripts/train_<script>.py)
    config: str = ""  # its run config (relative to the working directory)
    overrides: list[str] = field(default_factory=list)  # key=value overrides of that run


@dataclass
class AblationRow:
    name: str = ""  # row id; its evaluation goes to <output_dir>/<name>
    label: str = ""  # row label in the table ("" = name)
    train: list[AblationStep] = field(default_factory=list)  # training runs in order (skipped with skip_train)
    eval_config: str = ""  # this row's evaluation config ("" = the table's eval_config)
    eval_overrides: list[str] = field(default_factory=list)  # on top of eval_config and the common eval_overrides


@dataclass
class AblationsConfig:
    kind: str = "ablations"
    output_dir: str = "outputs/ablations"  # <name>/ per row, table.md / table.csv for the whole table
    eval_config: str = "configs/eval.yaml"  # evaluation config every row starts from
    eval_overrides: list[str] = field(default_factory=list)  # applied to every row's evaluation
    train_overrides: list[str] = field(default_factory=list)  # applied to every training run (e.g. train.max_steps)
    launcher: str = ""  # "" = stage scripts run in this process; else a command prefix, e.g. "accelerate launch"
    skip_train: bool = False  # evaluate existing checkpoints only
    rows: list[AblationRow] = field(default_factory=list)


@dataclass
class BenchmarkConfig:
    kind: str = "benchmark"
    output_dir: str = "outputs/benchmark"  # benchmark.json, benchmark.md (and profile_turn.txt) land here
    seed: int = 0
    preset: str = "tiny"  # model sizes: full (CogVideoX-2B + VAE, Mistral-7B, ViT-H/T5-XXL widths) | tiny
    device: str = "cuda"  # cuda | cpu
    warmup: int = 2  # untimed calls before every measurement (compilation, allocator, autotuning)
    repeats: int = 5  # timed calls per measurement; the median is reported
    parts: list[str] = field(default_factory=lambda: ["turn", "stage_a", "stage_b"])  # what to measure
    dtype: str = "bf16"  # frozen weights of the decoder and the MLLM in the timed turn
    history_turns: int = 3  # K earlier turns in the timed turn's MLLM prompt
    sampling: SamplingConfig = field(default_factory=SamplingConfig)  # the timed turn (paper: 480x720, 17, 50 steps)
    merge_lora: bool = True  # our path at inference: LoRA folded into the base weights
    compile: bool = True  # our path: torch.compile of the transformer blocks (decoder at inference; training steps)
    compile_vae: bool = False  # our path: torch.compile of the VAE decoder too (about 150 s of compiling on an H100)
    low_memory: bool = True  # also time a whole turn with offload=sequential + VAE tiling, and its peak memory
    profile: bool = False  # write a torch.profiler table of one turn on our path (profile_turn.txt)
    stage_a: str = "configs/stage_a.yaml"  # run config of the timed stage (a) steps (batch, LoRA, precision...)
    stage_b: str = "configs/stage_b.yaml"  # the same for stage (b); model sizes always come from the preset
    train_warmup: int = 3  # untimed optimizer steps before the timed ones
    train_repeats: int = 10  # timed optimizer steps
    matmul_size: int = 8192  # n of the n^3 matmul that measures peak FLOP/s (bf16 on a GPU, fp32 on a CPU)
    threads: int = 0  # torch CPU threads; 0 = torch's default (tiny models on shared cores run best on 1)
    # keep the other parts of an existing output_dir/benchmark.json of the same preset and device, so the parts can
    # run as separate commands (each part's MFU stays relative to the peak measured in its own run)
    merge_existing: bool = False


SCHEMAS: dict[str, type] = {
    "stage_a": StageAConfig,
    "stage_b": StageBConfig,
    "stage_c": StageCConfig,
    "stage_d": StageDConfig,
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
    "SamplingConfig.preset": ("standard", "fast", "distilled"),  # "Class.field": a name other fields also use
    "resampler_gelu": ("tanh", "erf"),
}


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")  # every config's ``device``
_NON_NEGATIVE = ("history_turns",)  # counts checked wherever a config has them


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
    "T5Config",
    "TrainConfig",
    "config_help",
    "load_config",
    "to_yaml",
]
