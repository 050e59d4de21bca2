"""The run configs, one per ``kind``: data preparation, SpriteWorld's world, pretraining and chain, training stages
(a)-(d), inference, evaluation, ablations and the benchmark, built from :mod:`animegamer.config.parts`. Each field's
trailing comment is its ``--help`` text (:mod:`animegamer.config_docs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

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
from animegamer.config.prompts import (
    BENCHMARK_PROMPT,
    BENCHMARK_RETRY_PROMPT,
    BENCHMARK_SYSTEM_PROMPT,
    CAPTION_CHARACTERS_PROMPT,
    CAPTION_DESCRIBE_PROMPT,
    CAPTION_RETRY_PROMPT,
    CAPTION_SYSTEM_PROMPT,
    JUDGE_PROMPT,
    JUDGE_RETRY_PROMPT,
    JUDGE_SYSTEM_PROMPT,
)


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
    # with memory: "back" for the place before this one (2+ turns back, past a one-turn history) and films that
    # make short trips out and back (memory.COME_BACK); off: the memory world of the shipped checkpoint, bit for bit
    back: bool = False
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
                                 "stage_e", "ship", "evaluate"]
    )
    # rows of ablations.yaml the evaluate step runs (empty = all); the tables keep the other rows' earlier results
    # unless this call also ran ship (a new checkpoint: earlier rows are dropped)
    eval_rows: list[str] = field(default_factory=list)
    mistral_hidden: int = 128  # hidden size of the tiny random Mistral (animegamer.tiny.build_tiny_mistral)
    seed: int = 0  # seed of the tiny random CLIP and Mistral
    threads: int = 1  # torch CPU threads; 1 runs best on shared cores (OpenMP spin-waits otherwise)
    # key=value overrides per step (data, pretrain, stage_a ... stage_d, ablations), e.g. the mini run's sizes
    overrides: dict[str, list[str]] = field(default_factory=dict)


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
    # the decoder reads s_a + N(0, (shot_noise * std(s_a))^2) (std over the batch, no gradient; 0: the paper's
    # clean s_a), so it learns to render a shot a little off, as the MLLM predicts them; shot targets stay clean
    shot_noise: float = 0.0
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
    # the MLLM reads each history shot as s_a + N(0, (history_noise * std)^2) (std over the batch's history shots,
    # no gradient; 0: the paper's clean teacher-forced history), so reading a turn back survives a game, whose
    # history is the MLLM's own predicted shots; targets stay clean
    history_noise: float = 0.0


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
    # the history the MLLM predicts from: teacher (stage a targets, the paper's) | own (its own predictions from
    # the film's start, as a game plays; animegamer.data.stage_c)
    history: str = "teacher"
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


@dataclass
class CausalDecoderConfig:
    channels: list[int] = field(default_factory=lambda: [256, 128, 64])  # width per 2x upsampling level, coarse first
    blocks_per_level: int = 3  # memory blocks (2D convs + the previous frame) before each upsampling


@dataclass
class StageEConfig:
    kind: str = "stage_e"
    output_dir: str = "outputs/stage_e"
    seed: int = 42
    vae: str = "checkpoints/CogVideoX-2b"  # CogVideoX folder whose vae/config.json fixes the latent layout
    small_decoder: CausalDecoderConfig = field(default_factory=CausalDecoderConfig)
    data: DataConfig = field(default_factory=DataConfig)  # manifest + features_dir (latents) + the clip settings
    train: TrainConfig = field(default_factory=lambda: TrainConfig(lr=3e-4, max_steps=20000, batch_size=4))
    crop_size: int = 16  # side of the random training crop in latent cells (x the spatial factor in pixels); 0 = all


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
    # clips rendered in one batch, across games (every clip from its own seed: batching changes float rounding
    # only; a CPU renders batches of 8 about twice as fast); s/turn is then the batch's time shared by its clips
    render_batch: int = 1
    clip_games: int = -1  # games whose clips are written as mp4 under output_dir/clips: -1 = all, 0 = none
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
