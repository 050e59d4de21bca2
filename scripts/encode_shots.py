"""Write the stage (b) shot targets of a stage (a) checkpoint: s_a (N, H) of every clip, as a TensorStore.

    python scripts/encode_shots.py --config configs/stage_a.yaml                      # latest checkpoint of the run
    python scripts/encode_shots.py --config configs/stage_a.yaml --checkpoint outputs/stage_a/checkpoints/step_0040000

train_stage_a.py does this at the end of a run; this script redoes it for any checkpoint (or after new clips were
added to the manifest). The encoder reads the first frame's CLIP tokens and the motion text's T5 tokens from
``data.features_dir``; clips missing there are precomputed first. Writes ``--out`` (default
``output_dir/shot_targets``) with field ``shot_embeds`` per clip and ``source.json`` naming the checkpoint.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from animegamer.cli import parse_config
from animegamer.config import StageAConfig
from animegamer.data.features import precompute_features, write_shot_targets
from animegamer.io import resolve_checkpoint
from animegamer.models.trained import load_encoder


def main(argv: list[str] | None = None) -> Path:
    def flags(parser):
        parser.add_argument("--checkpoint", help="stage (a) checkpoint (default: the latest in output_dir)")
        parser.add_argument("--out", help="output TensorStore (default: output_dir/shot_targets)")
        parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                            help="where the encoder runs (default: cuda when available)")

    cfg, args = parse_config(StageAConfig, __doc__, argv, extra=flags)
    try:
        checkpoint = resolve_checkpoint(args.checkpoint or cfg.output_dir)
    except FileNotFoundError as exc:
        raise SystemExit(f"error: {exc} (train stage a first, or pass --checkpoint)") from None
    summary = precompute_features(cfg, args.device)
    if summary.written or summary.skipped:
        print(summary)
    encoder = load_encoder(checkpoint, device=args.device)
    state = checkpoint / "trainer_state.json"
    step = json.loads(state.read_text())["step"] if state.is_file() else None
    out = write_shot_targets(
        encoder,
        cfg.data.features_dir,
        Path(args.out or Path(cfg.output_dir) / "shot_targets"),
        source={"checkpoint": str(checkpoint), "step": step},
        device=args.device,
    )
    print(f"shot targets of {checkpoint} (step {step}): {out}")
    return out


if __name__ == "__main__":
    main()
