"""SpriteWorld's stand-in for Mistral-7B's pretraining: the tiny random Mistral trained, all parameters, as a causal
LM on the training films' text (each film one document: every turn's instruction followed by its tag line).

    python scripts/spriteworld/pretrain_llm.py --config configs/spriteworld/pretrain_llm.yaml

Writes ``output_dir``: the pretrained model + tokenizer (a transformers folder, swapped in whole, so it may be
``pretrained``), and ``report_dir``: metrics.jsonl, config.yaml, summary.json. Why stage (b) needs it:
animegamer/spriteworld/pretrain_llm.py. ``scripts/spriteworld/train.py`` runs it as the step ``pretrain_llm``.
"""

from __future__ import annotations

from pathlib import Path

from animegamer.cli import fail, parse_config
from animegamer.config import SpriteWorldLLMConfig
from animegamer.data.manifest import ManifestError
from animegamer.spriteworld.pretrain_llm import pretrain_llm


def main(argv: list[str] | None = None) -> Path:
    cfg, _ = parse_config(SpriteWorldLLMConfig, __doc__, argv)
    try:
        return pretrain_llm(cfg)
    except (ManifestError, FileNotFoundError) as exc:
        fail(str(exc))


if __name__ == "__main__":
    main()
