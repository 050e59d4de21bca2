"""How close are stage (b)'s predicted shots to the stage (a) encoder's shots of the real clips?

    python research/spriteworld/shot_error.py --config configs/spriteworld/eval.yaml \\
        --manifest outputs/spriteworld/data/clips.jsonl --split test

For clips of the manifest's held-out films (``--split train`` for the training films), each clip's instruction is
played as a game's first turn (no history) and the MLLM's shot is compared with the *target*: the stage (a)
encoder's shot of the same clip (its first frame + motion text, exactly what stage (b) is trained to predict). The
text-only shot (the GC-style baseline's input: a mid-grey frame + the instruction) is compared too: it tells how
much of the target the words alone fix, i.e. what a perfect stage (b) could reach without seeing the clip.

``--history K`` plays each clip with the K clips before it in its film as teacher-forced history instead (their
instructions, stage (a) shots of the real clips and tagged values; at most ``inference.history_turns`` are read):
run it with K = 3 and K = 1 to see whether the MLLM uses turns further back. ``--own`` (with ``--history K``)
plays each clip's film from its start as a game does instead: the history is the MLLM's own earlier shots and
values (closed loop), so an older turn helps only if the MLLM's own shot of it carries what is left unsaid.
SpriteWorld memory clips are also split by their marks (``history``, ``far``: reach >= 2, ``full``), as the
evaluation splits game turns.

Errors are *relative*: mean squared error over (clips, tokens, channels) divided by the targets' variance over
clips, so predicting the mean shot scores 1 and the target itself 0; ``per_token`` gives the same per shot token.
Writes ``--out`` (JSON) and prints the summary.

    python research/spriteworld/shot_error.py --config configs/spriteworld/eval.yaml \\
        --manifest outputs/spriteworld/data/clips.jsonl --split test --clips 1000 --history 3
    python research/spriteworld/shot_error.py --config configs/spriteworld/eval.yaml \\
        --manifest outputs/spriteworld/data/clips.jsonl --split test --clips 1000 --history 3 --own
"""

from __future__ import annotations

import dataclasses

import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.eval.research import add_split_flags, split_clips, write_report


def relative_error(predicted: torch.Tensor, target: torch.Tensor) -> tuple[float, list[float]]:
    """(overall, per token) MSE of ``predicted`` against ``target`` (both (clips, N, D)) over the targets' variance."""
    if predicted.shape != target.shape or target.ndim != 3 or target.shape[0] < 2:
        raise ValueError(f"need two (clips >= 2, N, D) tensors of one shape; got {tuple(predicted.shape)} and "
                         f"{tuple(target.shape)}")
    spread = (target - target.mean(0)).square()  # (clips, N, D)
    error = (predicted - target).square()
    overall = float(error.mean() / spread.mean())
    per_token = (error.mean((0, 2)) / spread.mean((0, 2)).clamp_min(1e-12)).tolist()
    return overall, [round(v, 4) for v in per_token]


def add_flags(parser) -> None:
    add_split_flags(parser, 96, "clips to compare")
    parser.add_argument("--history", type=int, default=0,
                        help="earlier clips of the film given as teacher-forced history (0: each clip a first turn)")
    parser.add_argument("--own", action="store_true",
                        help="with --history: the history is the MLLM's own shots of the film's earlier clips, "
                             "played from its start as a game plays (closed loop), not the encoder's")
    parser.add_argument("--out", default="outputs/shot_error.json", help="JSON report")


def main(argv: list[str] | None = None) -> dict:
    from animegamer.data.video import read_video
    from animegamer.eval.intervals import mark_splits
    from animegamer.eval.systems import grey_frame, load_shot_models
    from animegamer.models.mllm_turn import HistoryTurn
    from animegamer.spriteworld.memory import caption_text

    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=add_flags)
    if args.history < 0:
        raise SystemExit(f"error: --history must be >= 0, got {args.history}")
    if args.own and not args.history:
        raise SystemExit("error: --own plays the film with its own history: give --history K >= 1")
    manifest, picks = split_clips(args.manifest, args.split, args.clips)
    if len(picks) < 2:
        raise SystemExit(f"error: {args.manifest}: {len(picks)} clip to compare; need at least 2 (--clips)")
    try:
        encoding, animegamer = load_shot_models(cfg)
    except (FileNotFoundError, ValueError) as exc:  # missing or unreadable weights
        fail(str(exc))
    grey = grey_frame(cfg.inference.sampling.height, cfg.inference.sampling.width)
    films, shots = manifest.films(), {}

    def shot_of(record) -> torch.Tensor:  # the stage (a) target of a real clip, (N, D)
        if record.clip_id not in shots:
            frames, _ = read_video(manifest.video_path(record))
            shots[record.clip_id] = encoding.encode(frames[0], caption_text(record))
        return shots[record.clip_id]

    played: dict[str, torch.Tensor] = {}  # --own: clip id -> the MLLM's shot in its film's closed-loop play
    # --own plays as the game does, reading (as teacher-forced) at most K turns
    closed_loop = dataclasses.replace(animegamer, history_turns=min(args.history, animegamer.history_turns))

    def own_shot(record) -> torch.Tensor:
        if record.clip_id not in played:
            clips = sorted((r for r in films[record.film_id] if r.tags), key=lambda r: r.clip_index)
            turns = []
            for clip in clips:
                turns.append(closed_loop.play_turn(turns, clip.shot_tags().instruction().render()))
            played.update((clip.clip_id, turn.shot_embeds) for clip, turn in zip(clips, turns, strict=True))
        return played[record.clip_id]

    def teacher_forced_shot(record, instruction: str) -> torch.Tensor:
        earlier = [r for r in films[record.film_id] if r.clip_index < record.clip_index and r.tags]
        history = [HistoryTurn(tags.instruction().render(), shot_of(r), tags.values)
                   for r in (earlier[max(len(earlier) - args.history, 0):] if args.history else [])
                   for tags in (r.shot_tags(),)]
        return animegamer.predictor.predict_turn(animegamer.window(history), instruction).shot_embeds.float().cpu()

    targets, predicted, text_only = [], [], []
    for record in tqdm(picks, desc="shots", unit="clip"):
        instruction = record.shot_tags().instruction().render()
        targets.append(shot_of(record))
        predicted.append(own_shot(record) if args.own else teacher_forced_shot(record, instruction))
        text_only.append(encoding.encode(grey, instruction))
    target, prediction = torch.stack(targets), torch.stack(predicted)  # (clips, N, D)
    mllm, mllm_tokens = relative_error(prediction, target)
    text, text_tokens = relative_error(torch.stack(text_only), target)
    variance = float((target - target.mean(0)).square().mean())
    marked = [mark_splits(record.extra or {}) for record in picks]  # unmarked clips: in none of the three
    by_split = {}
    for name in ("history", "far", "full"):
        rows = [i for i, names in enumerate(marked) if name in names]
        if len(rows) >= 2:  # relative to the variance of all targets, so splits compare with each other
            error = float((prediction[rows] - target[rows]).square().mean())
            by_split[name] = {"clips": len(rows), "mllm_relative_error": round(error / variance, 4)}
    report = {
        "split": args.split, "clips": len(picks), "history": args.history, "own": args.own, "by_split": by_split,
        "mllm_checkpoint": cfg.inference.mllm_checkpoint,
        "stage_a_checkpoint": cfg.stage_a_checkpoint,
        "mllm_relative_error": round(mllm, 4), "text_only_relative_error": round(text, 4),
        "target_variance": round(variance, 6),
        "per_token": {"mllm": mllm_tokens, "text_only": text_tokens},
    }
    return write_report(args.out, report, hide=("per_token",))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
