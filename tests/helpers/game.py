"""What the game tests share: the tiny inference config and its overrides, a short game, a played two-turn game
(the ``played`` fixture in conftest.py), a renderer that fails on cue, and the tools that forge a save file from a
real one."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors import safe_open
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny" / "inference.yaml"
GAME = [
    "Character: Qiqi; Motion: slowly wake up; Background: morning bedroom.",
    "Qiqi eats breakfast in the kitchen",
    "Character: Qiqi; Motion: quickly run; Background: park.",
]


def tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, out):
    return [
        f"output_dir={out}", f"mllm.pretrained={tiny_mistral_dir}", f"decoder.pretrained={tiny_cogvideox_dir}",
        "mllm_checkpoint=", "decoder_checkpoint=", "history_turns=2",
        "sampling.steps=2", "sampling.height=48", "sampling.width=64", "sampling.num_frames=9",
    ]


class FailingRenderer:
    """The real renderer; its next clip raises ``error`` after the clip's first frames were decoded (the game shows
    them when it listens for them)."""

    def __init__(self, renderer, error: BaseException | None):
        self.renderer, self.fps, self.error = renderer, renderer.fps, error

    def latents(self, *args):
        return self.renderer.latents(*args)

    def chunk_count(self, latents):
        return self.renderer.chunk_count(latents)

    def decode(self, latents):
        error, self.error = self.error, None
        for chunk in self.renderer.decode(latents):
            yield chunk
            if error is not None:
                raise error


def rewrite(save: Path, out: Path, meta_fn=None, tensors_fn=None) -> Path:
    """A copy of ``save`` with its metadata JSON and/or tensors changed by the given functions."""
    with safe_open(str(save), framework="pt") as fh:
        meta = json.loads(fh.metadata()["game"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}
    if meta_fn is not None:
        meta = meta_fn(meta)
    if tensors_fn is not None:
        tensors = tensors_fn(tensors)
    save_file(tensors, str(out), metadata={"game": meta if isinstance(meta, str) else json.dumps(meta)})
    return out


def put(**items):
    """A change of a mapping (the save's metadata or its tensors): these keys set."""
    return lambda mapping: {**mapping, **items}


def drop(key):
    return lambda mapping: {k: v for k, v in mapping.items() if k != key}


def turn0(key, value):
    """A change of the first turn's record: ``key`` set to ``value``."""
    def change(meta):
        meta["turns"][0][key] = value
        return meta
    return change
