"""Where is the friend's identity lost? Linear probes along the shot's path, the history window, the MLLM's attention.

    python research/spriteworld/identity_probes.py --config configs/spriteworld/eval.yaml \\
        --out benchmarks/spriteworld/identity_probes.json

Every held-out game is played as a game plays it (closed loop, K = ``inference.history_turns``, no rendering). At
every turn with a friend in view (the friend of a social shot, or the companion following unsaid) the friend's
name is the label, and these features are kept:

- ``clip_real_frame``: the stand-in CLIP's tokens of the real clip's first frame (what it keeps of shirt colour);
- ``t5_caption``: the stand-in T5's tokens of the real clip's caption (what it keeps of the name);
- ``encoder_real``: the stage (a) encoder's shot of the real clip (first frame + caption): stage (b)'s target;
- ``encoder_frame_only``: the same with the friend's name taken out of the caption (the picture alone);
- ``encoder_text_only``: the same with a grey frame (the words alone);
- ``mllm_predicted``: the MLLM's predicted shot of the turn;
- ``history_shot`` / ``history_resampled``: at a turn whose friend the instruction does not name and that an
  earlier turn in the window showed, the shot the MLLM reads there (its own earlier prediction) and that shot
  through the input resampler (what enters the LLM).

Each feature is flattened, standardised and read by a linear ridge classifier (``--l2`` per feature) in grouped
``--folds``-fold cross-validation over games (a game's turns are never in both the fit and the test); held-out
accuracy is given with a 95 % bootstrap interval over games, and the majority class's accuracy beside it.

The window: at each unnamed friend turn, how many turns back the friend was last in view, and whether that is inside
the K-turn window. The attention: with eager attention, the mass the current shot's query slots give to each
history turn's slots (mean over layers, heads, queries, per slot), on the window turn where the friend was against
the other window turns; paired difference with its interval over games. Writes ``--out`` (JSON).
"""

from __future__ import annotations

import dataclasses
import re
from collections import defaultdict

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.eval.research import write_report


def add_flags(parser) -> None:
    parser.add_argument("--out", default="outputs/identity_probes.json", help="JSON report")
    parser.add_argument("--folds", type=int, default=5, help="cross-validation folds over games")
    parser.add_argument("--l2", type=float, default=1e-2, help="ridge weight of the probes, per standardised feature")


def without_friend(caption: str, friend: str) -> str:
    """``caption`` with the companion sentence dropped and every whole-word ``friend`` said as ``friend``."""
    caption = re.sub(rf"\s*Companion: {re.escape(friend)}\.", "", caption)
    return re.sub(rf"\b{re.escape(friend)}\b", "friend", caption)


def fit_probe(x: np.ndarray, y: np.ndarray, classes: int, l2: float) -> tuple:
    """A ridge classifier on standardised ``x`` (S, F): one-hot targets, solved in its dual form (S << F).
    Returns (mean, std, weight (F, C), bias (C,))."""
    mean, std = x.mean(0), x.std(0) + 1e-6
    inputs = torch.from_numpy((x - mean) / std).double()  # (S, F)
    targets = torch.nn.functional.one_hot(torch.from_numpy(y).long(), classes).double()  # (S, C)
    bias = targets.mean(0)
    gram = inputs @ inputs.T  # (S, S)
    dual = torch.linalg.solve(gram + l2 * inputs.shape[1] * torch.eye(len(gram), dtype=gram.dtype), targets - bias)
    return mean, std, (inputs.T @ dual).float(), bias.float()  # weight (F, C)


def probe_accuracy(x: np.ndarray, y: np.ndarray, games: list[str], classes: int, folds: int, l2: float) -> dict:
    """Grouped cross-validated accuracy of a linear probe, the majority class's, and per-game hits for intervals."""
    from animegamer.eval.intervals import bootstrap_interval

    ids = sorted(set(games))
    fold_of = {g: i % folds for i, g in enumerate(ids)}
    hits, majority = np.zeros(len(y)), np.zeros(len(y))
    for fold in range(folds):
        test = np.array([fold_of[g] == fold for g in games])
        if not test.any() or test.all():
            continue
        mean, std, weight, bias = fit_probe(x[~test], y[~test], classes, l2)
        logits = torch.from_numpy((x[test] - mean) / std).float() @ weight + bias
        hits[test] = (logits.argmax(-1).numpy() == y[test]).astype(float)
        majority[test] = (y[test] == np.bincount(y[~test], minlength=classes).argmax()).astype(float)
    by_game = defaultdict(list)
    for game, hit in zip(games, hits, strict=True):
        by_game[game].append(hit)
    mean, lo, hi = bootstrap_interval(list(by_game.values()))
    return {"accuracy": round(mean, 4), "interval": [round(lo, 4), round(hi, 4)], "majority": round(
        float(majority.mean()), 4), "turns": len(y), "games": len(by_game), "features": int(x.shape[1])}


def history_attention(model, window: list, instruction: str) -> np.ndarray:
    """Mean attention mass per slot (M,) that the current turn's query slots give to each window turn's slots."""
    from animegamer.tokens import TurnSpec

    seq = model.layout.build_sequence([*(TurnSpec(h.instruction, h.values) for h in window),
                                       TurnSpec(instruction, None, is_current=True)])
    input_ids = torch.tensor([seq.input_ids], device=model.device)  # (1, T)
    positions = torch.tensor(seq.slot_positions[:-1], device=model.device)  # (M, N)
    embeds = model.embed(input_ids, positions, torch.stack([h.shot_embeds for h in window]))
    maps = []
    hooks = [layer.self_attn.register_forward_hook(lambda _m, _i, out: maps.append(out[1]))
             for layer in model.backbone.layers]
    try:
        model.transformer(embeds)
    finally:
        for hook in hooks:
            hook.remove()
    if not maps or maps[0] is None:
        raise ValueError("no attention weights: the MLLM must run with attn_implementation=eager")
    queries = torch.tensor(seq.slot_positions[-1])  # (N,)
    attention = torch.stack(maps)[:, 0].mean(1)  # (layers, T, T), mean over heads
    rows = attention[:, queries].mean((0, 1))  # (T,), mean over layers and queries
    return np.array([float(rows[torch.tensor(p)].mean()) for p in seq.slot_positions[:-1]])  # (M,)


def main(argv: list[str] | None = None) -> dict:
    from animegamer.eval.games import GroundTruthGame, load_games
    from animegamer.eval.intervals import bootstrap_interval
    from animegamer.eval.systems import grey_frame, load_shot_models
    from animegamer.game.turn import Turn
    from animegamer.spriteworld import CHARACTERS

    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=add_flags)
    if args.folds < 2 or args.l2 < 0:
        fail(f"--folds must be 2 or more and --l2 0 or more, got {args.folds}, {args.l2}")
    try:
        games = load_games(cfg.benchmark, cfg.max_games)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if not all(isinstance(g, GroundTruthGame) and g.has_clips() and g.cast(0) is not None for g in games):
        fail(f"{cfg.benchmark}: the probes need SpriteWorld games (real clips drawn from shot specs)")
    mllm = dataclasses.replace(cfg.inference.mllm, attn_implementation="eager")
    cfg = dataclasses.replace(cfg, inference=dataclasses.replace(cfg.inference, mllm=mllm))
    try:
        encoding, game_model = load_shot_models(cfg)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    model, window_size = game_model.predictor.model, game_model.history_turns
    names = list(CHARACTERS)
    features: dict[str, list] = defaultdict(list)  # name -> [(game, label, named, vector)]
    window_rows, attention_rows = [], []
    for game in tqdm(games, desc="games", unit="game"):
        history: list[Turn] = []
        casts = [game.cast(t) for t in range(len(game))]
        for turn, instruction in enumerate(game.instructions):
            text = instruction.render()
            predicted = game_model.play_turn(history, text)
            cast = casts[turn]
            if cast.friend:
                label, first, caption = names.index(cast.friend), game.clip_frames(turn)[0], game.caption(turn)
                clip_tokens = encoding.clip_features(torch.from_numpy(first)[None].permute(0, 3, 1, 2))
                rows = {
                    "clip_real_frame": clip_tokens[0],
                    "t5_caption": encoding.t5([caption])[0],
                    "encoder_real": encoding.encode(first, caption),
                    "encoder_frame_only": encoding.encode(first, without_friend(caption, cast.friend)),
                    "encoder_text_only": encoding.encode(grey_frame(*first.shape[:2]), caption),
                    "mllm_predicted": predicted.shot_embeds,
                }
                seen = [j for j in range(turn) if casts[j].friend == cast.friend]
                if not cast.named:
                    back = turn - seen[-1] if seen else None
                    window_rows.append({"game": game.game_id, "turn": turn, "back": back,
                                        "in_window": back is not None and back <= window_size})
                    window = game_model.window(history)
                    start = turn - len(window)
                    inside = [j - start for j in seen if j >= start]
                    if inside:
                        shot = window[inside[-1]].shot_embeds
                        rows["history_shot"] = shot
                        rows["history_resampled"] = model.input_resampler(shot[None].to(model.device))[0]
                        mass = history_attention(model, window, text)
                        others = [m for i, m in enumerate(mass) if i not in inside]
                        if others:
                            attention_rows.append({"game": game.game_id, "turn": turn,
                                                   "friend_slots": float(mass[inside].mean()),
                                                   "other_slots": float(np.mean(others))})
                for name, value in rows.items():
                    features[name].append((game.game_id, label, cast.named,
                                           value.detach().float().reshape(-1).cpu().numpy()))
            history.append(predicted)  # play_turn windows it
    probes = {}
    for name, rows in features.items():
        x = np.stack([r[3] for r in rows])
        y = np.array([r[1] for r in rows])
        probes[name] = probe_accuracy(x, y, [r[0] for r in rows], len(names), args.folds, args.l2)
    in_window = [r for r in window_rows if r["in_window"]]
    report = {
        "games": len(games), "history_turns": window_size, "folds": args.folds, "l2": args.l2,
        "mllm_checkpoint": cfg.inference.mllm_checkpoint, "stage_a_checkpoint": cfg.stage_a_checkpoint,
        "window": {"unnamed_friend_turns": len(window_rows), "friend_in_window": len(in_window),
                   "turns_back": {str(k): sum(r["back"] == k for r in window_rows)
                                  for k in sorted({r["back"] for r in window_rows if r["back"] is not None})}},
        "probes": probes,
    }
    if attention_rows:
        per_game = defaultdict(list)
        for r in attention_rows:
            per_game[r["game"]].append(r["friend_slots"] - r["other_slots"])
        diff, lo, hi = bootstrap_interval(list(per_game.values()))
        report["attention"] = {
            "turns": len(attention_rows),
            "friend_slots": round(float(np.mean([r["friend_slots"] for r in attention_rows])), 6),
            "other_slots": round(float(np.mean([r["other_slots"] for r in attention_rows])), 6),
            "difference": round(diff, 6), "interval": [round(lo, 6), round(hi, 6)],
            "unit": "mean attention weight per history slot, from the current turn's query slots",
        }
    report["window_rows"], report["attention_rows"] = window_rows, attention_rows
    return write_report(args.out, report, hide=("window_rows", "attention_rows"))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
