"""The MLLM's tokenizer: the base model's, with the layout's special tokens added after its vocabulary.

Cheap (no weights): entry points load it to validate instructions before any model is loaded, and
:class:`animegamer.models.mllm.AnimeGamerMLLM` indexes its added tokens' rows from the base vocabulary size it
returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from animegamer.tokens import add_special_tokens, get_vocabulary


def load_tokenizer(pretrained: str, vocabulary: str = "paper", num_slots: int = 226) -> tuple[Any, int]:
    """The base tokenizer with the layout's special tokens added; returns (tokenizer, base vocabulary size).

    A tokenizer that already holds every token of the layout (the release's ``animegamer_tokenizer``, copied into a
    converted checkpoint) is taken as it is: its added tokens keep their ids, which the converted rows follow.
    Cheap (no weights), so entry points use it to validate instructions before any model is loaded.
    """
    from transformers import AutoTokenizer

    if not Path(pretrained).is_dir():
        raise FileNotFoundError(f"MLLM base model directory not found: {pretrained} (mllm.pretrained)")
    tokenizer = AutoTokenizer.from_pretrained(pretrained)
    vocab = get_vocabulary(vocabulary)
    tokens = vocab.special_tokens(num_slots)
    shipped = shipped_layout_base(tokenizer, tokens)
    if shipped is not None:
        return tokenizer, shipped
    base_vocab = len(tokenizer)
    add_special_tokens(tokenizer, vocab, num_slots)
    ids = tokenizer.convert_tokens_to_ids(tokens)
    # The new rows are indexed as id - base_vocab; a base tokenizer that already knew one of these tokens would
    # break that, so say so instead of training the wrong rows.
    if sorted(ids) != list(range(base_vocab, base_vocab + len(tokens))):
        raise ValueError(
            f"{pretrained}: the tokenizer already defines some of the {vocabulary!r} special tokens; "
            "expected them all to be new (ids from the base vocabulary size up)"
        )
    return tokenizer, base_vocab


def shipped_layout_base(tokenizer: Any, tokens: list[str]) -> int | None:
    """The base vocabulary size of a tokenizer that already holds all of ``tokens`` as added tokens placed after
    its base vocabulary (ids ``vocab_size`` .. ``len - 1``, every one of them added); None for any other tokenizer."""
    base = int(tokenizer.vocab_size)
    added = tokenizer.get_added_vocab()
    if not all(t in added and added[t] >= base for t in tokens):
        return None
    new_ids = sorted(i for i in added.values() if i >= base)
    if new_ids != list(range(base, len(tokenizer))):
        raise ValueError(
            f"the tokenizer's added tokens do not follow its base vocabulary of {base} contiguously "
            f"(ids {new_ids[:2]}..{new_ids[-1:]}, length {len(tokenizer)})"
        )
    return base
