"""The game's friend columns by the kind of pair each friend turn has: the held-out (protagonist, friend) pair, a
held-out (protagonist, action) pair with a seen friend, or a seen pair; one or more runs averaged turn by turn.

    python research/spriteworld/friend_pairs.py --games outputs/spriteworld/data/games \\
        --manifest outputs/spriteworld/data/clips.jsonl --results <eval>/results.jsonl [<eval2>/results.jsonl ...] \\
        --out benchmarks/spriteworld/friend_pairs.json

The evaluation's ``held_out`` split puts a turn there when its protagonist has an action *or* a friend no training
film pairs it with; the friend columns are about the second kind. This splits the friend turns (``friend_named``
and ``friend_remembered`` records of ``--system``) by what was held out: ``friend pair`` (the protagonist and the
friend in view are a held-out pair of the manifest's data config, ``held_out_pairs``: no training film, and no
stage (b) rename, shows them together), ``action pair`` (a held-out pair mark, the friend seen with that
protagonist), ``seen``. With several ``--results`` (runs of one recipe that differ in a seed) each turn's value is
the mean over the runs, on the turns every run scored. Each cell: mean, 95% bootstrap interval over games, turns,
games (animegamer.eval.intervals.mean_cell_rows). Writes ``--out`` (JSON) and prints the cells.
"""

from __future__ import annotations

import sys
from pathlib import Path

from animegamer.cli import command_name, fail

KINDS = ("friend pair", "action pair", "seen")
METRICS = ("friend_named", "friend_remembered")


def parse_args(argv: list[str] | None):
    import argparse

    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", required=True, help="the held-out games the runs were evaluated on")
    parser.add_argument("--manifest", required=True, help="the data's manifest (its data config's held_out_pairs)")
    parser.add_argument("--results", required=True, nargs="+", help="results.jsonl of each run (scripts/evaluate.py)")
    parser.add_argument("--system", default="animegamer", help="the system whose records are split")
    parser.add_argument("--out", required=True, help="the JSON report")
    return parser.parse_args(argv)


def turn_kinds(games, held_out: frozenset[frozenset[str]]) -> dict[tuple[str, int], str]:
    """``(game_id, turn) -> kind`` (:data:`KINDS`) of every turn of ``games`` with a friend in view."""
    kinds = {}
    for game in games:
        for turn in range(len(game.shots)):
            cast = game.cast(turn)
            if cast is None or not cast.friend:
                continue
            if frozenset((cast.hero, cast.friend)) in held_out:
                kinds[(game.game_id, turn)] = "friend pair"
            elif game.marks and game.marks[turn].get("held_out_pair"):
                kinds[(game.game_id, turn)] = "action pair"
            else:
                kinds[(game.game_id, turn)] = "seen"
    return kinds


def kind_cells(runs: list[list], kinds: dict[tuple[str, int], str]) -> list[dict]:
    """Per (kind, metric): each turn's value averaged over ``runs`` (lists of MetricRecord) on the turns every run
    scored, bootstrapped over games (:func:`animegamer.eval.intervals.mean_cell_rows` with the kinds as splits)."""
    from animegamer.eval.intervals import mean_cell_rows

    splits = {key: (kind,) for key, kind in kinds.items()}
    rows = mean_cell_rows("", runs, splits, METRICS, split_names=KINDS)
    return [{"kind": row.pop("split"), **{k: v for k, v in row.items() if k != "system"}} for row in rows]


def main(argv: list[str] | None = None) -> dict:
    from animegamer.data.manifest import ManifestError, read_manifest
    from animegamer.data.stage_b import held_out_friends
    from animegamer.eval.games import load_games
    from animegamer.eval.harness import read_results
    from animegamer.eval.research import write_report
    from animegamer.spriteworld.world import CHARACTERS

    args = parse_args(argv)
    try:
        held_out = held_out_friends(read_manifest(args.manifest))
        games = load_games(args.games)
    except (FileNotFoundError, ManifestError, ValueError) as exc:  # their texts name the file
        fail(str(exc))
    friend_pairs = sorted("+".join(sorted(pair)) for pair in held_out if pair <= set(CHARACTERS))
    runs = []
    for path in args.results:
        if not Path(path).is_file():
            fail(f"not found: {path} (a results.jsonl of scripts/evaluate.py)")
        try:
            grouped = read_results(path)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            fail(str(exc) if path in str(exc) else f"{path}: {exc}")
        if args.system not in grouped:
            fail(f"{path}: no records of system {args.system!r} (has {sorted(grouped)})")
        runs.append(grouped[args.system])
    cells = kind_cells(runs, turn_kinds(games, held_out))
    if not cells:
        fail(f"{args.games}: the results share no friend turn with these games")
    report = {"games": args.games, "results": list(args.results), "system": args.system,
              "held_out_pairs": friend_pairs, "cells": cells}
    write_report(args.out, report, hide=("cells",))
    for cell in cells:
        bounds = "" if cell["lower"] is None else f" [{cell['lower']:.2f}, {cell['upper']:.2f}]"
        print(f"{cell['metric']:17s} {cell['kind']:11s} {cell['mean']:.2f}{bounds} ({cell['turns']} turns, "
              f"{cell['games']} games)")
    print(f"wrote {args.out}", file=sys.stderr)
    return report


if __name__ == "__main__":
    main()
