"""The run configs, one per ``kind``: data preparation, SpriteWorld's world, pretraining and chain, training stages
(a)-(d), inference, evaluation, ablations and the benchmark, built from :mod:`animegamer.config.parts`. A field's
``--help`` text is its ``knob(help=...)`` (:mod:`animegamer.config_docs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from animegamer.config.parts import (
    CLIPConfig,
    DataConfig,
    DecoderConfig,
    Dtype,
    EncoderConfig,
    MLLMConfig,
    SamplingConfig,
    T5Config,
    TrainConfig,
    knob,
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

    backend: dict[str, Any] = knob(
        factory=dict,
        help="animegamer.llm.make_backend spec: {type: openai, base_url, model, api_key} for any OpenAI-compatible "
             "server (vLLM, LMDeploy), or {type: transformers, path, device, dtype} for a local vision-language model"
             " directory",
    )
    num_frames: int = knob(8, help="frames sampled evenly from each clip and shown to the model")
    image_size: int = knob(448, help="longer side of every image sent (frames and character references)")
    max_attempts: int = knob(
        3,
        help="tries per step; an answer still invalid after them marks the clip caption_status=invalid",
    )
    max_tokens: int = 200
    temperature: float = 0.2
    workers: int = knob(
        4,
        help="clips captioned concurrently (HTTP backends; a local transformers model always uses 1)",
    )
    system_prompt: str = CAPTION_SYSTEM_PROMPT
    # step 1 uses {num_references} {reference_list} {num_frames} {names}; step 2 {num_frames} {characters}
    # {motion_level} {num_levels}; the retry {error}
    characters_prompt: str = knob(CAPTION_CHARACTERS_PROMPT, help="step 1: which reference characters appear")
    describe_prompt: str = knob(CAPTION_DESCRIBE_PROMPT, help="step 2: the structured tag line given the motion level")
    retry_prompt: str = knob(CAPTION_RETRY_PROMPT, help="follow-up message after an invalid answer")


@dataclass
class PrepareDataConfig:
    kind: str = "prepare_data"
    output_dir: str = knob("data", help="clips/, clips.jsonl, features/ land here")
    films: list[str] = knob(factory=list, help="film files or directories of films")
    height: int = 480
    width: int = 720
    clip_seconds: float = knob(2.0, help="fixed clip length")
    fps: int = knob(8, help="clips are resampled to this frame rate")
    scene_threshold: float = knob(27.0, help="PySceneDetect ContentDetector threshold")
    min_scene_seconds: float = knob(2.0, help="scenes shorter than one clip are dropped")
    crop_black_borders: bool = True
    black_threshold: int = knob(16, help="luma below this counts as black border")
    reader: Literal["pyav", "decord"] = knob("pyav", help="video backend: pyav | decord")
    cut_check_threshold: float = knob(
        0.35,
        help="colour-histogram change (0..1) between clip frames that is a cut; 0: off",
    )
    max_decode_errors: int = knob(10, help="a film with more decoder errors (corrupt data) is skipped and reported")
    workers: int = knob(2, help="parallel film workers")
    flow: Literal["dis", "raft"] = knob("dis", help="optical flow: dis (OpenCV) | raft (torchvision, weights on disk)")
    raft_weights: str = knob("", help="local RAFT weights file when flow=raft")
    flow_threshold: float = knob(0.2, help="relative threshold r dropping near-static pixels")
    flow_robust_quantile: float = knob(
        0.99,
        help="\"max\" in r * max is this quantile of a frame pair's magnitudes (1 = max)",
    )
    flow_preset: Literal["ultrafast", "fast", "medium"] = knob("medium", help="DIS preset: ultrafast | fast | medium")
    flow_device: str = knob("cpu", device=True, help="RAFT device: cpu | cuda")
    motion_levels: int = 5
    refit_motion_bins: bool = knob(
        False,
        help="refit level edges on all clips on a rerun (default: keep the stored edges)",
    )
    caption: bool = knob(False, help="run the VLM captioner after cutting")
    captioner: CaptionConfig = knob(factory=CaptionConfig, help="see animegamer.data.captioning")
    characters: str = knob("", help="character registry JSON (name -> reference images)")


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
    max_seq_len: int = knob(2048, help="sequences are padded (or packed) to at most this many tokens")
    pack_sequences: bool = False
    history_noise: float = knob(
        0.0, min=0,
        help="the MLLM reads each history shot as s_a + N(0, (history_noise * std)^2) (std over the batch's history "
             "shots, no gradient; 0: the paper's clean teacher-forced history), so reading a turn back survives a "
             "game, whose history is the MLLM's own predicted shots; targets stay clean",
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


@dataclass
class InferenceConfig:
    kind: str = "inference"
    output_dir: str = knob("outputs/game", help="results of inference_MLLM.py, read by inference_Decoder.py")
    seed: int = 42
    game: str = knob("game_demo/demo.txt", help="instruction file, one turn per line")
    clip: CLIPConfig = field(default_factory=CLIPConfig)
    t5: T5Config = field(default_factory=T5Config)
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    mllm: MLLMConfig = knob(  # shapes: config.recorded.MLLM_SHAPE
        factory=MLLMConfig, help="the MLLM; its shape comes from the stage (b) config recorded with mllm_checkpoint",
    )
    decoder_checkpoint: str = knob("outputs/stage_c/checkpoints/latest", help="trained decoder parts (or stage a)")
    mllm_checkpoint: str = knob("outputs/stage_b/checkpoints/latest", help="trained MLLM parts")
    history_turns: int = knob(
        -1, min=-1,
        help="K earlier turns the MLLM reads; -1: as it was trained (the stage (b) config recorded with "
             "mllm_checkpoint; 3 without one)",
    )
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    device: str = knob("auto", device=True, help="auto | cpu | cuda | cuda:N | mps")
    offload: Literal["none", "sequential"] = knob(
        "none",
        help="none | sequential (each model on the GPU only while it runs)",
    )
    fast: bool = knob(False, help="= sampling.preset=fast (fewer steps, partial CFG); folded into sampling.preset "
                                  "when the config loads")
    compile: bool = knob(
        False,
        help="torch.compile the decoder's transformer blocks (first turn compiles; same outputs)",
    )
    compile_vae: bool = knob(
        False,
        help="torch.compile the VAE decoder too: 2x faster decode, ~150 s to compile (GPU)",
    )
    merge_lora: bool = knob(
        False,
        help="fold the LoRA into the base weights at load (same outputs up to weight rounding)",
    )
    fp8: bool = knob(
        False,
        help="FP8 transformer linears via torchao, dynamic scaling (LoRA merged first; Ada/Hopper GPU)",
    )
    compat: Literal["released", "fixed"] = knob(
        "fixed",
        help="converted official weights: released (the release's numerics, quirks included) | fixed",
    )


@dataclass
class JudgeConfig:
    backend: dict[str, Any] = knob(factory=dict, help="animegamer.llm.make_backend spec; empty = no judge")
    frames_per_turn: int = knob(2, help="frames sampled evenly from each turn's clip and shown to the judge")
    max_image_side: int = knob(
        360,
        help="frames are downscaled to at most this many pixels on the long side; 0 = as is",
    )
    max_attempts: int = knob(3, help="requests per game before a malformed judgement is recorded as failed")
    temperature: float = 0.0
    max_tokens: int = 256
    system_prompt: str = JUDGE_SYSTEM_PROMPT
    prompt: str = knob(JUDGE_PROMPT, help="placeholders: {character} {references} {frames_per_turn} {instructions}")
    retry_prompt: str = knob(JUDGE_RETRY_PROMPT, help="appended to the prompt after a malformed answer; {error}")


@dataclass
class BenchmarkGenConfig:
    kind: str = "benchmark_gen"
    output_dir: str = knob(
        "data/benchmark",
        help="<output_dir>/<game_id>/{game.txt,ground_truth.jsonl} + benchmark.json",
    )
    characters: list[str] = knob(factory=list, help="character names (the paper: 20 characters)")
    games_per_character: int = knob(10, help="the paper: about 2,000 rounds = 20 characters x 10 games x 10 turns")
    turns: int = knob(10, help="shots per game")
    backend: dict[str, Any] = knob(
        factory=lambda: {"type": "openai", "base_url": "http://127.0.0.1:8000/v1", "model": "default"},
        help="animegamer.llm.make_backend spec (openai endpoint or local transformers)",
    )
    max_attempts: int = knob(
        3,
        help="answers per game; a game whose answers all fail validation is reported, not stored",
    )
    temperature: float = 0.9
    max_tokens: int = 2048
    system_prompt: str = BENCHMARK_SYSTEM_PROMPT
    prompt: str = knob(BENCHMARK_PROMPT, help="placeholders: {character} {turns} {number}")
    retry_prompt: str = knob(BENCHMARK_RETRY_PROMPT, help="sent after a rejected answer; {error} {turns} {character}")


@dataclass
class EvalConfig:
    kind: str = "eval"
    output_dir: str = "outputs/eval"
    seed: int = 42
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    benchmark: str = knob(
        "data/benchmark",
        help="benchmark dir, games/ dir (<film>.jsonl) or clips.jsonl (its test films)",
    )
    systems: list[str] = knob(
        factory=lambda: ["animegamer"],
        help="animegamer | gc_baseline | reconstruction | ground_truth | random | majority (animegamer.eval.systems)",
    )
    metrics_clip: CLIPConfig = knob(factory=CLIPConfig, help="CLIP used by CLIP-I / CLIP-T")
    clip_scale: float = knob(1.0, help="CLIP-I / CLIP-T scale: 1 = raw cosine, 100 = the \"CLIPScore\" convention")
    frames_per_clip: int = knob(
        0,
        help="frames sampled evenly per clip for CLIP-I / CLIP-T / DreamSim; 0 = every frame",
    )
    dreamsim_path: str = knob("", help="local DreamSim weights; empty = reported as missing")
    max_games: int = knob(0, help="0 = all")
    render_batch: int = knob(
        1,
        help="clips rendered in one batch, across games (every clip from its own seed: batching changes float "
             "rounding only; a CPU renders batches of 8 about twice as fast); s/turn is then the batch's time shared "
             "by its clips",
    )
    clip_games: int = knob(-1, help="games whose clips are written as mp4 under output_dir/clips: -1 = all, 0 = none")
    judge: JudgeConfig = knob(factory=JudgeConfig, help="LLM-as-judge; skipped while judge.backend is empty")
    motion_manifest: str = knob(
        "",
        help="Clip manifest of the training data: its meta gives the flow settings + level bin edges that ACC-F / "
             "MAE-F measure generated clips with, and its train split the majority classes; \"\" = compare predicted "
             "levels",
    )
    motion_calibration_clips: int = knob(
        64,
        help="clips flow-scored to refit the level edges when the meta has none by flow",
    )
    characters: str = knob(
        "",
        help="character registry JSON; its images are the CLIP-I reference when a game has no GT clips",
    )
    stage_a_checkpoint: str = knob(
        "outputs/stage_a/checkpoints/latest",
        help="encoder + decoder of gc_baseline/reconstruction",
    )
    gc_reference: str = knob(
        "",
        help="gc_baseline's fixed reference frame: \"\" = mid-grey, an image file, or a dir of <name>.png",
    )
    gc_motion_level: int = knob(
        0,
        help="gc_baseline's motion level: 0 = most common level of motion_manifest, else 1..5",
    )


@dataclass
class AblationStep:
    script: str = knob(
        "stage_a",
        help="the stage script to run: stage_a | stage_b | stage_c (scripts/train_<script>.py)",
    )
    config: str = knob("", help="its run config (relative to the working directory)")
    overrides: list[str] = knob(factory=list, help="key=value overrides of that run")


@dataclass
class AblationRow:
    name: str = knob("", help="row id; its evaluation goes to <output_dir>/<name>")
    label: str = knob("", help="row label in the table (\"\" = name)")
    train: list[AblationStep] = knob(factory=list, help="training runs in order (skipped with skip_train)")
    eval_config: str = knob("", help="this row's evaluation config (\"\" = the table's eval_config)")
    eval_overrides: list[str] = knob(factory=list, help="on top of eval_config and the common eval_overrides")


@dataclass
class AblationsConfig:
    kind: str = "ablations"
    output_dir: str = knob("outputs/ablations", help="<name>/ per row, table.md / table.csv for the whole table")
    eval_config: str = knob("configs/eval.yaml", help="evaluation config every row starts from")
    eval_overrides: list[str] = knob(factory=list, help="applied to every row's evaluation")
    train_overrides: list[str] = knob(factory=list, help="applied to every training run (e.g. train.max_steps)")
    launcher: str = knob(
        "",
        help="\"\" = stage scripts run in this process; else a command prefix, e.g. \"accelerate launch\"",
    )
    skip_train: bool = knob(False, help="evaluate existing checkpoints only")
    rows: list[AblationRow] = field(default_factory=list)


@dataclass
class BenchmarkConfig:
    kind: str = "benchmark"
    output_dir: str = knob("outputs/benchmark", help="benchmark.json, benchmark.md (and profile_turn.txt) land here")
    seed: int = 0
    preset: Literal["full", "tiny"] = knob(
        "tiny",
        help="model sizes: full (CogVideoX-2B + VAE, Mistral-7B, ViT-H/T5-XXL widths) | tiny",
    )
    device: str = knob("cuda", device=True, help="cuda | cpu")
    warmup: int = knob(2, help="untimed calls before every measurement (compilation, allocator, autotuning)")
    repeats: int = knob(5, help="timed calls per measurement; the median is reported")
    parts: list[str] = knob(factory=lambda: ["turn", "stage_a", "stage_b"], help="what to measure")
    dtype: Dtype = knob("bf16", help="frozen weights of the decoder and the MLLM in the timed turn")
    history_turns: int = knob(3, min=0, help="K earlier turns in the timed turn's MLLM prompt")
    sampling: SamplingConfig = knob(factory=SamplingConfig, help="the timed turn (paper: 480x720, 17, 50 steps)")
    merge_lora: bool = knob(True, help="our path at inference: LoRA folded into the base weights")
    compile: bool = knob(
        True,
        help="our path: torch.compile of the transformer blocks (decoder at inference; training steps)",
    )
    compile_vae: bool = knob(
        False,
        help="our path: torch.compile of the VAE decoder too (about 150 s of compiling on an H100)",
    )
    low_memory: bool = knob(
        True,
        help="also time a whole turn with offload=sequential + VAE tiling, and its peak memory",
    )
    profile: bool = knob(False, help="write a torch.profiler table of one turn on our path (profile_turn.txt)")
    stage_a: str = knob(
        "configs/stage_a.yaml",
        help="run config of the timed stage (a) steps (batch, LoRA, precision...)",
    )
    stage_b: str = knob("configs/stage_b.yaml", help="the same for stage (b); model sizes always come from the preset")
    train_warmup: int = knob(3, help="untimed optimizer steps before the timed ones")
    train_repeats: int = knob(10, help="timed optimizer steps")
    matmul_size: int = knob(8192, help="n of the n^3 matmul that measures peak FLOP/s (bf16 on a GPU, fp32 on a CPU)")
    threads: int = knob(0, help="torch CPU threads; 0 = torch's default (tiny models on shared cores run best on 1)")
    merge_existing: bool = knob(
        False,
        help="keep the other parts of an existing output_dir/benchmark.json of the same preset and device, so the "
             "parts can run as separate commands (each part's MFU stays relative to the peak measured in its own run)",
    )
