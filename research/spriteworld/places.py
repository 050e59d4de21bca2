"""Is the asked-for place on screen? Place and time-of-day accuracy of rendered SpriteWorld first turns.

    python research/spriteworld/places.py --config configs/spriteworld/inference.yaml \\
        --manifest outputs/spriteworld/data/clips.jsonl --shot-targets outputs/spriteworld/stage_a/shot_targets

For clips of the held-out films (``--split train`` for the training films), each clip's instruction is played as a
game's first turn (no history): the MLLM predicts the shot and the decoder renders it. With ``--shot-targets``
(stage (a)'s encoder shots of the real clips) the encoder's shot of the same clip is rendered too: the ceiling of
what the decoder draws from a shot. A rendered clip's place and time of day are those of the nearest empty scenery
(per-pixel median of the first frames of the manifest's clips of each background, "noon park" and so on; mean
squared distance to the clip's mean frame). SpriteWorld has 6 places and 4 times of day, so chance is ~1/6 and ~1/4.
On the memory world a turn's tag line may say "still here" (what earlier turns fixed): as a first turn has no
history, every clip is played with its fully specified instruction (its spec) and scored against its true scene.

Writes ``--out`` (JSON: the accuracies and every turn's instruction, prediction and rendered scene) and prints the
accuracies.
"""

from __future__ import annotations

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import InferenceConfig
from animegamer.data.manifest import ClipRecord
from animegamer.eval.research import add_split_flags, split_clips, write_report

SCENERY_CLIPS = 12  # clips per background whose first frames make its empty scenery


def sceneries(manifest, records: list[ClipRecord], per_scene: int = SCENERY_CLIPS) -> dict[str, np.ndarray]:
    """Background ("noon park") -> its empty scenery (H, W, 3) float: the per-pixel median of first frames.

    Figures stand at different spots in different clips, so the median over clips is the scenery without them.
    """
    from animegamer.data.video import read_video

    by_scene: dict[str, list[ClipRecord]] = {}
    for record in records:
        by_scene.setdefault(true_background(record), []).append(record)
    return {
        scene: np.median(np.stack([read_video(manifest.video_path(r))[0][0] for r in rs[:per_scene]]), axis=0)
        .astype(np.float32)
        for scene, rs in sorted(by_scene.items())
    }


def true_background(record: ClipRecord) -> str:
    """"noon park": the shot's time and place (from its spec: a memory clip's tags may say "still here")."""
    if "place" in record.extra and "time" in record.extra:
        return f"{record.extra['time']} {record.extra['place']}"
    return record.shot_tags().environment


def full_instruction(record: ClipRecord) -> str:
    """The instruction naming the shot's time, place and friend (a memory clip's own may leave them out)."""
    from animegamer.spriteworld import ShotSpec

    keys = ("character", "action", "place", "time", "adverb", "friend")
    if all(k in record.extra for k in keys):
        return ShotSpec(**{k: record.extra[k] for k in keys}).instruction().render()
    return record.shot_tags().instruction().render()


def nearest_scene(frames: np.ndarray, scenes: dict[str, np.ndarray]) -> str:
    """The background whose scenery is nearest (mean squared distance) to the mean frame of ``frames`` (T, H, W, 3)."""
    import cv2

    mean = frames.astype(np.float32).mean(axis=0)
    first = next(iter(scenes.values()))
    if mean.shape != first.shape:
        mean = cv2.resize(mean, (first.shape[1], first.shape[0]), interpolation=cv2.INTER_AREA)
    return min(scenes, key=lambda s: float(np.square(scenes[s] - mean).mean()))


def add_flags(parser) -> None:
    add_split_flags(parser, 24, "clips to play", count_flag="--turns")
    parser.add_argument("--shot-targets", default="", help="stage (a) shot targets: also render the encoder's shots")
    parser.add_argument("--out", default="outputs/spriteworld/places.json", help="JSON report")


def main(argv: list[str] | None = None) -> dict:
    from animegamer.data.stage_b import SHOT_FIELD
    from animegamer.data.tensor_store import TensorStore
    from animegamer.game.build import build_game

    cfg, args = parse_config(InferenceConfig, __doc__, argv, extra=add_flags)
    manifest, picks = split_clips(args.manifest, args.split, args.turns)
    scenes = sceneries(manifest, [r for r in manifest.records if r.tags])
    try:
        targets = TensorStore(args.shot_targets) if args.shot_targets else None
        animegamer = build_game(cfg)
    except (FileNotFoundError, ValueError) as exc:  # missing or unreadable weights / shot targets
        fail(str(exc))
    rows = []
    for record in tqdm(picks, desc="places", unit="turn"):
        tags = record.shot_tags()
        prediction = animegamer.play_turn([], full_instruction(record), render=False)
        shots = {"mllm": (prediction.shot_embeds, prediction.values.motion_level)}
        if targets is not None and record.clip_id in targets:  # the real clip's shot, at its true level
            target = targets.load(record.clip_id, (SHOT_FIELD,))[SHOT_FIELD].float()
            shots["encoder"] = (target, tags.values.motion_level)
        row = {"clip_id": record.clip_id, "background": true_background(record)}
        for name, (shot, level) in shots.items():
            frames = animegamer.renderer.render(shot, level, seed=cfg.seed)
            row[name] = nearest_scene(frames, scenes)
        rows.append(row)

    def accuracy(name: str, part: int) -> float | None:
        scored = [r for r in rows if name in r]
        if not scored:
            return None
        return float(np.mean([r[name].split()[part] == r["background"].split()[part] for r in scored]))

    report = {
        "split": args.split,
        "turns": len(rows),
        "scenes": sorted(scenes),
        **{f"{name}_{what}_accuracy": accuracy(name, part)
           for name in ("mllm", "encoder") for what, part in (("place", -1), ("time", 0))},
        "rows": rows,
    }
    return write_report(args.out, report, hide=tuple(k for k in report if not k.endswith("accuracy")))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
