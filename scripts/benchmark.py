"""Benchmark: seconds per game turn and training throughput, our path against the plain-library path, in one run.

    python scripts/benchmark.py --preset full --device cuda     # CogVideoX-2B + VAE, Mistral-7B: random weights
    python scripts/benchmark.py --preset tiny --device cpu      # tiny models, CI-size (about a minute)
    python scripts/benchmark.py --config configs/benchmark.yaml parts=[turn] compile=false profile=true

Without ``--config``, ``--preset`` picks configs/benchmark.yaml (full) or configs/tiny/benchmark.yaml (tiny).
The models are built from configs written in code (animegamer.bench.models) straight on the device, so no
pretrained directory is needed; training settings (batch, gradient checkpointing, LoRA, precision) come from the
stage configs named by ``stage_a`` / ``stage_b``.

Measured, after warm-up (CUDA events on a GPU, perf_counter on a CPU), with peak memory per part:

- ``turn``: one game turn (MLLM prefill + slots, state decoding, denoising, VAE decode) on the plain path and on
  ours, the ratio, a check that both give the same outputs, the ``fast`` preset, and a turn with offload + VAE
  tiling (animegamer.bench.turn);
- ``options``: the real-time options of the rendering side by side: presets standard / fast / distilled, each
  cache hook (MagCache calibrated in the run), FP8 on a capable GPU; seconds, transformer calls per clip, the time
  to the first streamed frames and where a turn's time goes (MLLM from ``turn``, denoising, VAE decode, writing the
  mp4 + gif) (animegamer.bench.options);
- ``decode``: latents -> frames, the CogVideoX VAE against the stage (e) small causal decoder (eager, and compiled
  with ``compile``) on the same 4-step latents: whole decode, first chunk, time to the first frames of a 4-step turn
  (animegamer.bench.decode);
- ``fast_path``: the half-second turn: the game's whole turn (play_turn: MLLM, the 4-step student, the streamed
  decode) eager and compiled, bf16 and FP8 (per-tensor on the large linears, as the ``fp8`` option; per-row on all),
  with the stage (e) small decoder, part by part and end to end, the time to the first frames and the peak memory;
  the VAE decode and writing the clip timed beside (animegamer.bench.fastpath);
- ``official``: random weights in the official release's on-disk layout (SAT decoder directory, peft agent .bin,
  tokenizer at the release's ids) at the preset's sizes, converted by scripts/convert_official.py's code (seconds,
  peak RSS), then one turn in ``compat=released`` (the release's sampler, fp16 decoder, 200-token state
  generation: the stand-in for the official code, which cannot be installed here) and in ``compat=fixed`` with our
  fast path, with the ratio and the call counts (animegamer.bench.official);
- ``stage_a`` / ``stage_b``: one optimizer step of each stage, eager and (with ``compile``) compiled: clips/s and
  tokens/s with MFU against a matmul peak measured in the same run (animegamer.bench.training).

Writes ``output_dir/benchmark.json`` (every number, the settings and the conventions) and
``output_dir/benchmark.md`` (the tables, also printed). A part that fails is reported under ``errors`` and the
others still run; the exit status is then 1.
"""

from __future__ import annotations

import gc
import platform
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import torch

from animegamer.bench.decode import bench_decode
from animegamer.bench.fastpath import FastPathSettings, bench_fast_path, rows_to_run
from animegamer.bench.models import (
    ARCHITECTURES,
    ParameterCounts,
    build_decoder,
    build_encoder,
    build_mllm,
    build_small_decoder,
    build_tokenizer,
)
from animegamer.bench.official import bench_official
from animegamer.bench.options import PAPER_STEPS, bench_options
from animegamer.bench.report import markdown
from animegamer.bench.timing import device_name, matmul_peak_flops
from animegamer.bench.training import StepSettings, bench_stage_a, bench_stage_b
from animegamer.bench.turn import TurnSettings, bench_turn
from animegamer.cli import parse_config
from animegamer.config import BenchmarkConfig, ConfigError, StageAConfig, StageBConfig, load_config
from animegamer.io import atomic_write_json, atomic_write_text
from animegamer.recipes.stage_a import EncoderDecoder, compute_loss

ROOT = Path(__file__).resolve().parents[1]
PRESET_CONFIGS = {"full": ROOT / "configs" / "benchmark.yaml", "tiny": ROOT / "configs" / "tiny" / "benchmark.yaml"}
PARTS = ("turn", "options", "decode", "fast_path", "official", "stage_a", "stage_b")
FORMAT = "animegamer-benchmark-v1"

CONVENTIONS = {
    "timing": "Times are wall-clock seconds per call after warm-up (CUDA events + synchronize on a GPU, "
    "perf_counter on a CPU), medians of the timed calls; a turn is the sum of its parts' medians, except the "
    "offload turn, timed whole.",
    "memory": "Peak memory is torch.cuda.max_memory_allocated over each part on a GPU, and the process RSS "
    "sampled every 2 ms on a CPU (there it includes every model the process holds).",
    "mfu": "MFU = model FLOPs / time / peak FLOP/s, the peak being the best of 10 n^3 matmuls in this run (bf16 "
    "on a GPU, fp32 on a CPU). DiT: forward FLOPs from torch's FlopCounterMode (matmuls + attention), x3 for a "
    "training step. MLLM: 6 N T + 12 L d sum(S^2) (nanoGPT/PaLM; N = weights of the per-token linears, LoRA "
    "included). Recomputation under gradient checkpointing is not counted.",
    "plain": "Plain path: transformers generate for the MLLM (1 token for the prefill, 10 for the states), the "
    "diffusers CogVideoX transformer called once per CFG branch, eager, LoRA unmerged; training steps eager. Ours: "
    "one prefill + cached constrained state decoding, both CFG branches in one batch, LoRA merged and transformer "
    "blocks compiled when enabled.",
}


def device_info(device: torch.device) -> dict:
    import diffusers
    import peft
    import transformers

    info = {
        "type": device.type,
        "name": device_name(device),
        "torch": torch.__version__,
        "diffusers": diffusers.__version__,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["memory_gb"] = props.total_memory / 1024**3
        info["cuda"] = torch.version.cuda
    return info


def release(device: torch.device) -> None:
    """Drop compiled graphs (they hold the modules) and cached blocks before the next part builds its models."""
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def load_earlier(path: Path, result: dict) -> dict | None:
    """An earlier benchmark.json of the same preset on the same device (what ``merge_existing`` keeps), else None."""
    import json

    if not path.is_file():
        return None
    earlier = json.loads(path.read_text())
    same = (earlier.get("format"), earlier.get("preset"), earlier.get("device", {}).get("name")) == (
        FORMAT, result["preset"], result["device"]["name"]
    )
    if not same:
        print(f"[benchmark] not merging {path}: another preset or device", file=sys.stderr)
        return None
    return earlier


def merge_existing(result: dict, earlier: dict, measured: set[str]) -> None:
    """Copy into ``result`` the parts of ``earlier`` that are not among the ``measured`` ones."""
    dates = {**{part: earlier["date"] for part in PARTS}, **earlier.get("merged_from", {})}
    merged = {}
    for part in ("turn", "options", "decode", "fast_path", "official"):
        if part not in measured and part in earlier:
            result[part] = earlier[part]
            merged[part] = dates[part]
    for stage in ("stage_a", "stage_b"):
        if stage not in measured and stage in earlier.get("training", {}):
            result["training"][stage] = earlier["training"][stage]
            merged[stage] = dates[stage]
    for name, counts in earlier.get("parameters", {}).items():
        result["parameters"].setdefault(name, counts)
    if merged:
        result["merged_from"] = merged
    else:  # every earlier part has been measured again since the last save
        result.pop("merged_from", None)


def parse(argv: list[str] | None) -> tuple[BenchmarkConfig, float]:
    """The run's config and its GPU memory cap in GB (0: none)."""
    def flags(parser):
        parser.add_argument("--preset", choices=sorted(PRESET_CONFIGS), help="model sizes (picks the config too)")
        parser.add_argument("--device", choices=["cuda", "cpu"], help="shortcut for device=...")
        parser.add_argument("--memory-cap-gb", type=float, default=0.0,
                            help="cap torch's GPU memory at this many GB (a smaller GPU's budget, e.g. 24); 0: none")

    cfg, args = parse_config(BenchmarkConfig, __doc__, argv, extra=flags)
    overrides = list(args.overrides)
    if args.preset:
        overrides.append(f"preset={args.preset}")
    if args.device:
        overrides.append(f"device={args.device}")
    path = args.config or PRESET_CONFIGS[args.preset or "tiny"]
    try:
        cfg = load_config(path, overrides, schema=BenchmarkConfig)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    unknown = [p for p in cfg.parts if p not in PARTS]
    if unknown or cfg.device not in ("cuda", "cpu"):
        print(f"error: parts must be among {list(PARTS)} and device cuda|cpu (got {cfg.parts}, {cfg.device})",
              file=sys.stderr)
        raise SystemExit(2)
    if cfg.preset == "full" and "official" in cfg.parts and cfg.device != "cuda":
        print("error: parts=[official] at --preset full builds and plays the 7B + 2B release on a GPU; use --device "
              "cuda (or --preset tiny on a CPU)", file=sys.stderr)
        raise SystemExit(2)
    try:  # a misspelt row is refused before any model is built
        rows_to_run("cpu", cfg.compile, tuple(cfg.fast_path_rows))
    except ValueError as exc:
        print(f"error: fast_path_rows: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    if cfg.device == "cuda" and not torch.cuda.is_available():
        print("error: device=cuda but no CUDA device is visible; use --device cpu (with --preset tiny)",
              file=sys.stderr)
        raise SystemExit(2)
    if args.memory_cap_gb < 0:
        print(f"error: --memory-cap-gb must be >= 0 (got {args.memory_cap_gb})", file=sys.stderr)
        raise SystemExit(2)
    if not 1 <= cfg.student_steps <= PAPER_STEPS:
        print(f"error: student_steps must be in 1..{PAPER_STEPS} (got {cfg.student_steps})", file=sys.stderr)
        raise SystemExit(2)
    return cfg, args.memory_cap_gb


def memory_cap(device: torch.device, cap_gb: float) -> dict:
    """Cap torch's memory on the GPU at ``cap_gb`` (``torch.cuda.set_per_process_memory_fraction``); what was set.
    On a CPU nothing is capped (recorded so)."""
    if not cap_gb:
        return {"gb": None}
    if device.type != "cuda":
        return {"gb": cap_gb, "applied": False, "why": "no GPU: the cap is a GPU memory fraction"}
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(cap_gb * 1024**3 / total, 1.0)
    # the call wants an index: "cuda" alone names no device
    torch.cuda.set_per_process_memory_fraction(fraction, device.index if device.index is not None else
                                               torch.cuda.current_device())
    return {"gb": cap_gb, "applied": True, "fraction": fraction}


def main(argv: list[str] | None = None) -> dict:
    cfg, cap_gb = parse(argv)
    started = time.perf_counter()
    device = torch.device(cfg.device)
    arch = ARCHITECTURES[cfg.preset]
    say = lambda msg: print(f"[benchmark] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    if cfg.threads > 0:
        torch.set_num_threads(cfg.threads)
    torch.manual_seed(cfg.seed)
    capped = memory_cap(device, cap_gb)
    stage_a_cfg = load_config(cfg.stage_a, schema=StageAConfig)
    stage_b_cfg = load_config(cfg.stage_b, schema=StageBConfig)

    peak_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    say(f"{arch.name} models on {device_name(device)}; peak matmul {cfg.matmul_size}^3 {peak_dtype}")
    peak = matmul_peak_flops(device, peak_dtype, cfg.matmul_size)
    result: dict = {
        "format": FORMAT,
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "preset": cfg.preset,
        "device": device_info(device),
        "settings": {
            "warmup": cfg.warmup,
            "repeats": cfg.repeats,
            "train_warmup": cfg.train_warmup,
            "train_repeats": cfg.train_repeats,
            "compile": cfg.compile,
            "compile_vae": cfg.compile_vae,
            "compile_backend": cfg.compile_backend,
            "fast_path_rows": list(cfg.fast_path_rows),
            "merge_lora": cfg.merge_lora,
            "dtype": cfg.dtype,
            "threads": torch.get_num_threads(),
            "parts": list(cfg.parts),
            "stage_a_config": cfg.stage_a,
            "stage_b_config": cfg.stage_b,
            "memory_cap": capped,
        },
        "conventions": CONVENTIONS,
        "peak": {"dtype": str(peak_dtype).removeprefix("torch."), "size": cfg.matmul_size, "tflops": peak / 1e12},
        "parameters": {},
        "training": {},
        "errors": {},
    }
    counts = ParameterCounts()
    out = Path(cfg.output_dir)
    earlier = load_earlier(out / "benchmark.json", result) if cfg.merge_existing else None
    done: set[str] = set()

    def save() -> str:
        """benchmark.json + benchmark.md with the parts measured so far (a run killed later keeps them)."""
        result["parameters"] = dict(counts.counts)
        result["wall_s"] = time.perf_counter() - started
        if earlier is not None:
            merge_existing(result, earlier, done)
        atomic_write_json(out / "benchmark.json", result)
        table = markdown(result)
        atomic_write_text(out / "benchmark.md", table)
        return table

    # The inference models: the trained stages' LoRA settings, frozen weights in cfg.dtype, the VAE with the decoder.
    def inference_decoder():
        decoder_cfg = stage_a_cfg.decoder
        decoder_cfg.dtype, decoder_cfg.gradient_checkpointing = cfg.dtype, False
        return build_decoder(arch, decoder_cfg, device, with_vae=True, seed=cfg.seed)

    def inference_mllm(tokenizer_dir: Path):
        mllm_cfg = stage_b_cfg.mllm
        mllm_cfg.dtype, mllm_cfg.gradient_checkpointing = cfg.dtype, False
        return build_mllm(arch, mllm_cfg, device, tokenizer_dir, seed=cfg.seed)

    with tempfile.TemporaryDirectory() as tmp:
        tokenizer_dir = build_tokenizer(Path(tmp) / "tokenizer", arch.tokenizer_vocab)
        for part in cfg.parts:
            say(f"{part} ...")
            try:
                if part == "turn":
                    decoder, mllm = inference_decoder(), inference_mllm(tokenizer_dir)
                    counts.add("decoder_transformer", decoder.transformer)
                    counts.add("vae", decoder.vae)
                    counts.add("mllm", mllm)
                    settings = TurnSettings(
                        sampling=cfg.sampling,
                        history_turns=cfg.history_turns,
                        warmup=cfg.warmup,
                        repeats=cfg.repeats,
                        compile=cfg.compile,
                        compile_vae=cfg.compile_vae,
                        merge_lora=cfg.merge_lora,
                        low_memory=cfg.low_memory,
                        seed=cfg.seed,
                    )
                    result["turn"] = bench_turn(
                        decoder, mllm, settings, device, peak, cfg.output_dir if cfg.profile else None
                    )
                    del decoder, mllm
                elif part == "options":
                    decoder = inference_decoder()
                    g = torch.Generator().manual_seed(cfg.seed)
                    shape = decoder.null_shot_embeds(1).shape  # (1, N, H): a random shot representation
                    shot = torch.randn(shape, generator=g).to(decoder.dtype)
                    result["options"] = bench_options(decoder, shot, torch.tensor([3]), cfg.sampling, device,
                                                      cfg.warmup, cfg.repeats)
                    del decoder
                elif part == "decode":
                    decoder = inference_decoder()
                    g = torch.Generator().manual_seed(cfg.seed)
                    shot = torch.randn(decoder.null_shot_embeds(1).shape, generator=g).to(decoder.dtype)
                    result["decode"] = bench_decode(decoder, shot, torch.tensor([3]), cfg.sampling, device,
                                                    cfg.warmup, cfg.repeats, cfg.compile, cfg.preset)
                    del decoder
                elif part == "fast_path":
                    decoder, mllm = inference_decoder(), inference_mllm(tokenizer_dir)
                    small = build_small_decoder(decoder, cfg.preset, seed=cfg.seed)
                    counts.add("small_decoder", small)
                    settings = FastPathSettings(cfg.sampling, cfg.history_turns, cfg.warmup, cfg.repeats,
                                                cfg.compile, cfg.compile_backend, cfg.seed, tuple(cfg.fast_path_rows),
                                                cfg.student_steps)

                    def on_row(section):  # each row saved as it ends: a run stopped later keeps them
                        result["fast_path"] = section
                        save()

                    result["fast_path"] = bench_fast_path(decoder, mllm, small, settings, device, peak,
                                                          Path(cfg.output_dir) if cfg.profile else None, on_row)
                    del decoder, mllm, small
                elif part == "official":
                    # at full size the release files and their conversion take about 40 GB of the temp dir's disk
                    with tempfile.TemporaryDirectory(dir=tmp) as work:
                        result["official"] = bench_official(
                            cfg.preset, device, Path(work), cfg.sampling.steps, cfg.dtype, cfg.warmup, cfg.repeats,
                            cfg.compile, seed=cfg.seed,
                        )
                elif part == "stage_a":
                    run_cfg = load_config(cfg.stage_a, schema=StageAConfig)
                    encoder = build_encoder(arch, run_cfg.encoder, device, seed=cfg.seed)
                    decoder = build_decoder(arch, run_cfg.decoder, device, with_vae=False, seed=cfg.seed)
                    decoder.copy_text_projection_to(encoder.text_proj)
                    model = EncoderDecoder(encoder, decoder)
                    counts.add("encoder", encoder)
                    steps = StepSettings(cfg.train_warmup, cfg.train_repeats, cfg.compile)
                    stage = bench_stage_a(model, run_cfg, compute_loss, arch, device, peak, steps)
                    stage["settings"]["config"] = cfg.stage_a
                    result["training"]["stage_a"] = stage
                    del encoder, decoder, model
                else:
                    run_cfg = load_config(cfg.stage_b, schema=StageBConfig)
                    model = build_mllm(arch, run_cfg.mllm, device, tokenizer_dir, seed=cfg.seed)
                    counts.add("mllm_training", model)
                    steps = StepSettings(cfg.train_warmup, cfg.train_repeats, cfg.compile)
                    stage = bench_stage_b(model, run_cfg, device, peak, steps)
                    stage["settings"]["config"] = cfg.stage_b
                    result["training"]["stage_b"] = stage
                    del model
            except Exception:  # one failing part (e.g. a compiler error) must not lose the others' numbers
                result["errors"][part] = traceback.format_exc()
                say(f"{part} failed:\n{result['errors'][part]}")
            release(device)
            done.add(part)
            save()

    table = save()
    print(table)
    say(f"wrote {out / 'benchmark.json'} and {out / 'benchmark.md'} in {result['wall_s']:.0f} s")
    if result["errors"]:
        raise SystemExit(1)
    return result


if __name__ == "__main__":
    main()
