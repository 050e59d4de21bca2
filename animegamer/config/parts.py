"""The building blocks of every run config: the models (CLIP, T5, the shot encoder, the decoder, the MLLM), the
data, the optimisation loop and the sampler. Each field's trailing comment is its ``--help`` text
(:mod:`animegamer.config_docs`); :func:`animegamer.config.load_config` fills them from YAML."""

from __future__ import annotations

from dataclasses import dataclass, field


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
    # a clip ``extra`` field holding how many turns back the latest shot showing what the turn's instruction leaves
    # unsaid is (SpriteWorld's memory world: ``reach``); windows whose history is shorter are not trained, since
    # their target cannot be read from what they show. "" keeps every window
    reach_field: str = ""
    sequence_stride: int = 1  # step between consecutive stage (b) windows of a film
    min_sequence_turns: int = 1  # drop films shorter than this
    split: str = "train"  # which split of the manifest to use: train | test | all
    test_fraction: float = 0.2  # fraction held out (by film, or 8:2 in time for a single film)
    split_by: str = "film"  # film | time (the paper's single-film ablation)
    num_workers: int = 2  # DataLoader workers
    clip_frames: int = 4  # frames per clip whose CLIP tokens are precomputed: index 0 = first, rest for frame=random
    feature_dtype: str = "bf16"  # storage dtype of precomputed CLIP/T5 tokens (latents stay fp32): fp32 | bf16 | fp16


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
    vae: str = "full"  # latents -> frames: full (the CogVideoX VAE) | small (the stage (e) causal decoder)
    small_decoder: str = ""  # vae=small: the stage (e) run, checkpoint or its small_decoder/ directory
