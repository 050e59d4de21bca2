"""The official reference set ($ANIMEGAMER_OFFICIAL_REF, else tests/data/official_ref) and the release tokenizer.

The reference set ships no tokenizer; :func:`animegamer.official.release_files.build_release_tokenizer` builds one
with the release's added tokens at the release's ids (the base vocabulary size comes from the set's Mistral config).
"""

from __future__ import annotations

import json
import os
from functools import cache
from pathlib import Path

from safetensors.torch import load_file

from animegamer.official.release_files import build_release_tokenizer, release_added_tokens

REPO = Path(__file__).resolve().parents[2]
REF_DIR = Path(os.environ.get("ANIMEGAMER_OFFICIAL_REF", REPO / "tests" / "data" / "official_ref"))

__all__ = ["REF_DIR", "REPO", "build_release_tokenizer", "mllm_reference", "release_added_tokens"]


@cache
def mllm_reference() -> tuple[dict, dict]:
    """(mllm_ref.json, mllm_ref.safetensors tensors)."""
    return json.loads((REF_DIR / "mllm_ref.json").read_text()), load_file(str(REF_DIR / "mllm_ref.safetensors"))
