"""Precompute stage (a) features: VAE latents, CLIP tokens of sampled frames, T5 tokens of the motion text.

    python scripts/precompute_features.py --config configs/stage_a.yaml
    python scripts/precompute_features.py --config configs/tiny/stage_a.yaml

Reads ``data.manifest`` and writes a TensorStore at ``data.features_dir`` (see animegamer/data/features.py).
Resumable: clips already there are skipped. Corrupt, missing or uncaptioned clips are reported by path, listed in
``features_dir/skipped.json`` and skipped; ``--retry-skipped`` tries them again. train_stage_a.py runs the same
step for clips it finds missing, so this script is for doing it ahead of time (e.g. on a separate GPU job).
"""

from __future__ import annotations

import torch

from animegamer.cli import parse_config
from animegamer.config import StageAConfig
from animegamer.data.features import precompute_features


def main(argv: list[str] | None = None) -> None:
    def flags(parser):
        parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                            help="where the feature models run (default: cuda when available)")
        parser.add_argument("--retry-skipped", action="store_true", help="try clips listed in skipped.json again")
        parser.add_argument("--shard-size", type=int, default=32, help="clips per safetensors shard")

    cfg, args = parse_config(StageAConfig, __doc__, argv, extra=flags)
    summary = precompute_features(cfg, args.device, retry_skipped=args.retry_skipped, shard_size=args.shard_size)
    print(summary)
    for clip_id, info in summary.skipped.items():
        print(f"  skipped {info['video']} ({clip_id}): {info['reason']}")


if __name__ == "__main__":
    main()
