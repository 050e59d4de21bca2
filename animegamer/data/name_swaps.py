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
:data:`SWAP_TEXT_FIELD` (S, Nt, Dt); the shot targets hold their encoded shots under :data:`SWAP_SHOT_FIELD`
(S, N, H). A clip that names no one but its subject has neither.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

SWAP_TEXT_FIELD = "swap_text_tokens"
SWAP_SHOT_FIELD = "swap_shots"


def _word(name: str) -> re.Pattern:
    return re.compile(rf"(?<!\w){re.escape(name)}(?!\w)")


def name_swaps(caption: str, subject: str, names: Sequence[str], limit: int = 0) -> list[str]:
    """``caption`` once for every (named character besides ``subject``, character of ``names`` it does not name)
    pair, with every whole-word occurrence of the first replaced by the second; at most ``limit`` (0: all), in the
    order of ``names``. Names are matched case-sensitively as whole words."""
    if limit < 0:
        raise ValueError(f"limit={limit} must be >= 0")
    present = [n for n in dict.fromkeys(names) if n != subject and _word(n).search(caption)]
    absent = [n for n in dict.fromkeys(names) if n != subject and n not in present and not _word(n).search(caption)]
    swaps = [_word(old).sub(new, caption) for old in present for new in absent]
    return swaps[:limit] if limit else swaps
