"""Stage (a) and (b) trained under each engine (DDP, FSDP2, ZeRO-2/3) by the stage scripts themselves, measured side
by side: optimizer steps/s, samples/s, MFU, peak GPU memory per process and peak host RAM of the largest process.

    python research/train_engines.py --out benchmarks/h100/engines                    # full size, every GPU here
    python research/train_engines.py --out /tmp/engines --stages b --engines zero3 --num-processes 1
    python research/train_engines.py --out /tmp/engines --preset tiny --device cpu --engines ddp,zero3

Each (stage, engine) pair is one ``accelerate launch --config_file configs/accelerate/<engine's config>
scripts/train_stage_<s>.py --config configs/stage_<s>.yaml`` of ``--steps`` optimizer steps on random weights of
the real layouts (``animegamer.bench.memory.write_random_pretrained``: a Mistral folder and a diffusers CogVideoX
folder, written once under ``--work``) and synthetic data of the configs' shapes (stage (a): precomputed features
of ``--clips`` clips; stage (b): a manifest of captioned films and their shot targets). Nothing is timed here: the
numbers are the training loop's own log (``metrics.csv``: ``steps_per_s`` over each logging interval,
``peak_gpu_memory_gb`` of the main process); the first interval (CUDA and compile warm-up) is left out of the speed.

MFU = model FLOPs per sample x samples/s / (processes x the device's bf16 matmul peak, measured in a fresh process).
Model FLOPs: stage (a) 3 x the forward FLOPs of one clip (FlopCounterMode on a model built on the meta device, the
benchmark's convention); stage (b) 6 N S + 12 L d S^2 per window (N: weights of every linear a token passes, LoRA
included; S: the window's tokens, averaged over the synthetic windows). Peak host RAM: ``ru_maxrss`` of the launch's
processes (the largest one, not their sum), read by a wrapper process around each launch.

Writes ``--out/engines.json`` (rewritten after every launch, so a run cut off keeps what it finished),
``--out/engines.md`` and each run's log (``--out/runs/<stage>_<engine>/``: metrics.csv, run_info.json and the
launch's output; the runs themselves, final checkpoints included, are under ``--work/runs``).
FSDP2 runs only on CUDA GPUs: accelerate's FSDP plugin does not start on CPU processes.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STAGES = ("a", "b")
STAGE_CONFIGS = {"full": {"a": "configs/stage_a.yaml", "b": "configs/stage_b.yaml"},
                 "tiny": {"a": "configs/tiny/stage_a.yaml", "b": "configs/tiny/stage_b.yaml"}}
# accelerate config per engine and stage; on CPU processes DDP is cpu_2proc.yaml and DeepSpeed runs on its CPU
# accelerator (gloo), as tests/test_engines.py runs them
ENGINES = {
    "ddp": {"a": "multi_gpu.yaml", "b": "multi_gpu.yaml"},
    "fsdp2": {"a": "fsdp_decoder.yaml", "b": "fsdp.yaml"},
    "zero2": {"a": "deepspeed_zero2.yaml", "b": "deepspeed_zero2.yaml"},
    "zero3": {"a": "deepspeed_zero3.yaml", "b": "deepspeed_zero3.yaml"},
    "zero3_offload": {"a": "deepspeed_zero3_offload.yaml", "b": "deepspeed_zero3_offload.yaml"},
}
FORMAT = "animegamer_train_engines"
GB = 1e9


@dataclass
class Settings:
    preset: str
    device: str
    stages: tuple[str, ...]
    engines: tuple[str, ...]
    num_processes: int
    steps: int
    log_every: int
    clips: int
    work: Path
    out: Path
    timeout_s: int


# ---------------------------------------------------------------------------------------------- the command line


def parse_args(argv: list[str] | None) -> Settings:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for engines.json, engines.md and the runs")
    parser.add_argument("--preset", choices=["full", "tiny"], default="full", help="model sizes (default full)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="GPUs or CPU processes")
    parser.add_argument("--stages", default="a,b", help="comma-separated: a, b (default a,b)")
    parser.add_argument("--engines", default="ddp,fsdp2,zero3",
                        help=f"comma-separated, of {', '.join(ENGINES)} (default ddp,fsdp2,zero3)")
    parser.add_argument("--num-processes", type=int, default=0,
                        help="processes per launch (default: every visible GPU; 2 on CPU)")
    parser.add_argument("--steps", type=int, default=20, help="optimizer steps per launch (default 20)")
    parser.add_argument("--log-every", type=int, default=5, help="steps per logged interval (default 5)")
    parser.add_argument("--clips", type=int, default=8, help="synthetic stage (a) clips (default 8)")
    parser.add_argument("--work", default="", help="random weights and synthetic data, reused when present "
                        "(default: <temp dir>/animegamer_engines/<preset>)")
    parser.add_argument("--timeout", type=int, default=900, help="seconds one launch may take (default 900)")
    args = parser.parse_args(argv)

    def fail(message: str):
        print(f"error: {message}", file=sys.stderr)
        raise SystemExit(2)

    stages = tuple(s for s in args.stages.split(",") if s)
    engines = tuple(e for e in args.engines.split(",") if e)
    if not stages or any(s not in STAGES for s in stages):
        fail(f"--stages takes a comma-separated list of {list(STAGES)} (got {args.stages!r})")
    if not engines or any(e not in ENGINES for e in engines):
        fail(f"--engines takes a comma-separated list of {list(ENGINES)} (got {args.engines!r})")
    if args.device == "cpu" and "fsdp2" in engines:
        fail("fsdp2 needs CUDA GPUs (accelerate's FSDP plugin does not start on CPU processes); "
             "drop it or use --device cuda")
    if args.device == "cpu" and args.preset == "full":
        fail("--preset full trains 2B and 7B models: use --device cuda (or --preset tiny on CPU)")
    if args.steps < 2 * args.log_every or args.log_every < 1:
        fail(f"--steps must be at least two logged intervals (2 x --log-every = {2 * args.log_every}); "
             f"the first is left out of the speed")
    if args.clips < 1 or args.timeout < 1 or args.num_processes < 0:
        fail("--clips and --timeout must be positive, --num-processes not negative")
    num_processes = args.num_processes
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            fail("--device cuda but no CUDA device is visible; use --preset tiny --device cpu")
        visible = torch.cuda.device_count()
        if num_processes > visible:
            fail(f"--num-processes {num_processes} but {visible} CUDA device(s) are visible")
        num_processes = num_processes or visible
    else:
        num_processes = num_processes or 2
    work = Path(args.work) if args.work else Path(tempfile.gettempdir()) / "animegamer_engines" / args.preset
    return Settings(args.preset, args.device, stages, engines, num_processes, args.steps, args.log_every,
                    args.clips, work, Path(args.out), args.timeout)


# ---------------------------------------------------------------------------------------------- inputs


def stage_config(settings: Settings, stage: str, overrides: list[str]):
    from animegamer.config import StageAConfig, StageBConfig, load_config

    schema = StageAConfig if stage == "a" else StageBConfig
    return load_config(ROOT / STAGE_CONFIGS[settings.preset][stage], overrides, schema=schema)


def data_overrides(settings: Settings, stage: str) -> list[str]:
    """Where a stage's run reads the random weights and the synthetic data."""
    work = settings.work
    if stage == "a":
        return [f"decoder.pretrained={work / 'weights' / 'CogVideoX'}", f"t5.path={work / 'weights' / 'CogVideoX'}",
                f"data.manifest={work / 'stage_a' / 'clips.jsonl'}",
                f"data.features_dir={work / 'stage_a' / 'features'}"]
    return [f"mllm.pretrained={work / 'weights' / 'Mistral'}", f"data.manifest={work / 'stage_b' / 'clips.jsonl'}",
            "data.split=all", f"shot_targets={work / 'stage_b' / 'shot_targets'}"]


def tag_line(film: int, index: int) -> str:
    """A valid shot tag line, varied with (film, index)."""
    names, motions, places = ["Qiqi", "Sam", "Mia", "Ken"], ["run", "eat", "read", "jump"], ["park", "beach", "room"]
    k = film * 7 + index
    return (f"<S>{names[film % 4]}</S><MD>{motions[k % 4]}</MD><EV>{places[k % 3]}</EV><ML>{k % 5 + 1}</ML>"
            f"<MA>quickly</MA><SC>{k % 2}</SC><ET>{(k // 2) % 2}</ET><ST>{k % 3 - 1}</ST>")


def write_inputs(settings: Settings) -> dict:
    """Random weights and each asked stage's synthetic data under ``settings.work`` (kept when already there)."""
    import torch

    from animegamer.bench.memory import write_random_pretrained
    from animegamer.bench.models import ARCHITECTURES
    from animegamer.bench.training import stage_a_batch
    from animegamer.data.features import META_FILE, feature_settings
    from animegamer.data.manifest import ClipRecord, write_manifest
    from animegamer.data.tensor_store import TensorStore
    from animegamer.io import atomic_write_json

    arch = ARCHITECTURES[settings.preset]
    weights = settings.work / "weights"
    done = {}
    if not (weights / "Mistral" / "config.json").is_file() or not (weights / "CogVideoX" / "vae").is_dir():
        started = time.perf_counter()
        write_random_pretrained(arch, weights)
        done["weights_s"] = round(time.perf_counter() - started, 1)
    if "a" in settings.stages and not (settings.work / "stage_a" / "clips.jsonl").is_file():
        root = settings.work / "stage_a"
        cfg = stage_config(settings, "a", data_overrides(settings, "a") + [f"train.batch_size={settings.clips}"])
        batch = stage_a_batch(arch, cfg, "cpu", seed=0)  # the shapes and dtypes precompute_features stores
        records = [ClipRecord(f"film{i // 4:02d}_{i % 4:05d}", f"clips/{i}.mp4", f"film{i // 4:02d}", i % 4,
                              2.0 * i, 2.0 * i + 2, tags=tag_line(i // 4, i % 4), motion_level=i % 5 + 1)
                   for i in range(settings.clips)]
        shard = {r.clip_id: {"latents": batch["latents"][i].permute(1, 0, 2, 3).contiguous(),  # (C, F, h, w)
                             "clip_tokens": batch["clip_tokens"][i].contiguous(),
                             "text_tokens": batch["text_tokens"][i].contiguous()} for i, r in enumerate(records)}
        (root / "features").mkdir(parents=True, exist_ok=True)
        atomic_write_json(root / "features" / META_FILE, feature_settings(cfg))
        TensorStore(root / "features").write_shard(shard)
        write_manifest(root / "clips.jsonl", records)  # last: its presence says the data is complete
    if "b" in settings.stages and not (settings.work / "stage_b" / "clips.jsonl").is_file():
        root = settings.work / "stage_b"
        cfg = stage_config(settings, "b", data_overrides(settings, "b"))
        films, per_film = 4, cfg.data.history_turns + 5
        records = [ClipRecord(f"film{f:02d}_{i:05d}", f"clips/{f}_{i}.mp4", f"film{f:02d}", i, 2.0 * i,
                              2.0 * i + 2, tags=tag_line(f, i)) for f in range(films) for i in range(per_film)]
        g = torch.Generator().manual_seed(0)
        TensorStore(root / "shot_targets").write_shard(
            {r.clip_id: {"shot_embeds": torch.randn(cfg.mllm.num_slots, cfg.mllm.shot_dim, generator=g)}
             for r in records})
        write_manifest(root / "clips.jsonl", records)
    return done


def flops_per_sample(settings: Settings, stage: str) -> float:
    """Model FLOPs of one training sample (stage a: a clip; stage b: a window, averaged over the data's windows),
    counted on models built on the meta device (no memory, no device)."""
    import torch

    from animegamer.bench.models import (
        ARCHITECTURES,
        build_decoder,
        build_encoder,
        build_mllm,
        tokenwise_linear_params,
    )
    from animegamer.bench.timing import count_flops, mllm_training_flops

    arch = ARCHITECTURES[settings.preset]
    cfg = stage_config(settings, stage, data_overrides(settings, stage))
    if stage == "a":
        from animegamer.bench.training import stage_a_batch
        from animegamer.recipes.stage_a import EncoderDecoder, compute_loss

        encoder = build_encoder(arch, cfg.encoder, "meta")
        decoder = build_decoder(arch, cfg.decoder, "meta", with_vae=False)
        model = EncoderDecoder(encoder, decoder)
        one = {k: v[:1] for k, v in stage_a_batch(arch, cfg, "meta").items()}
        with torch.no_grad():
            return 3.0 * count_flops(lambda: compute_loss(model, model, one, cfg))

    from animegamer.data.manifest import read_manifest
    from animegamer.data.sequences import windows_from_config
    from animegamer.data.stage_b import StageBDataset
    from animegamer.data.tensor_store import TensorStore

    model = build_mllm(arch, cfg.mllm, "meta", settings.work / "weights" / "Mistral")
    manifest = read_manifest(cfg.data.manifest)
    dataset = StageBDataset(windows_from_config(manifest, cfg.data), manifest, TensorStore(cfg.shot_targets),
                            model.layout, cfg.max_seq_len, cfg.mllm.shot_dim)
    lengths = [len(dataset[i]["input_ids"]) for i in range(len(dataset))]
    llm = model.llm.get_base_model().config
    width = llm.num_attention_heads * (getattr(llm, "head_dim", None) or llm.hidden_size // llm.num_attention_heads)
    flops = mllm_training_flops(tokenwise_linear_params(model.backbone.layers), llm.num_hidden_layers, width,
                                lengths)
    return flops / len(lengths)


def peak_matmul_flops(settings: Settings) -> float:
    """The device's matmul peak (bf16 on a GPU, fp32 on CPU), measured in a fresh process (no CUDA context held
    here while the runs train)."""
    code = ("import torch, sys; from animegamer.bench.timing import matmul_peak_flops; "
            f"d = torch.device('{settings.device}'); "
            f"print(matmul_peak_flops(d, torch.bfloat16 if d.type == 'cuda' else torch.float32, "
            f"{8192 if settings.device == 'cuda' else 1024}))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=child_env(settings, ""), capture_output=True,
                          text=True, timeout=300)
    if done.returncode:
        raise RuntimeError(f"measuring the matmul peak failed: {done.stderr.strip()[-500:]}")
    return float(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------- launches


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def child_env(settings: Settings, engine: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "TOKENIZERS_PARALLELISM": "false"}
    if settings.device == "cpu":
        env["OMP_NUM_THREADS"] = "1"
        if engine == "ddp":
            env["ACCELERATE_USE_CPU"] = "true"
        elif engine:
            env["DS_ACCELERATOR"] = "cpu"  # DeepSpeed's CPU accelerator (gloo)
    return env


def accelerate_config(settings: Settings, stage: str, engine: str) -> str:
    if engine == "ddp":
        if settings.device == "cpu":
            return "cpu_2proc.yaml"
        return "single_gpu.yaml" if settings.num_processes == 1 else "multi_gpu.yaml"
    return ENGINES[engine][stage]


def run_dir(settings: Settings, stage: str, engine: str) -> Path:
    """The run's output_dir, under --work (its final checkpoint is not wanted among the rows)."""
    return settings.work / "runs" / f"{stage}_{engine}"


KEPT = ("metrics.csv", "run_info.json", "launch.log")  # what --out/runs/<stage>_<engine>/ keeps of a run


def launch_command(settings: Settings, stage: str, engine: str) -> list[str]:
    """The ``accelerate launch`` of one (stage, engine) run (run from the repository root)."""
    precision = ["--mixed_precision", "no"] if settings.device == "cpu" else []
    steps = settings.steps
    run = [f"output_dir={run_dir(settings, stage, engine)}", f"train.max_steps={steps}",
           f"train.log_every={settings.log_every}", f"train.checkpoint_every={steps}", "train.report_to=csv",
           "train.lr_warmup_steps=0"]
    if stage == "a":
        run += ["warmup_steps=0"]  # every timed step is a joint step (encoder, LoRA and motion embedding)
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(Path("configs") / "accelerate" / accelerate_config(settings, stage, engine)),
            "--num_processes", str(settings.num_processes), *precision, "--main_process_port", str(free_port()),
            f"scripts/train_stage_{stage}.py", "--config", STAGE_CONFIGS[settings.preset][stage],
            *data_overrides(settings, stage), *run]


def run_with_peak_rss(argv: list[str], env: dict, timeout_s: int, log: Path) -> tuple[int, float]:
    """Run ``argv`` under a wrapper process that reports its children's peak ``ru_maxrss``: (exit status, peak RSS
    bytes of the largest process of the launch; 0 when it was stopped at ``timeout_s``). Output goes to ``log``;
    past the limit every process of the launch is stopped (:func:`run_in_group`)."""
    from research.gpu_lease import TIMED_OUT, run_in_group

    result = log.with_name(".peak_rss.json")
    wrapper = ("import json, resource, subprocess, sys; "
               "rc = subprocess.run(json.loads(sys.argv[1])).returncode; "
               "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
               "open(sys.argv[2], 'w').write(json.dumps([rc, peak]))")
    log.parent.mkdir(parents=True, exist_ok=True)
    result.unlink(missing_ok=True)
    with open(log, "w") as out:
        rc = run_in_group([sys.executable, "-c", wrapper, json.dumps(argv), str(result)], timeout_s, cwd=ROOT,
                          env=env, stdout=out, stderr=subprocess.STDOUT)
    if rc == TIMED_OUT or not result.is_file():
        return rc or 1, 0.0
    launch_rc, max_rss_kib = json.loads(result.read_text())
    result.unlink()
    return launch_rc, float(max_rss_kib) * 1024  # ru_maxrss is in KiB on Linux


def read_metrics(run: Path) -> dict[str, dict[int, float]]:
    """``{name: {step: value}}`` of a run's metrics.csv (step,name,value,time rows)."""
    import csv

    found: dict[str, dict[int, float]] = {}
    path = run / "metrics.csv"
    if path.is_file():
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                found.setdefault(row["name"], {})[int(row["step"])] = float(row["value"])
    return found


def summarise(metrics: dict[str, dict[int, float]], log_every: int) -> dict:
    """Steady speed (median of the logged intervals after the first), peak memory, first and last loss."""
    speeds = [v for s, v in sorted(metrics.get("steps_per_s", {}).items()) if s > log_every]
    losses = [v for _, v in sorted(metrics.get("loss", {}).items())]
    memory = metrics.get("peak_gpu_memory_gb", {})
    return {
        "steps_per_s": statistics.median(speeds) if speeds else None,
        "intervals": len(speeds),
        "peak_gpu_memory_gb": max(memory.values()) if memory else None,
        "tokens_per_s": statistics.median(v for s, v in metrics["tokens_per_s"].items() if s > log_every)
        if len(metrics.get("tokens_per_s", {})) > 1 else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
        "last_logged_step": max(metrics["loss"]) if metrics.get("loss") else 0,
    }


def measure(settings: Settings, stage: str, engine: str, flops: float, peak: float) -> dict:
    import shutil

    argv = launch_command(settings, stage, engine)
    run = run_dir(settings, stage, engine)
    if run.exists():
        shutil.rmtree(run)  # an earlier launch's run (ours, under --work): a fresh run, not a resume
    started = time.perf_counter()
    rc, rss = run_with_peak_rss(argv, child_env(settings, engine), settings.timeout_s, run / "launch.log")
    kept = settings.out / "runs" / f"{stage}_{engine}"
    kept.mkdir(parents=True, exist_ok=True)
    for name in KEPT:
        if (run / name).is_file():
            shutil.copyfile(run / name, kept / name)
    row = {"stage": stage, "engine": engine, "accelerate_config": accelerate_config(settings, stage, engine),
           "num_processes": settings.num_processes, "rc": rc, "seconds": round(time.perf_counter() - started, 1),
           "command": " ".join(argv[1:]), "peak_host_rss_gb": round(rss / GB, 2) if rss else None,
           **summarise(read_metrics(run), settings.log_every)}
    info = run / "run_info.json"
    if info.is_file():
        meta = json.loads(info.read_text())
        row["distributed_type"] = meta.get("distributed_type")
        row["deepspeed"] = meta.get("deepspeed")
    cfg = stage_config(settings, stage, data_overrides(settings, stage))
    per_step = cfg.train.batch_size * cfg.train.grad_accum * settings.num_processes
    row["samples_per_step"] = per_step
    row["flops_per_sample"] = flops
    if row["steps_per_s"]:
        row["samples_per_s"] = row["steps_per_s"] * per_step
        row["mfu"] = flops * row["samples_per_s"] / (settings.num_processes * peak) if peak else None
    if rc:
        log = (run / "launch.log").read_text(errors="replace").strip().splitlines() if (run / "launch.log").is_file() \
            else []
        row["error"] = next((line for line in reversed(log) if "Error" in line or "error" in line),
                            log[-1] if log else f"exit status {rc}")[-300:]
    return row


# ---------------------------------------------------------------------------------------------- report


def markdown(result: dict) -> str:
    lines = [f"# Training under each engine: {result['preset']} size, {result['num_processes']} process(es) on "
             f"{result['versions']['device']}", "",
             f"{result['date']}; torch {result['versions']['torch']}, accelerate {result['versions']['accelerate']}, "
             f"deepspeed {result['versions']['deepspeed']}; {result['steps']} steps per run, speed = median of the "
             f"logged intervals of {result['log_every']} steps after the first; matmul peak "
             f"{result['peak_flops'] / 1e12:.1f} TFLOP/s per device.", "",
             "| stage | engine | steps/s | samples/s | MFU | peak GPU memory / process (GB) | peak host RSS (GB) "
             "| loss first → last | status |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- | --- |"]

    def num(v, fmt):
        return "–" if v is None else format(v, fmt)

    for r in result["rows"]:
        status = "ok" if not r["rc"] else f"exit {r['rc']}: {r.get('error', '')[:80]}"
        lines.append(f"| ({r['stage']}) | {r['engine']} | {num(r['steps_per_s'], '.3f')} | "
                     f"{num(r.get('samples_per_s'), '.2f')} | {num(r.get('mfu'), '.1%')} | "
                     f"{num(r['peak_gpu_memory_gb'], '.1f')} | {num(r['peak_host_rss_gb'], '.1f')} | "
                     f"{num(r['first_loss'], '.3f')} → {num(r['last_loss'], '.3f')} | {status} |")
    return "\n".join(lines) + "\n"


def versions(settings: Settings) -> dict:
    import platform

    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("accelerate", "deepspeed", "transformers", "diffusers", "peft"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    found["device"] = (torch.cuda.get_device_name() if settings.device == "cuda"
                       else f"cpu ({os.cpu_count()} cores)")
    return found


def main(argv: list[str] | None = None) -> dict:
    settings = parse_args(argv)
    from datetime import datetime, timezone

    from animegamer.io import atomic_write_json, atomic_write_text

    settings.out.mkdir(parents=True, exist_ok=True)
    print(f"[engines] writing random {settings.preset} weights and data under {settings.work} (kept for later runs)",
          file=sys.stderr, flush=True)
    written = write_inputs(settings)
    result = {"format": FORMAT, "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
              "preset": settings.preset, "device_kind": settings.device, "num_processes": settings.num_processes,
              "steps": settings.steps, "log_every": settings.log_every, "versions": versions(settings),
              "inputs_written": written, "peak_flops": peak_matmul_flops(settings), "rows": []}
    flops = {stage: flops_per_sample(settings, stage) for stage in settings.stages}
    for stage in settings.stages:
        for engine in settings.engines:
            print(f"[engines] stage ({stage}) under {engine} on {settings.num_processes} process(es) ...",
                  file=sys.stderr, flush=True)
            row = measure(settings, stage, engine, flops[stage], result["peak_flops"])
            result["rows"].append(row)
            atomic_write_json(settings.out / "engines.json", result)
            atomic_write_text(settings.out / "engines.md", markdown(result))
            print(f"[engines] stage ({stage}) {engine}: rc {row['rc']}, {row['steps_per_s']} steps/s, "
                  f"peak GPU {row['peak_gpu_memory_gb']} GB, host {row['peak_host_rss_gb']} GB", file=sys.stderr)
    atomic_write_json(settings.out / "engines.json", result)
    atomic_write_text(settings.out / "engines.md", markdown(result))
    return result


if __name__ == "__main__":
    main()
