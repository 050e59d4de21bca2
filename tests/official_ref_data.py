"""The official reference set ($ANIMEGAMER_OFFICIAL_REF, else tests/data/official_ref) and a release-id tokenizer.

The reference set ships no tokenizer; the release's ``animegamer_tokenizer`` is a 32000-piece Llama tokenizer with 284
added tokens. :func:`build_release_tokenizer` trains a tiny BPE tokenizer on the fly, pads its base vocabulary to the
set's size and adds tokens at the release's ids (``<frame_00000>`` = base … ``</TURN>`` = base + 283). Three ids
whose names the reference does not show get placeholder names; nothing reads them.
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

from safetensors.torch import load_file

REPO = Path(__file__).resolve().parents[1]
REF_DIR = Path(os.environ.get("ANIMEGAMER_OFFICIAL_REF", REPO / "tests" / "data" / "official_ref"))


@cache
def mllm_reference() -> tuple[dict, dict]:
    """(mllm_ref.json, mllm_ref.safetensors tensors)."""
    return json.loads((REF_DIR / "mllm_ref.json").read_text()), load_file(str(REF_DIR / "mllm_ref.safetensors"))


def release_added_tokens() -> list[str]:
    """The release tokenizer's added tokens in id order (base + 0 … base + 283)."""
    frames = [f"<frame_{i:05d}>" for i in range(256)]
    shot = ["<img>", "</img>", "<release_unused_0>", "<release_unused_1>", "<frame>", "</frame>"]
    strengths = [f"<Strength_{k}>" for k in range(-5, 6)]
    tags = ["<ML>", "</ML>", "<SC>", "</SC>", "<ET>", "</ET>", "<ST>", "</ST>", "<TURN>", "</TURN>"]
    return [*frames, *shot, *strengths, "<release_unused_2>", *tags]


def build_release_tokenizer(out_dir: str | Path, base_vocab: int) -> Path:
    """A fast tokenizer with ``base_vocab`` base pieces (<unk> 0, <s> 1, </s> 2) and the release's added tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from animegamer.tiny import corpus_lines

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus_lines(repeat=2), trainer=trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), base_vocab):  # unreachable filler pieces up to the base vocabulary size
        vocab[f"<filler_{i}>"] = i
    tok = Tokenizer.from_str(json.dumps(data))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    fast.add_special_tokens({"additional_special_tokens": release_added_tokens()})
    out_dir = Path(out_dir)
    fast.save_pretrained(str(out_dir))
    return out_dir
