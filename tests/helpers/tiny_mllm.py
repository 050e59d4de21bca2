"""A tiny AnimeGamerMLLM with random trained parts, and earlier turns for it: the MLLM turn tests' inputs."""

from __future__ import annotations

from pathlib import Path

import torch

from animegamer.config import MLLMConfig
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.mllm_turn import HistoryTurn
from animegamer.states import StateValues

SLOTS, SHOT_DIM = 8, 16
INSTRUCTIONS = (
    "Character: Qiqi; Motion: quickly run; Background: park.",
    "Qiqi sleeps at night in the bedroom, very gently and for a long while",
)
HISTORY = (
    ("Character: Qiqi; Motion: quickly run; Background: park.", StateValues(4, 0, 1, -1)),
    ("Qiqi eats in the kitchen", StateValues(1, 1, 0, 1)),
    ("Character: Qiqi; Motion: dance; Background: beach.", StateValues(3, 1, 1, 0)),
)


def tiny_mllm(pretrained: str | Path, dtype: str = "fp32", seed: int = 0) -> AnimeGamerMLLM:
    """The tiny Mistral with LoRA r=4 and every trained tensor random (LoRA B would start at zero), in eval mode."""
    cfg = MLLMConfig(pretrained=str(pretrained), num_slots=SLOTS, shot_dim=SHOT_DIM, lora_rank=4, lora_alpha=8,
                     lora_dropout=0.0, gradient_checkpointing=False, dtype=dtype)
    torch.manual_seed(seed)
    model = AnimeGamerMLLM.from_config(cfg)
    g = torch.Generator().manual_seed(seed + 4)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval()


def history_turns(count: int, seed: int = 0) -> list[HistoryTurn]:
    """``count`` earlier turns (at most 3) with random shots on the host."""
    g = torch.Generator().manual_seed(seed)
    return [HistoryTurn(text, torch.randn(SLOTS, SHOT_DIM, generator=g), values) for text, values in HISTORY[:count]]
