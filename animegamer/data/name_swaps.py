"""Identity swaps: a clip's caption with another character's name in place of each character it names besides its
subject, the counterfactual shots stage (b)'s identity term measures against.

The stage (a) encoder reads a clip's first frame and its caption. Encoding the same frame with a caption that names
another friend gives the shot the encoder would have made had that friend been there: ``target - swapped`` is the
direction in which the shot says *who*. It is a small part of the shot's variance, so a plain MSE lets the MLLM's
prediction drift along it (the friend is then drawn wrong, and a turn that reads the shot back inherits the error);
:func:`animegamer.training.losses.identity_term` measures the prediction's error along each such direction in units
of its length.

    name_swaps("Character: Kai; Motion: talk with Luna. Companion: Luna.", "Kai", ["Qiqi", "Momo", "Kai", "Luna"])
    # -> ["... talk with Qiqi. Companion: Qiqi.", "... talk with Momo. Companion: Momo."]

The names are the world's characters (a character registry's, ``animegamer.data.characters``); the subject keeps
its name (the instruction always says it). Features hold the swapped captions' text tokens under
:data:`SWAP_TEXT_FIELD` (S, Nt, Dt) and which name each swap put in place of which under :data:`SWAP_NAMES_FIELD`
(:func:`names_tensor`); the shot targets hold their encoded shots under :data:`SWAP_SHOT_FIELD` (S, N, H) and the
names again. A clip that names no one but its subject has none of them.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import torch

SWAP_TEXT_FIELD = "swap_text_tokens"
SWAP_SHOT_FIELD = "swap_shots"
SWAP_NAMES_FIELD = "swap_names"
NAME_CODES = 32  # a name's characters stored per swap (code points, zero-padded)


def _word(name: str) -> re.Pattern:
    return re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")


def swap_pairs(caption: str, subject: str, names: Sequence[str], limit: int = 0) -> list[tuple[str, str]]:
    """The (named character, character put in its place) of each of :func:`name_swaps`' swaps, in its order."""
    if limit < 0:
        raise ValueError(f"limit={limit} must be >= 0")
    present = [n for n in dict.fromkeys(names) if n != subject and _word(n).search(caption)]
    absent = [n for n in dict.fromkeys(names) if n != subject and n not in present]
    pairs = [(old, new) for old in present for new in absent]
    return pairs[:limit] if limit else pairs


def name_swaps(caption: str, subject: str, names: Sequence[str], limit: int = 0) -> list[str]:
    """``caption`` once for every (named character besides ``subject``, character of ``names`` it does not name)
    pair, with every whole-word occurrence of the first replaced by the second; at most ``limit`` (0: all), in the
    order of ``names``. Names are matched case-sensitively as whole words."""
    return [rename(caption, old, new) for old, new in swap_pairs(caption, subject, names, limit)]


def rename(text: str, old: str, new: str) -> str:
    """``text`` with every whole-word ``old`` replaced by ``new``."""
    return _word(old).sub(new, text)


def mentions(text: str, name: str) -> bool:
    """Whether ``text`` says ``name`` as a whole word."""
    return _word(name).search(text) is not None


def names_tensor(pairs: Sequence[tuple[str, str]]) -> torch.Tensor:
    """(S, 2, :data:`NAME_CODES`) int32 code points of each swap's (old, new) names, zero-padded: how a tensor
    store keeps which swap names whom. A name longer than NAME_CODES characters raises ValueError."""
    out = torch.zeros(len(pairs), 2, NAME_CODES, dtype=torch.int32)
    for s, pair in enumerate(pairs):
        for k, name in enumerate(pair):
            if not name or len(name) > NAME_CODES or "\0" in name:
                raise ValueError(f"name {name!r} is empty, has a NUL or is longer than {NAME_CODES} characters")
            out[s, k, : len(name)] = torch.tensor([ord(c) for c in name], dtype=torch.int32)
    return out


def names_from_tensor(codes: torch.Tensor) -> list[tuple[str, str]]:
    """The inverse of :func:`names_tensor`; a tensor of another shape or with codes outside Unicode raises
    ValueError (it comes from a file)."""
    if codes.dim() != 3 or codes.shape[1] != 2 or codes.shape[2] != NAME_CODES:
        raise ValueError(f"swap names of shape {tuple(codes.shape)}; expected (S, 2, {NAME_CODES})")
    values = codes.tolist()
    if any(c < 0 or c > 0x10FFFF for pair in values for name in pair for c in name):
        raise ValueError("swap names hold codes outside Unicode")
    pairs = [tuple("".join(chr(c) for c in name if c) for name in pair) for pair in values]
    if any(not name for pair in pairs for name in pair):
        raise ValueError("a swap names an empty name")
    return pairs
