"""What the MLLM results tests (tests/test_inference_results.py, tests/test_inference_untrusted.py) share: the tiny
inference config, turns made up without a model, a results folder written by the real writer, an entry point loaded
by path, and a guard that no model loads before the input is checked."""

from __future__ import annotations

import importlib
from pathlib import Path

import torch

from animegamer.game.results import ResultsWriter
from animegamer.game.turn import Turn
from animegamer.states import CharacterState, StateValues

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny" / "inference.yaml"
SHAPE = (226, 32)  # the tiny config's mllm.num_slots x mllm.shot_dim
VALUES = StateValues(motion_level=2, social=1, entertainment=0, stamina=-1)


def entry(name):
    """A program at the checkout's root (inference_MLLM, inference_Decoder, app) as a module."""
    return importlib.import_module(name)


def played(index: int, shape=SHAPE, instruction: str | None = None) -> Turn:
    shot = torch.randn(*shape, generator=torch.Generator().manual_seed(index))
    return Turn(index, instruction or f"Qiqi runs {index}", VALUES, CharacterState(), shot, 40)


def results_dir(out: Path, turns: int = 2, shape=SHAPE, finish: bool = True) -> Path:
    summary = {"game": "g.txt", "history_turns": 1, "seed": 3, "mllm": {"num_slots": shape[0], "shot_dim": shape[1]}}
    with ResultsWriter(out, summary) as results:
        for i in range(turns):
            results.add(played(i, shape))
        if finish:
            results.finish()
    return out


def refuse_models(monkeypatch, module, *names):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    for name in names:
        monkeypatch.setattr(module, name, no_model)
