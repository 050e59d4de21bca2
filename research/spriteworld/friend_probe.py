"""Does the MLLM's predicted shot carry who the friend is? Swap the friend's name and see how much the shot moves.

    python research/spriteworld/friend_probe.py --config configs/spriteworld/eval.yaml

Every held-out game of ``benchmark`` is played as a game plays it (closed loop: the MLLM's own earlier shots are its
history, ``inference.history_turns`` of them). At each turn whose instruction names the friend (``play ball with
Momo``), the instruction is also given with each other possible friend's name instead, from the same history, and
three numbers are taken, each relative to the norm of the unswapped shot:

- ``mllm_swap``: how far the MLLM's shot moves when the name changes;
- ``encoder_swap``: how far the stage (a) encoder's shot of the real clip moves (its first frame + its caption with
  the name changed): what stage (b) is trained to predict, so the move a perfect MLLM would make;
- ``mllm_error``: the MLLM's shot against that target (the real clip's, with the right name).

A ``mllm_swap`` well below ``encoder_swap``, under a larger ``mllm_error``, says the prediction hardly depends on the
name (and the decoder cannot draw a friend its shot does not carry; the evaluation's Friend-N / Friend-R columns
measure what is drawn). Writes ``--out`` (JSON) and prints the summary.
"""

from __future__ import annotations

import re

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.cli import fail, parse_config
from animegamer.config import EvalConfig
from animegamer.eval.research import games_with_clips, write_report


def named_friend(instruction: str, hero: str, names) -> str | None:
    """The character other than ``hero`` that ``instruction`` names as a whole word, if any."""
    return next((n for n in names if n != hero and re.search(rf"\b{re.escape(n)}\b", instruction)), None)


def swap_name(text: str, old: str, new: str) -> str:
    """``text`` with every whole-word ``old`` replaced by ``new``."""
    return re.sub(rf"\b{re.escape(old)}\b", new, text)


def add_flags(parser) -> None:
    parser.add_argument("--out", default="outputs/friend_probe.json", help="JSON report")


def main(argv: list[str] | None = None) -> dict:
    from animegamer.bench.turn import relative_difference  # ||a - b|| / ||b||
    from animegamer.eval.systems import load_shot_models
    from animegamer.game.turn import Turn
    from animegamer.spriteworld import CHARACTERS

    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=add_flags)
    games = games_with_clips(cfg.benchmark, cfg.max_games,
                             "the probe needs games with real clips (a SpriteWorld games directory)")
    try:
        encoding, animegamer = load_shot_models(cfg)
    except (FileNotFoundError, ValueError) as exc:  # missing or unreadable weights
        fail(str(exc))
    rows = []
    for game in tqdm(games, desc="games", unit="game"):
        history: list[Turn] = []
        for turn, instruction in enumerate(game.instructions):
            text = instruction.render()
            predicted = animegamer.play_turn(history, text)
            friend = named_friend(text, game.character, CHARACTERS)
            if friend is not None:
                first, caption = game.clip_frames(turn)[0], game.caption(turn)
                target, shot = encoding.encode(first, caption), predicted.shot_embeds
                for other in (n for n in CHARACTERS if n not in (friend, game.character)):
                    swapped = animegamer.play_turn(history, swap_name(text, friend, other))
                    rows.append({
                        "game": game.game_id, "turn": turn, "friend": friend, "swapped_for": other,
                        "mllm_swap": relative_difference(swapped.shot_embeds, shot),
                        "encoder_swap": relative_difference(
                            encoding.encode(first, swap_name(caption, friend, other)), target),
                        "mllm_error": relative_difference(shot, target),
                    })
            history.append(predicted)  # play_turn windows it
    if not rows:
        fail(f"{cfg.benchmark}: no turn of its {len(games)} games names a friend")
    means = {key: round(float(np.mean([r[key] for r in rows])), 4) for key in ("mllm_swap", "encoder_swap",
                                                                              "mllm_error")}
    report = {"games": len(games), "turns": len({(r["game"], r["turn"]) for r in rows}), "swaps": len(rows),
              "history_turns": cfg.inference.history_turns, "mllm_checkpoint": cfg.inference.mllm_checkpoint,
              "stage_a_checkpoint": cfg.stage_a_checkpoint, **means, "rows": rows}
    return write_report(args.out, report, hide=("rows",))


if __name__ == "__main__":
    torch.set_grad_enabled(False)
    main()
