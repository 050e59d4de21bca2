"""A stage script's shape on a ``Linear``, for the checkpoint and resume tests: check the resume, build, load it,
start the run, train, save. It goes through the same calls as the stage scripts (``build_accelerator``,
``resume_point``, ``load_checkpoint``, ``start_run``, ``save_checkpoint``), in this process or, run as
``python -m tests.helpers.toy_run OUTPUT_DIR STEPS [key=value ...]``, in a child process (a file-size limit, a
signal).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from torch import nn

from animegamer.config import StageAConfig, TrainConfig
from animegamer.models.weights import load_state_dict_file, save_state_dict_file
from animegamer.training.batches import ResumableBatchSampler
from animegamer.training.checkpoint import load_checkpoint, save_checkpoint, skip_model_weights_in_state
from animegamer.training.optim import build_optimizer, build_scheduler
from animegamer.training.program import releases_output_dir
from animegamer.training.resume import resume_point
from animegamer.training.run import build_accelerator, end_run, start_run

# a file written the way safetensors (and peft through it) writes: mode 0600, and a SafetensorError on a full disk
RAW_SAFETENSORS = "raw.safetensors"


@releases_output_dir
def toy_run(out: str | Path, steps: int, resume: str = "", allow_rng_reset: bool = False, keep: int = 1,
            raw_elements: int = 0, seed: int = 42, **train: Any) -> dict[str, torch.Tensor]:
    """Train the toy into ``out`` up to step ``steps`` (``train.max_steps`` is 4 unless given), checkpointing
    every 2 steps; returns its final weights. ``raw_elements`` > 0 adds a float32 tensor of that many elements to
    every checkpoint, saved with ``safetensors.torch.save_file``; ``train`` overrides :class:`TrainConfig` fields."""
    cfg = StageAConfig(output_dir=str(out), seed=seed)
    cfg.train = TrainConfig(**{"max_steps": 4, "lr": 0.05, "report_to": "csv", "checkpoint_every": 2,
                               "resume": resume, "allow_rng_reset": allow_rng_reset, **train})
    acc = build_accelerator(cfg.output_dir, cfg.train)
    skip_model_weights_in_state(acc)
    point = resume_point(cfg, acc)
    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    opt = build_optimizer(model.parameters(), cfg.train)
    sched = build_scheduler(opt, cfg.train)
    model, opt, sched = acc.prepare(model, opt, sched)
    data = torch.arange(40, dtype=torch.float32).reshape(10, 4) / 40

    def save(d):
        save_state_dict_file(acc.unwrap_model(model).state_dict(), d / "model.safetensors")
        if raw_elements:
            save_file({"values": torch.zeros(raw_elements)}, str(d / RAW_SAFETENSORS))

    def load(d):
        acc.unwrap_model(model).load_state_dict(load_state_dict_file(d / "model.safetensors"))

    step = 0
    if point:
        step = load_checkpoint(acc, point.path, load, cfg.train.allow_rng_reset)["step"]
    start_run(acc, cfg, "toy", point)
    batches = iter(ResumableBatchSampler(10, 2, seed=0, start_batch=step))
    while step < steps:
        idx = next(batches)
        noise = torch.randn(2, 1)  # drawn from the (restored) global RNG
        loss = (model(data[idx]) - noise).pow(2).mean()
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        step += 1
        acc.log({"loss": loss.item()}, step=step)
        if step % cfg.train.checkpoint_every == 0:
            save_checkpoint(acc, cfg.output_dir, step, save, {"loss": loss.item()}, keep=keep)
    end_run(acc)
    return {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}


def main(argv: list[str]) -> None:
    """``OUTPUT_DIR STEPS [key=value ...]``: :func:`toy_run` in this process (values are Python literals)."""
    import ast

    from animegamer.training.program import run_program

    out, steps, *pairs = argv
    kwargs = {k: ast.literal_eval(v) for k, v in (p.split("=", 1) for p in pairs)}
    run_program(lambda: toy_run(out, int(steps), **kwargs))


if __name__ == "__main__":
    main(sys.argv[1:])
