"""SpriteWorld's stand-in for CogVideoX-2B pretraining: the frozen T5, VAE and base transformer that stage (a)
fine-tunes, trained on SpriteWorld's training films.

    python scripts/spriteworld/pretrain.py --config configs/spriteworld/pretrain.yaml
    python scripts/spriteworld/pretrain.py --config configs/spriteworld/pretrain.yaml resume_vae=true  # transformer
    python scripts/spriteworld/pretrain.py --config configs/spriteworld/pretrain.yaml resume_vae=true \\
        init_transformer=outputs/spriteworld/models/CogVideoX/transformer  # transformer.max_steps more steps
    python scripts/spriteworld/pretrain.py --config configs/spriteworld/pretrain.yaml transformer_cycles=3  # restarts

Writes ``output_dir``: a whole diffusers CogVideoX folder (text_encoder, tokenizer, vae, transformer, scheduler,
model_index.json) for ``decoder.pretrained`` and ``t5.path``; ``data.features_dir``: the stage (a) features of
every clip of ``data.manifest``; ``report_dir``: metrics.jsonl, config.yaml, summary.json, vae_reconstruction.png
and samples.png. What each part learns and why: animegamer/spriteworld/pretrain.py (and pretrain_vae.py,
pretrain_transformer.py). ``scripts/spriteworld/train.py`` runs it as the step ``pretrain``.
"""

from __future__ import annotations

from pathlib import Path

from animegamer.cli import fail, parse_config, reports_usage_errors
from animegamer.config import SpriteWorldPretrainConfig
from animegamer.data.manifest import ManifestError
from animegamer.spriteworld.pretrain import pretrain


@reports_usage_errors
def main(argv: list[str] | None = None) -> Path:
    cfg, _ = parse_config(SpriteWorldPretrainConfig, __doc__, argv)
    try:
        return pretrain(cfg)
    except ManifestError as exc:
        fail(str(exc))


if __name__ == "__main__":
    main()
