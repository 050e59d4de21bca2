"""The building blocks of every run config: the models (CLIP, T5, the shot encoder, the decoder, the MLLM), the
data, the optimisation loop and the sampler. A field made with :func:`knob` carries its ``--help`` text
(:mod:`animegamer.config_docs`); :func:`animegamer.config.load_config` fills them from YAML."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field
from typing import Any, Literal

# the choices of the fields that share them; a field's type says which values it takes (OmegaConf checks them)
Dtype = Literal["fp32", "bf16", "fp16"]
CacheMethod = Literal["none", "first_block", "taylorseer", "pab", "faster", "magcache"]  # sampling.cache.CACHE_METHODS


def knob(default: Any = MISSING, *, help: str, factory: Any = MISSING, device: bool = False, min: float | None = None
         ) -> Any:
    """A config field with its ``--help`` text; ``factory`` makes a mutable default. ``device``: the value must be
    a device (auto, cpu, cuda, cuda:N, mps); ``min``: a number >= min. Checked by
    :func:`animegamer.config.load_config`; the choices of a field are its ``Literal`` type."""
    metadata: dict[str, Any] = {"help": help}
    if device:
        metadata["device"] = True
    if min is not None:
        metadata["min"] = min
    if factory is not MISSING:
        return field(default_factory=factory, metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class CLIPConfig:
    arch: str = knob("ViT-H-14", help="open_clip model name (a registered config; tests register tiny ones)")
    checkpoint: str = knob(
        "checkpoints/clip/open_clip_vit_h14.safetensors",
        help="local weights file (.safetensors/.bin)",
    )
    model_config: str = knob("", help="JSON of a custom open_clip model config to register first (tiny models)")
    image_size: int = knob(224, help="input resolution; frames are resized + centre-cropped to it")
    layer: int = knob(-2, help="residual block whose output is used; -2 = second-to-last, as in the paper")
    drop_cls: bool = knob(True, help="drop the class token (256 patch tokens remain for ViT-H-14 at 224 px)")


@dataclass
class T5Config:
    path: str = knob("checkpoints/CogVideoX-2b", help="diffusers-layout dir (text_encoder/, tokenizer/) or a T5 dir")
    text_encoder_subfolder: str = knob("text_encoder", help="\"\" when `path` is the T5 directory itself")
    tokenizer_subfolder: str = "tokenizer"
    max_length: int = knob(226, help="padded/truncated to this many tokens, as CogVideoX does")


@dataclass
class EncoderConfig:
    clip_dim: int = knob(1280, help="width of the CLIP tokens (1280 ViT-H-14, 768 ViT-B-16)")
    clip_tokens: int = knob(256, help="number of CLIP tokens after dropping CLS (256 ViT-H-14/224, 196 ViT-B-16)")
    text_dim: int = knob(4096, help="T5 hidden size (4096 for T5-XXL)")
    text_tokens: int = knob(226, help="T5 sequence length")
    hidden_dim: int = knob(1920, help="output width = decoder hidden size (1920 for CogVideoX-2B)")
    num_tokens: int = knob(226, help="output tokens N of s_a; replaces the decoder's 226 text tokens")
    projector: Literal["mlp", "linear"] = knob("mlp", help="CLIP projector: mlp (Linear-GELU-Linear) | linear")
    fusion: Literal["concat", "add", "cross_attn"] = knob("concat", help="how CLIP and text tokens meet")
    token_mixing: bool = knob(True, help="Linear over the token axis (226 + N_clip -> N); off = released decoder")
    cross_attn_heads: int = knob(8, help="heads of the cross_attn fusion variant")
    frame: Literal["first", "random"] = knob(
        "first",
        help="which frame feeds CLIP: first | random (applied in the data path)",
    )


@dataclass
class DecoderConfig:
    pretrained: str = knob("checkpoints/CogVideoX-2b", help="diffusers-layout dir: transformer/, vae/, scheduler/")
    lora_rank: int = knob(64, help="LoRA rank on the attention projections")
    lora_alpha: int = knob(64, help="LoRA alpha (scale alpha / rank)")
    lora_targets: list[str] = field(default_factory=lambda: ["to_q", "to_k", "to_v", "to_out.0"])
    motion_scope: bool = knob(True, help="inject the motion level into the timestep embedding")
    num_motion_levels: int = knob(5, help="motion levels 1..num_motion_levels")
    motion_embed_dim: int = knob(256, help="width of the sinusoidal motion-level embedding")
    motion_guidance: bool = knob(False, help="condition dropout drops the level too (null level 0), CFG amplifies it")
    gradient_checkpointing: bool = knob(False, help="recompute transformer blocks in backward (off: a batch of one "
                                        "17x480x720 clip fits without, 16 GB peak, 58% MFU vs 42% on an H100)")
    dtype: Dtype = knob("bf16", help="weights/compute dtype of the frozen parts: fp32 | bf16 | fp16")
    vae_slicing: bool = knob(False, help="decode the VAE batch one sample at a time")
    vae_tiling: bool = knob(False, help="decode the VAE in spatial tiles (less memory)")


@dataclass
class MLLMConfig:
    pretrained: str = knob(
        "checkpoints/Mistral-7B-v0.1",
        help="transformers dir with a MistralForCausalLM and tokenizer",
    )
    vocabulary: Literal["paper", "released"] = knob(
        "paper",
        help="special-token spelling: paper (<VS><ANIME_i>) | released (<img><frame_i>)",
    )
    num_slots: int = knob(226, help="query slots per turn (= shot tokens N)")
    shot_dim: int = knob(1920, help="width of a shot representation s_a")
    resampler_layers: int = knob(2, help="MLP depth of the input/output resamplers")
    resampler_gelu: Literal["tanh", "erf"] = knob("tanh", help="tanh (our checkpoints) | erf (the release, converted)")
    lora_rank: int = 32
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_targets: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    gradient_checkpointing: bool = True
    dtype: Dtype = knob("bf16", help="fp32 | bf16 | fp16")
    attn_implementation: Literal["eager", "sdpa", "flash_attention_2"] = knob(
        "sdpa",
        help="eager | sdpa | flash_attention_2",
    )
    max_instruction_tokens: int = knob(96, help="an instruction longer than this is rejected before any model runs")
    kv_cache: Literal["static", "dynamic"] = knob(
        "static",
        help="the turn's KV cache: static (fixed buffers, one host sync per turn) | dynamic (transformers' cache)",
    )
    shot_residual: Literal["none", "previous"] = knob(
        "none",
        help="none (the paper: the slots' final hidden states give the shot) | previous (they give the shot's change "
             "from the last history turn's shot, which is added back; a turn without history: the shot itself). "
             "Stage (b) trains it and records it in the checkpoint, which the game then follows",
    )


@dataclass
class DataConfig:
    manifest: str = knob("data/clips.jsonl", help="JSONL clip manifest (animegamer.data.manifest)")
    features_dir: str = knob("data/features", help="precomputed VAE latents / CLIP / T5 shards")
    height: int = 480
    width: int = 720
    num_frames: int = knob(17, help="frames per clip fed to the VAE (4k + 1)")
    fps: int = 8
    history_turns: int = knob(3, min=0, help="K: earlier turns in the MLLM window")
    all_history_lengths: bool = knob(
        False,
        help="also train each turn with every shorter history, down to none: a model that always sees the previous "
             "shot can learn to copy it instead of reading the instruction, and then fails on a game's first turn",
    )
    reach_field: str = knob(
        "",
        help="a clip ``extra`` field holding how many turns back the latest shot showing what the turn's instruction "
             "leaves unsaid is (SpriteWorld's memory world: ``reach``); windows whose history is shorter are not "
             "trained, since their target cannot be read from what they show. \"\" keeps every window",
    )
    sequence_stride: int = knob(1, help="step between consecutive stage (b) windows of a film")
    min_sequence_turns: int = knob(1, help="drop films shorter than this")
    split: Literal["train", "test", "all"] = knob(
        "train",
        help="which split of the manifest to use: train | test | all",
    )
    test_fraction: float = knob(0.2, help="fraction held out (by film, or 8:2 in time for a single film)")
    split_by: Literal["film", "time"] = knob("film", help="film | time (the paper's single-film ablation)")
    num_workers: int = knob(2, help="DataLoader workers")
    clip_frames: int = knob(
        4,
        help="frames per clip whose CLIP tokens are precomputed: index 0 = first, rest for frame=random",
    )
    feature_dtype: Dtype = knob(
        "bf16",
        help="storage dtype of precomputed CLIP/T5 tokens (latents stay fp32): fp32 | bf16 | fp16",
    )
    identity_swaps: int = knob(
        0, min=0,
        help="T5 tokens of at most this many identity swaps per clip (its caption with another character named "
             "in place of each it names besides its subject; animegamer.data.name_swaps) are precomputed, for "
             "stage (b)'s identity term; 0: none",
    )


@dataclass
class TrainConfig:
    max_steps: int = knob(1000, help="optimizer steps")
    batch_size: int = knob(1, help="per device")
    grad_accum: int = 1
    lr: float = 2e-4
    weight_decay: float = 0.0
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    lr_scheduler: Literal["constant", "cosine", "linear"] = knob(
        "constant",
        help="constant | cosine | linear (all with warm-up)",
    )
    lr_warmup_steps: int = 0
    max_grad_norm: float = 1.0
    mixed_precision: Literal["no", "bf16", "fp16"] = knob("no", help="no | bf16 | fp16 (accelerate)")
    checkpoint_every: int = 500
    keep_checkpoints: int = knob(3, help="older step checkpoints are deleted")
    log_every: int = 10
    report_to: Literal["tensorboard", "wandb", "csv", "none"] = knob(
        "tensorboard",
        help="tensorboard | wandb | csv | none",
    )
    resume: str = knob("", help="\"\" | latest | path to a checkpoint dir")
    allow_rng_reset: bool = knob(
        False,
        help="resume even if a process's saved RNG state is missing or unreadable (fresh random streams, recorded in "
             "run_info.json); otherwise that is an error, since the resume would not be exact",
    )
    allow_recipe_change: bool = knob(
        False,
        help="resume even if the recipe changed since the checkpoint (optimizer, schedule, batch, data, model, "
             "number of processes; recorded in run_info.json); otherwise that is an error naming the keys",
    )
    compile: bool = knob(False, help="torch.compile the trained blocks")


@dataclass
class SamplingConfig:
    scheduler: Literal["dpm", "ddim"] = knob("dpm", help="dpm (CogVideoXDPMScheduler) | ddim (CogVideoXDDIMScheduler)")
    steps: int = 50
    guidance_scale: float = 6.0
    dynamic_cfg: bool = knob(True, help="cosine ramp of the guidance scale over the steps")
    dynamic_cfg_exponent: float = 5.0
    guidance_steps_fraction: float = knob(1.0, help="apply CFG on the first fraction of steps only (fast preset)")
    height: int = 480
    width: int = 720
    num_frames: int = 17
    fps: int = 8
    seed: int = 42
    preset: Literal["standard", "fast", "distilled"] = knob(
        "standard",
        help="standard: the fields above | fast: 12 steps, CFG on the first 40% | distilled: the stage (d) student's "
             "recorded few-step sampler, one call per step and no CFG (decoder_checkpoint must be a stage (d) run)",
    )
    cache: CacheMethod = knob(
        "none",
        help="diffusers' cache hooks on the transformer: none | first_block | taylorseer | pab | faster | magcache",
    )
    cache_threshold: float = knob(
        0.05,
        help="first_block: block 0's relative residual change under which the rest is reused; magcache: accumulated "
             "error",
    )
    magcache_ratios: str = knob(
        "",
        help="magcache: the JSON of scripts/calibrate_magcache.py for this decoder and sampler",
    )
    vae: Literal["full", "small"] = knob(
        "full", help="latents -> frames: full (the CogVideoX VAE) | small (the stage (e) causal decoder)"
    )
    small_decoder: str = knob("", help="vae=small: the stage (e) run, checkpoint or its small_decoder/ directory")
