"""Optimizer and learning-rate schedule from a :class:`TrainConfig`."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR

from animegamer.config import TrainConfig


def build_optimizer(params, train: TrainConfig) -> torch.optim.Optimizer:
    """AdamW over the given parameters (or parameter groups); fused on CUDA."""
    params = list(params)
    if not params:
        raise ValueError("no trainable parameters were given to the optimizer")
    fused = torch.cuda.is_available() and all(
        p.is_cuda for group in params for p in (group["params"] if isinstance(group, dict) else [group])
    )
    return torch.optim.AdamW(
        params, lr=train.lr, betas=tuple(train.betas), weight_decay=train.weight_decay, fused=fused or None
    )


def lr_factor(step: int, train: TrainConfig) -> float:
    """Multiplier of the base lr at optimizer step ``step``: linear warm-up, then constant/cosine/linear decay."""
    warmup = train.lr_warmup_steps
    if warmup and step < warmup:
        return (step + 1) / warmup
    if train.lr_scheduler == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, train.max_steps - warmup))
    if train.lr_scheduler == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress


def build_scheduler(optimizer: torch.optim.Optimizer, train: TrainConfig) -> LambdaLR:
    return LambdaLR(optimizer, lambda step: lr_factor(step, train))
