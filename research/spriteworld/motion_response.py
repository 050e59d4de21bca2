"""Does the decoder follow the motion level? The same shots rendered at every level, measured by the flow meter.

    python research/spriteworld/motion_response.py --config configs/spriteworld/eval.yaml \\
        --manifest outputs/spriteworld/data/clips.jsonl --split test

For clips of the manifest's held-out films (``--split train`` for the training films), the stage (a) encoder's shot
of each clip (its first frame + motion text) is rendered by the decoder once per requested motion level (same seed),
and every render goes through the evaluation's flow meter (``animegamer.eval.harness.build_level_meter``: the data's
flow settings and edges). A decoder that uses its motion scope draws more motion at higher levels: the mean measured
level climbs with the requested one (``slope`` near 1 for a perfect follower, 0 for a decoder that ignores the level,
whatever the meter's own noise). The real clips' measured levels are reported beside, as the meter's ceiling.

The decoder is stage (a)'s (``stage_a_checkpoint``) unless ``--decoder-checkpoint`` names another (stage c, or a
run of an ablation). Writes ``--out`` (JSON) and prints the summary.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.config.recorded import with_decoder_checkpoint
from animegamer.eval.research import add_split_flags, split_clips, write_report
from animegamer.states import NUM_MOTION_LEVELS


def follow_slope(requested: np.ndarray, measured: np.ndarray) -> float:
    """Least-squares slope of the measured level on the requested level (0: the level is ignored)."""
    requested, measured = np.asarray(requested, np.float64), np.asarray(measured, np.float64)
    if requested.shape != measured.shape or requested.ndim != 1 or np.ptp(requested) == 0:
        raise ValueError("need two 1-D arrays of one length with at least two distinct requested levels")
    centred = requested - requested.mean()
    return float((centred * (measured - measured.mean())).sum() / (centred * centred).sum())


def add_flags(parser) -> None:
    add_split_flags(parser, 30, "clips to render")
    parser.add_argument("--levels", default="1,2,3,4,5", help="comma-separated motion levels to render each shot at")
    parser.add_argument("--decoder-checkpoint", default="", help="decoder to test (default: stage_a_checkpoint)")
    parser.add_argument("--out", default="outputs/motion_response.json", help="JSON report")


def parse_levels(text: str) -> list[int]:
    try:
        levels = sorted({int(v) for v in text.split(",") if v.strip()})
    except ValueError:
        raise ValueError(f"--levels must be comma-separated integers, got {text!r}") from None
    if len(levels) < 2 or not all(1 <= v <= NUM_MOTION_LEVELS for v in levels):
        raise ValueError(f"--levels needs at least two distinct levels in 1..{NUM_MOTION_LEVELS}, got {text!r}")
    return levels


def main(argv: list[str] | None = None) -> dict:
    from animegamer.data.motion import motion_level, scorer_for
    from animegamer.data.video import read_video
    from animegamer.eval.harness import build_level_meter
    from animegamer.eval.systems import ShotEncoding
    from animegamer.game.build import load_renderer, resolve_device
    from animegamer.spriteworld.memory import caption_text

    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=add_flags)
    try:
        levels = parse_levels(args.levels)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    manifest, picks = split_clips(args.manifest, args.split, args.clips)
    checkpoint = args.decoder_checkpoint or cfg.stage_a_checkpoint
    if not checkpoint:
        raise SystemExit("error: no decoder: set stage_a_checkpoint or --decoder-checkpoint")
    try:
        variant = with_decoder_checkpoint(cfg.inference, checkpoint)
    except ValueError as exc:  # a damaged decoder_config.json, or a shape the config contradicts
        fail(str(exc))
    if not variant.decoder.motion_scope:
        raise SystemExit(f"error: the decoder of {checkpoint} has no motion level input (motion_scope false): every "
                         "level would render the same clip")
    device = resolve_device(cfg.inference.device)
    torch.manual_seed(cfg.seed)
    try:
        encoding = ShotEncoding.from_config(cfg, device)
        renderer = load_renderer(variant, device, False)
    except (FileNotFoundError, ValueError) as exc:  # missing or unreadable weights
        fail(str(exc))
    meter = build_level_meter(manifest, cfg.motion_calibration_clips)
    scorer = scorer_for(meter.settings)

    rows = []
    for record in tqdm(picks, desc="shots", unit="clip"):
        frames, _ = read_video(manifest.video_path(record))
        shot = encoding.encode(frames[0], caption_text(record))
        real_scope = scorer.score(frames)
        row = {"clip_id": record.clip_id, "level": record.motion_level,
               "real": {"scope": round(real_scope, 4), "measured": motion_level(real_scope, meter.edges)},
               "renders": {}}
        for level in levels:
            scope = scorer.score(renderer.render(shot, level, cfg.seed))
            row["renders"][level] = {"scope": round(scope, 4), "measured": motion_level(scope, meter.edges)}
        rows.append(row)

    requested = np.array([lv for _ in rows for lv in levels])
    measured = np.array([r["renders"][lv]["measured"] for r in rows for lv in levels])
    per_level = {
        lv: {"mean_measured_level": round(float(np.mean([r["renders"][lv]["measured"] for r in rows])), 3),
             "mean_flow_scope": round(float(np.mean([r["renders"][lv]["scope"] for r in rows])), 4)}
        for lv in levels
    }
    truth = np.array([r["level"] for r in rows])
    real = np.array([r["real"]["measured"] for r in rows])
    at_own = [r["renders"][r["level"]]["measured"] for r in rows if r["level"] in levels]
    own_truth = [r["level"] for r in rows if r["level"] in levels]
    report = {
        "split": args.split, "clips": len(rows), "decoder_checkpoint": checkpoint, "levels": levels,
        "slope": round(follow_slope(requested, measured), 4) + 0.0,  # + 0.0: no -0.0
        "per_level": per_level,
        "real_clips": {"acc": round(float((real == truth).mean()), 4),
                       "mae": round(float(np.abs(real - truth).mean()), 4),
                       "slope": round(follow_slope(truth, real), 4) if np.ptp(truth) else None},
        "rendered_at_own_level": {"acc": round(float(np.mean(np.equal(at_own, own_truth))), 4),
                                  "mae": round(float(np.mean(np.abs(np.subtract(at_own, own_truth)))), 4)},
        "meter": meter.info,
        "rows": rows,
    }
    return write_report(args.out, report, hide=("rows", "meter"))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
