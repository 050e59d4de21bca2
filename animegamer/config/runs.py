"""The run configs of playing and measuring, one per ``kind``: inference, evaluation (and its judge and benchmark
games), ablations and the speed benchmark, built from :mod:`animegamer.config.parts`. The training stages are in
:mod:`animegamer.config.stages`, data preparation in :mod:`animegamer.config.prepare`, SpriteWorld in
:mod:`animegamer.config.spriteworld`. A field's ``--help`` text is its ``knob(help=...)``
(:mod:`animegamer.config_docs`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from animegamer.config.parts import (
    CLIPConfig,
    DecoderConfig,
    Dtype,
    EncoderConfig,
    MLLMConfig,
    SamplingConfig,
    T5Config,
    knob,
)
from animegamer.config.prompts import (
    BENCHMARK_PROMPT,
    BENCHMARK_RETRY_PROMPT,
    BENCHMARK_SYSTEM_PROMPT,
    JUDGE_PROMPT,
    JUDGE_RETRY_PROMPT,
    JUDGE_SYSTEM_PROMPT,
)


@dataclass
class InferenceConfig:
    kind: str = "inference"
    output_dir: str = knob("outputs/game", help="results of inference_MLLM.py, read by inference_Decoder.py")
    seed: int = 42
    game: str = knob("game_demo/demo.txt", help="instruction file, one turn per line")
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    mllm: MLLMConfig = knob(  # shapes: config.recorded.MLLM_SHAPE
        factory=MLLMConfig, help="the MLLM; its shape comes from mllm_checkpoint's own files (mllm_layout.json)",
    )
    decoder_checkpoint: str = knob("outputs/stage_c/checkpoints/latest", help="trained decoder parts (or stage a)")
    mllm_checkpoint: str = knob("outputs/stage_b/checkpoints/latest", help="trained MLLM parts")
    history_turns: int = knob(
        -1, min=-1,
        help="K earlier turns the MLLM reads; -1: as it was trained (mllm_checkpoint's mllm_layout.json; 3 "
             "where it records none)",
    )
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    device: str = knob("auto", device=True, help="auto | cpu | cuda | cuda:N | mps")
    offload: Literal["none", "sequential"] = knob(
        "none",
        help="none | sequential (each model on the GPU only while it runs)",
    )
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
        help="the transformer's large linears in FP8 via torchao, one dynamic scale per tensor, under compile "
        "(needs compile: true; LoRA merged first; Ada/Hopper GPU)",
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
    clip: CLIPConfig = knob(factory=CLIPConfig, help="stage (a)'s CLIP image features, for gc_baseline/reconstruction")
    t5: T5Config = knob(factory=T5Config, help="stage (a)'s T5 text features, for gc_baseline/reconstruction")
    encoder: EncoderConfig = knob(
        factory=EncoderConfig, help="the encoder's shape where stage_a_checkpoint is empty (untrained)",
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
    retrain_game: list[str] = knob(
        factory=list,
        help="stage (b) overrides of a game of this row's own: a stage (b) from the table's stage_b_config with "
        "them and a stage (c) on it from stage_c_config, in <output_dir>/<name>/stage_b and stage_c, the game "
        "evaluated with both (in place of `train`; empty: none)",
    )


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
    stage_b_config: str = knob("configs/stage_b.yaml", help="the stage (b) run config of rows' retrain_game")
    stage_c_config: str = knob("configs/stage_c.yaml", help="the stage (c) run config of rows' retrain_game")
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
    compile_backend: str = knob(
        "inductor",
        help="torch.compile backend of the compiled rows (fast_path); aot_eager checks their structure on a CPU",
    )
    fast_path_rows: list[str] = knob(
        factory=list,
        help="the fast_path rows to run, by name (animegamer.bench.fastpath.ROWS); empty: every row this device can",
    )
    student_steps: int = knob(
        4,
        help="the fast_path student's steps (its timesteps from the 50-step DDIM grid, as stage (d) segments it): "
        "4 as configs/stage_d.yaml, 2 as the shipped SpriteWorld student",
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
