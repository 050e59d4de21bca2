"""The one training loop every stage runs: a stage is a :class:`Recipe` (what it builds, what one micro-batch's loss
is, what it saves), and :func:`train` does the rest the same way for all of them under DDP, DeepSpeed ZeRO-2/3 and
FSDP2.

    cfg = parse_stage_config(...)               --config FILE key=value ... [--resume latest|PATH]
    recipe.check()                              settings checked before anything starts
    accelerator = build_accelerator(...)        the run owns output_dir (training/program.py)
    resume = resume_point(cfg, accelerator)     the checkpoint, its files and its recipe checked
    recipe.build(resume)                        data, then models (bad input fails here in one line)
    load_resume_weights(resume, recipe.load_weights)   before prepare: the engine shards the restored values
    optimizer, scheduler; accelerator.prepare(...)
    seed_process; restore(...)                  optimizer, schedule, every process's RNG
    start_run(...)                              config.yaml, run_info.json, trackers
    for each step: grad_accum x (recipe.loss -> backward), clip + step, log, checkpoint
    recipe.finish(...)                          what a stage leaves behind besides checkpoints (stage a: s_a)

A recipe's :meth:`Recipe.loss` returns the micro-batch's losses by name, ``"loss"`` first (the one that is
backpropagated); each is averaged over the accumulation steps and, at a logging step, over the processes. The logged
row of a step: those parts, the recipe's :meth:`Recipe.interval_logs`, ``grad_norm``, the learning rates applied
(:attr:`Recipe.lr_names`), the recipe's :meth:`Recipe.step_logs`, ``steps_per_s`` (optimizer steps per second
since the last logged step, checkpoint saves included), where the recipe counts tokens ``tokens_per_s``, and on a
GPU ``peak_gpu_memory_gb`` (this process's peak of allocated memory since the first step: the model, its shard,
optimizer state and activations).

Random numbers: :meth:`Recipe.build` seeds (``set_seed(cfg.seed)``) just before it creates its models, so every
process starts from the same weights; after ``prepare`` each process is seeded with ``seed + rank``; the batch order
is a pure function of the step (training/batches.py). A run resumed from step N's checkpoint takes exactly the steps
the uninterrupted run took.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import torch
from torch import nn
from tqdm.auto import tqdm

from animegamer.cli import UsageError, reports_usage_errors
from animegamer.data.manifest import ManifestError
from animegamer.io import atomic_write_text
from animegamer.training.batches import resumable_batches
from animegamer.training.checkpoint import ResumePoint, save_checkpoint, skip_model_weights_in_state
from animegamer.training.engines import configure_deepspeed, gather_trained_state, optimizer_step, seed_process
from animegamer.training.optim import build_optimizer, build_scheduler
from animegamer.training.program import releases_output_dir
from animegamer.training.resume import load_resume_weights, restore, resume_point
from animegamer.training.run import build_accelerator, end_run, parse_stage_config, start_run

BAD_INPUT = (ManifestError, FileNotFoundError, ValueError)  # CheckpointError is a ValueError
SHOWN_LEFT_OUT = 20  # clips named on the console; all of them are in output_dir/left_out.txt


class Recipe:
    """One training stage. A subclass names its config class and project, builds its data and models in
    :meth:`build` and says what one micro-batch's loss is in :meth:`loss`; the loop (:func:`train`) does the
    rest. One instance per run: ``cfg`` is the run's config, ``accelerator`` its accelerator (set before
    :meth:`build`).

    :meth:`build` sets ``model`` (the root module that trains: the one ``accelerator.prepare`` wraps), ``dataset``
    and, optionally, ``collator``, ``left_out`` (lines naming the clips it left out) and ``summary`` (a line on
    what the run trains)."""

    config_class: ClassVar[type]
    project: ClassVar[str]  # "stage_a": the run's tracker project and its progress bar
    lr_names: ClassVar[tuple[str, ...]] = ("lr",)  # one per optimizer group: the logged learning rates

    def __init__(self, cfg: Any):
        self.cfg = cfg
        self.accelerator = None
        self.model: nn.Module | None = None
        self.dataset = None
        self.collator = None
        self.left_out: list[str] = []
        self.summary = ""

    # ---- before anything starts
    def check(self) -> None:
        """Check (and complete) the settings before the accelerator is built; raise ValueError for a bad one."""

    # ---- building the run
    def build(self, resume: ResumePoint | None) -> None:
        """Data, then models (``set_seed(cfg.seed)`` first). Raise ManifestError / FileNotFoundError / ValueError
        for bad input: the run ends in one ``error:`` line, before anything of it is written."""
        raise NotImplementedError

    def load_weights(self, checkpoint: Path) -> None:
        """A checkpoint's trained weights into the bare model (a resume, before ``prepare``)."""
        raise NotImplementedError

    def parameters(self) -> Iterable:
        """What the optimizer trains: parameters, or a list of parameter groups."""
        return self.model.trainable_parameters()

    def scheduler(self, optimizer):
        """The learning-rate schedule (train.lr_scheduler, one lambda for every group by default)."""
        return build_scheduler(optimizer, self.cfg.train)

    def compile(self) -> None:
        """``train.compile``: compile what the stage compiles (nothing by default)."""

    # ---- one step
    def to_device(self, batch: dict) -> dict:
        """A batch from the loader on the run's device."""
        return {k: v.to(self.accelerator.device, non_blocking=True) for k, v in batch.items()}

    def tokens(self, batch: dict) -> int | None:
        """The tokens of a batch, for ``tokens_per_s`` (None: not counted)."""
        return None

    def loss(self, model: nn.Module, core: nn.Module, batch: dict, step: int, micro: int) -> dict[str, torch.Tensor]:
        """The losses of one micro-batch by name, ``"loss"`` first (backpropagated). ``model``: the prepared
        (wrapped) model; ``core``: the bare one; ``step``: the optimizer steps done; ``micro``: the micro-batch's
        index within the step."""
        raise NotImplementedError

    def interval_logs(self) -> dict[str, float]:
        """Logged at a logging step after the loss parts (collectives allowed: every process calls it)."""
        return {}

    def step_logs(self, step: int) -> dict[str, Any]:
        """Logged at a logging step after the learning rates; ``step``: the steps done before this one."""
        return {}

    def postfix(self, step: int) -> dict[str, str]:
        """Shown beside the progress bar after the loss parts."""
        return {}

    # ---- saving
    def save_weights(self, core: nn.Module, state: dict[str, torch.Tensor], checkpoint: Path) -> None:
        """Write the trained weights (``state``: gathered full values, main process only) into a checkpoint."""
        raise NotImplementedError

    def checkpoint_logs(self) -> dict[str, Any]:
        """Recorded in each checkpoint's trainer state besides the last logged losses."""
        return {}

    def finish(self, core: nn.Module, step: int, last_saved: Path | None, resume: ResumePoint | None) -> None:
        """After the last step, on every process (collectives allowed): what the stage leaves besides checkpoints."""


def say_left_out(recipe: Recipe, say) -> None:
    lines = recipe.left_out
    if not lines:
        return
    say(f"left out {len(lines)} clip(s):")
    for line in lines[:SHOWN_LEFT_OUT]:
        say(f"  {line}")
    if len(lines) > SHOWN_LEFT_OUT:
        say(f"  ... and {len(lines) - SHOWN_LEFT_OUT} more (see {Path(recipe.cfg.output_dir) / 'left_out.txt'})")


@reports_usage_errors  # a user's mistake found anywhere below: one error: line, exit 2
@releases_output_dir
def train(recipe_class: type[Recipe], doc: str | None, argv: list[str] | None = None) -> Path:
    """Parse a stage's command line (``doc``: its ``--help`` text) and train its recipe; returns output_dir.
    However it ends, the output directory is let go (a process that goes on, a test or a chain of stages, can
    start another run there)."""
    recipe = recipe_class(parse_stage_config(recipe_class.config_class, doc, argv))
    cfg = recipe.cfg
    train_cfg = cfg.train
    try:
        recipe.check()
    except ValueError as exc:
        raise UsageError(str(exc)) from None

    accelerator = build_accelerator(cfg.output_dir, train_cfg)
    recipe.accelerator = accelerator
    skip_model_weights_in_state(accelerator)
    say = accelerator.print

    # ---- the resume checkpoint, the data, the models: bad input fails here, before anything of the run is written
    # (a failed retry leaves a finished run's files alone); the resume first: a mistyped path fails in a second
    try:
        resume = resume_point(cfg, accelerator)
        recipe.build(resume)
    except BAD_INPUT as exc:
        raise UsageError(str(exc)) from None
    say_left_out(recipe, say)
    say(recipe.summary or f"{len(recipe.dataset)} examples")
    if train_cfg.compile:
        recipe.compile()

    # ---- the resume point's weights before prepare: the engine then shards the restored values
    load_resume_weights(resume, recipe.load_weights)
    model = recipe.model.to(accelerator.device)  # before the optimizer: AdamW is fused on CUDA
    optimizer = build_optimizer(recipe.parameters(), train_cfg)
    scheduler = recipe.scheduler(optimizer)
    configure_deepspeed(accelerator, train_cfg)
    model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
    core = accelerator.unwrap_model(model)
    trained = [p for p in model.parameters() if p.requires_grad]  # after prepare: the engine's own parameters
    model.train()

    # ---- resume: optimizer, schedule and every process's RNG (the weights: loaded above); the data order is a
    # function of the step
    seed_process(cfg.seed, accelerator)  # dropout, noise, timesteps differ per process
    step = restore(accelerator, resume, train_cfg.allow_rng_reset)
    out = start_run(accelerator, cfg, recipe.project, resume)
    if recipe.left_out and accelerator.is_main_process:
        atomic_write_text(out / "left_out.txt", "".join(f"{line}\n" for line in recipe.left_out))
    batches = resumable_batches(recipe.dataset, accelerator, train_cfg, cfg.seed, step, cfg.data.num_workers,
                                recipe.collator)

    def checkpoint(at_step: int, logs: dict) -> Path:
        state = gather_trained_state(core, accelerator.is_main_process)  # every process gathers; the main one writes
        return save_checkpoint(accelerator, out, at_step, lambda path: recipe.save_weights(core, state, path),
                               {**logs, **recipe.checkpoint_logs()}, keep=train_cfg.keep_checkpoints)

    # ---- the loop
    progress = tqdm(total=train_cfg.max_steps, initial=step, desc=recipe.project.replace("_", " "),
                    disable=not accelerator.is_main_process)
    names: list[str] | None = None
    logged: dict[str, float] = {}
    last_saved = None
    tokens, started, steps_since = 0, time.perf_counter(), 0
    if accelerator.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(accelerator.device)
    while step < train_cfg.max_steps:
        parts = None
        for micro in range(train_cfg.grad_accum):
            batch = next(batches)
            counted = recipe.tokens(batch)
            tokens += counted or 0
            batch = recipe.to_device(batch)
            with accelerator.accumulate(model):
                losses = recipe.loss(model, core, batch, step, micro)
                accelerator.backward(losses["loss"])
            names = names or list(losses)
            values = torch.stack([losses[k].detach().float() for k in names]) / train_cfg.grad_accum
            parts = values if parts is None else parts + values
        lrs = scheduler.get_last_lr()  # the rates this step applies
        grad_norm = optimizer_step(accelerator, model, optimizer, scheduler, trained, train_cfg.max_grad_norm)
        step += 1
        steps_since += 1
        progress.update(1)

        if step % train_cfg.log_every == 0 or step == train_cfg.max_steps:
            mean = accelerator.reduce(parts, reduction="mean")  # collective: every process logs together
            logged = dict(zip(names, mean.tolist(), strict=True))
            logs = {**logged, **recipe.interval_logs(), "grad_norm": grad_norm,
                    **dict(zip(recipe.lr_names, lrs, strict=True)), **recipe.step_logs(step - 1)}
            elapsed = max(time.perf_counter() - started, 1e-9)
            logs["steps_per_s"] = steps_since / elapsed
            if counted is not None:
                logs["tokens_per_s"] = tokens * accelerator.num_processes / elapsed
            if accelerator.device.type == "cuda":
                logs["peak_gpu_memory_gb"] = torch.cuda.max_memory_allocated(accelerator.device) / 1e9
            tokens, started, steps_since = 0, time.perf_counter(), 0
            accelerator.log(logs, step=step)
            progress.set_postfix({**{k: f"{v:.4f}" for k, v in logged.items()}, **recipe.postfix(step - 1)})
        if step % train_cfg.checkpoint_every == 0 or step == train_cfg.max_steps:
            last_saved = checkpoint(step, logged)
    progress.close()

    recipe.finish(core, step, last_saved, resume)
    end_run(accelerator)
    say(f"done: {step} steps; checkpoints in {out / 'checkpoints'}")
    return out
