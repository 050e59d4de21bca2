"""What every training stage does the same way under DDP, DeepSpeed ZeRO-2/3 (with or without CPU offload) and
FSDP2: check the launch, tell DeepSpeed our batch settings, seed each process, step the optimizer, gather the trained
parameters for a save.

The pure pieces the one training loop (training/loop.py) calls:

    check_world_size(accelerator)               before anything is read or written (build_accelerator calls it)
    configure_deepspeed(accelerator, train)     before ``accelerator.prepare``
    seed_process(seed, accelerator)             after ``prepare``: dropout, noise, timesteps differ per process
    grad_norm = optimizer_step(...)             once per optimizer step, after the micro-batches
    state = gather_trained_state(core, ...)     on every process before a save; the main process writes ``state``
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from typing import Any

import torch
from accelerate.utils import DistributedType, set_seed
from torch import nn

from animegamer.cli import UsageError
from animegamer.config import TrainConfig


def check_world_size(accelerator) -> None:
    """Refuse (:class:`~animegamer.cli.UsageError`, one ``error:`` line from the program) a launch that started
    more processes than accelerate sees.

    That happens when an engine cannot start on this machine (accelerate's FSDP plugin on CPUs, for one): each
    process would then train alone into the same output directory and the processes would overwrite each other's
    checkpoints. Called before anything of the run is read or written."""
    launched = os.environ.get("WORLD_SIZE", "")
    if launched.isdigit() and int(launched) > accelerator.num_processes:
        raise UsageError(
            f"the launcher started {launched} processes (WORLD_SIZE) but accelerate sees "
            f"{accelerator.num_processes} ({accelerator.distributed_type}): the accelerate config's engine did not "
            "start on this machine (FSDP needs GPUs; on CPUs use configs/accelerate/cpu_2proc.yaml with "
            "ACCELERATE_USE_CPU=true, or a DeepSpeed config with DS_ACCELERATOR=cpu)"
        )


def configure_deepspeed(accelerator, train: TrainConfig) -> None:
    """Give DeepSpeed our batch settings before ``accelerator.prepare``: micro batch, accumulation, the global
    batch (micro x accumulation x processes) and clipping, so nothing is left ``auto`` (no prepared DataLoader
    tells accelerate the batch size, and our config is the one source of truth). With the optimizer offloaded to
    the CPU, DeepSpeed keeps our AdamW instead of demanding its own compiled CPU Adam. A no-op on other engines."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return
    plugin = accelerator.state.deepspeed_plugin
    ds_config = plugin.deepspeed_config
    ds_config["train_micro_batch_size_per_gpu"] = train.batch_size
    ds_config["gradient_accumulation_steps"] = train.grad_accum
    ds_config["train_batch_size"] = train.batch_size * train.grad_accum * accelerator.num_processes
    ds_config["gradient_clipping"] = max(train.max_grad_norm, 0.0)  # DeepSpeed clips inside its step; 0 = off
    offload = ds_config.get("zero_optimization", {}).get("offload_optimizer", {}).get("device", "none")
    if offload not in (None, "none"):
        ds_config["zero_force_ds_cpu_optimizer"] = False
    accelerator.gradient_accumulation_steps = train.grad_accum


def engine_info(accelerator) -> dict[str, Any]:
    """What a run records of its engine beyond accelerate's distributed type (run_info.json's ``deepspeed``): the
    ZeRO stage and where DeepSpeed keeps the optimizer state and the parameters (``none`` or ``cpu``), as DeepSpeed
    was configured. Empty on other engines."""
    if accelerator.distributed_type != DistributedType.DEEPSPEED:
        return {}
    zero = accelerator.state.deepspeed_plugin.deepspeed_config.get("zero_optimization", {})
    return {
        "zero_stage": int(zero.get("stage", 0)),
        "offload_optimizer": (zero.get("offload_optimizer") or {}).get("device") or "none",
        "offload_param": (zero.get("offload_param") or {}).get("device") or "none",
    }


def seed_process(seed: int, accelerator) -> None:
    """Seed this process's RNGs with ``seed + process_index``: dropout, noise and timesteps differ per process
    (the same draws on every rank would waste the extra batch), while the batch order stays a pure function of the
    step (:mod:`animegamer.training.batches` has its own generator). Call after ``prepare`` (an engine may draw
    random numbers while it wraps the model) and before a resume restores the saved RNG states."""
    set_seed(seed + accelerator.process_index)


def optimizer_step(accelerator, model, optimizer, scheduler, params: Iterable[nn.Parameter],
                   max_grad_norm: float) -> float:
    """Clip, step, schedule and zero once the step's micro-batches are done; returns the global gradient norm
    before clipping (NaN where the engine reports none).

    ``params``: the trained parameters, as the prepared model holds them. Under DeepSpeed the engine has already
    clipped (``gradient_clipping``, see :func:`configure_deepspeed`) and stepped inside ``accelerator.backward`` of
    the last micro-batch; the calls here are then no-ops and the norm is the engine's. Elsewhere the norm is over
    ``params`` on every process (DDP has averaged the gradients; FSDP2 reduces over the shards)."""
    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        norm = model.get_global_grad_norm()
    else:
        norm = accelerator.clip_grad_norm_(list(params), max_grad_norm if max_grad_norm > 0 else math.inf)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    if norm is None:
        return float("nan")
    if hasattr(norm, "full_tensor"):  # a DTensor under FSDP2
        norm = norm.full_tensor()
    return float(norm)


def gather_trained_state(core: nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """The full values of ``core``'s trained parameters (``requires_grad``), keyed as in ``core.state_dict()``, as
    CPU tensors where ``keep`` (the main process; an empty dict elsewhere). Every process must call it: under
    ZeRO-3 and FSDP2 each holds only shards, gathered here one parameter at a time, so a save never writes a ZeRO-3
    placeholder or an FSDP2 shard as weights, and the frozen base is never gathered. The engine is read off the
    parameters themselves (DeepSpeed's ``ds_id``, FSDP2's DTensors), so the same call serves every engine.

    ``core``: ``accelerator.unwrap_model(model)`` (FSDP2 shards the module in place; it is its own core)."""
    out: dict[str, torch.Tensor] = {}
    for name, param in core.named_parameters():
        if not param.requires_grad:
            continue
        if hasattr(param, "ds_id"):  # a ZeRO-3 partition: gathered on every process for the copy
            import deepspeed

            with deepspeed.zero.GatheredParameters([param], modifier_rank=None):
                if keep:
                    out[name] = param.detach().to("cpu", copy=True)
            continue
        value = param.detach()
        if hasattr(value, "full_tensor"):  # an FSDP2 DTensor shard: all-gathered (a collective on every process)
            value = value.full_tensor()
        if keep:
            out[name] = value.to("cpu", copy=True)
    return out


def sub_state(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The entries of ``state`` under ``prefix`` (``"decoder."``), with the prefix removed."""
    return {name[len(prefix):]: value for name, value in state.items() if name.startswith(prefix)}
