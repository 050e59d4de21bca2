"""What the decoder stage tests (c, d) share: loading a stage script, a stage checkpoint to start from, its
metrics, a 2-process launch, and the check that a bad resume leaves a finished run alone."""

from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from animegamer.config import DecoderConfig
from animegamer.models.decoder import AnimationShotDecoder

ROOT = Path(__file__).resolve().parents[2]


def tiny_decoder_config(pretrained: str | Path) -> DecoderConfig:
    """The tiny decoder the stage tests train: LoRA rank 4, fp32, no gradient checkpointing."""
    return DecoderConfig(pretrained=str(pretrained), lora_rank=4, lora_alpha=4, motion_embed_dim=16,
                         gradient_checkpointing=False, dtype="fp32")


def write_decoder_run(cfg: DecoderConfig, run_dir: Path, step: int, generator: torch.Generator) -> Path:
    """A finished stage run's decoder: ``run_dir/checkpoints/step_N/decoder`` + ``latest``. Its trained parts
    (LoRA, motion embedding) are moved by 0.05 * N(0, 1) so that starting from it is observable (fresh LoRA B is 0).
    The decoder is built from the current torch seed; returns the step directory."""
    decoder = AnimationShotDecoder.from_config(cfg, with_vae=False)
    with torch.no_grad():
        for p in decoder.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    step_dir = run_dir / "checkpoints" / f"step_{step:07d}"
    decoder.save_trained(step_dir / "decoder")
    (run_dir / "checkpoints" / "latest").write_text(f"{step_dir.name}\n")
    return step_dir


def logged_losses(run_dir: Path) -> list[float]:
    """The ``loss`` values of a run's metrics.csv, in step order."""
    with open(run_dir / "metrics.csv", newline="") as fh:
        return [float(r["value"]) for r in csv.DictReader(fh) if r["name"] == "loss"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch_two_processes(script: str, argv: list[str], **env: str) -> subprocess.CompletedProcess:
    """``scripts/<script>.py argv`` under ``accelerate launch`` with 2 CPU processes (DDP over gloo)."""
    env = {**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(ROOT / "scripts" / f"{script}.py"), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


# the engines a stage trains under on 2 CPU processes: DDP over gloo, or a shipped accelerate config with only the
# device count and precision changed on the command line (DeepSpeed on its CPU accelerator, which talks over gloo)
ENGINES = {
    "ddp": ("cpu_2proc.yaml", {"ACCELERATE_USE_CPU": "true"}),
    "zero2": ("deepspeed_zero2.yaml", {"DS_ACCELERATOR": "cpu"}),
    "zero3": ("deepspeed_zero3.yaml", {"DS_ACCELERATOR": "cpu"}),
    "zero3_offload": ("deepspeed_zero3_offload.yaml", {"DS_ACCELERATOR": "cpu"}),
}


def launch_engine(engine: str, script: str, argv: list[str], num_processes: int = 2,
                  config_file: str | None = None, **env: str) -> subprocess.CompletedProcess:
    """``scripts/<script>.py argv`` under ``accelerate launch --config_file configs/accelerate/<engine's config>
    --num_processes N --mixed_precision no`` on CPU processes."""
    name, engine_env = ENGINES[engine] if config_file is None else (config_file, {})
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": str(ROOT),
           **engine_env, **env}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
           str(ROOT / "configs" / "accelerate" / name), "--num_processes", str(num_processes),
           "--mixed_precision", "no", "--main_process_port", str(free_port()),
           str(ROOT / "scripts" / f"{script}.py"), *argv]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)


def check_bad_resumes_leave_the_run_alone(main: Callable[[list[str]], Path], argv: Callable[..., list[str]],
                                          out: Path, capsys) -> None:
    """``out`` is a finished run with a checkpoint at step 1; ``argv(*extra)`` the arguments that made it. Resuming
    from a mistyped path, and from ``latest`` once its optimizer.bin is truncated, must each end in one
    ``error: ...`` line naming the problem, exit code 2, and leave config.yaml, run_info.json and metrics.csv
    byte-identical."""
    kept = {name: (out / name).read_bytes() for name in ("config.yaml", "run_info.json", "metrics.csv")}
    optimizer = out / "checkpoints" / "step_0000001" / "optimizer.bin"
    optimizer.write_bytes(optimizer.read_bytes()[:100])
    capsys.readouterr()
    for resume, needle in [("latest", f"{optimizer}: damaged or truncated"),
                           (str(out.parent / "nonexistent"), "checkpoint not found")]:
        with pytest.raises(SystemExit) as exit_info:
            main(argv("train.max_steps=2", "--resume", resume))
        err = capsys.readouterr().err.strip()
        assert exit_info.value.code == 2 and err.startswith("error: ") and needle in err and "\n" not in err, err
        assert {name: (out / name).read_bytes() for name in kept} == kept
