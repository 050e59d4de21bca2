"""One ablation difference (K = 3 − K = 1 by default), or one row's cells, over several training runs: each run's,
and their mean.

    python research/spriteworld/pool_runs.py --games outputs/spriteworld/data/games \\
        --runs run_a/outputs/spriteworld/eval run_b/outputs/spriteworld/eval --out outputs/spriteworld/pooled
    python research/spriteworld/pool_runs.py --games outputs/spriteworld/data/games --cells no_adaptation \\
        --metrics friend_named friend_remembered hero_on_screen psnr --runs seed_42 seed_1 seed_2 --out seeds

A single run's K = 3 − K = 1 mixes what the recipe does with what that run's seed happened to learn; runs that
differ only in a seed (e.g. stage (b)'s ``seed``, with everything before it copied) tell the two apart. Each
``--runs`` entry is an evaluation folder as ``scripts/run_ablations.py`` writes it (``<row>/results.jsonl``); the
runs must be evaluated on the same games (``--games``, whose per-turn marks give the splits). For every split and
metric the table has each run's paired difference ``rows[0] − rows[1]`` of ``--system`` and the difference averaged
over the runs turn by turn, each with a 95% bootstrap interval over games (the runs are fixed: the interval is the
games' noise; the runs' spread is in their own cells). With ``--cells ROW`` the table has that row's cells instead:
each run's, and each turn's value averaged over the runs (``animegamer.eval.intervals.mean_cell_rows``), a recipe's
number without one seed's luck. Writes ``--out`` .md / .csv / .json.
"""

from __future__ import annotations

import sys
from pathlib import Path

from animegamer.cli import command_name, fail


def parse_args(argv: list[str] | None):
    import argparse

    parser = argparse.ArgumentParser(prog=command_name(), description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--games", required=True, help="the games the runs were evaluated on (marks split turns)")
    parser.add_argument("--runs", required=True, nargs="+", help="evaluation folders, one per run")
    parser.add_argument("--rows", nargs=2, default=["main", "k1"], metavar=("A", "B"),
                        help="the two ablation rows to difference, A − B (default: main k1)")
    parser.add_argument("--cells", default="", metavar="ROW",
                        help="pool this row's cells over the runs instead of a difference of two rows")
    parser.add_argument("--system", default="animegamer", help="the system whose records are compared")
    parser.add_argument("--metrics", nargs="+", default=["psnr", "clip_i"], help="metrics to difference")
    parser.add_argument("--out", default="outputs/spriteworld/pooled", help="output stem (.md, .csv, .json)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> list[dict]:
    from animegamer.eval.games import load_games
    from animegamer.eval.harness import read_results
    from animegamer.eval.intervals import mean_cell_rows, mean_difference_rows, turn_splits, write_interval_table

    args = parse_args(argv)
    try:
        splits = turn_splits(load_games(args.games))
    except (FileNotFoundError, ValueError) as exc:  # BenchmarkError is a ValueError; its text names the path
        fail(str(exc))
    wanted = (args.cells,) if args.cells else tuple(args.rows)
    pairs = []
    for run in args.runs:
        records = []
        for row in wanted:
            path = Path(run) / row / "results.jsonl"
            if not path.is_file():
                fail(f"not found: {path} (evaluate the run's rows first: scripts/run_ablations.py)")
            try:
                grouped = read_results(path)
            except (OSError, UnicodeDecodeError, ValueError) as exc:  # the ValueError's text names the path
                fail(str(exc))
            if args.system not in grouped:
                fail(f"{path}: no records of system {args.system!r} (has {sorted(grouped)})")
            records.append(grouped[args.system])
        pairs.append(tuple(records))
    what = args.cells or " − ".join(wanted)

    def pooled(label: str, runs: list[tuple]) -> list[dict]:  # runs: per run, its records of each wanted row
        if args.cells:
            return mean_cell_rows(label, [records for records, in runs], splits, args.metrics)
        return mean_difference_rows(label, runs, splits, args.metrics)

    rows = []
    for name, pair in zip(args.runs, pairs, strict=True):
        rows += pooled(f"{name}: {what}", [pair])
    if not rows:
        fail(f"{args.games}: the runs' records share no turn with these games")
    if len(pairs) > 1:
        rows += pooled(f"mean of {len(pairs)} runs: {what}", pairs)
    paths = write_interval_table(args.out, rows, title=f"{args.system}: {what} over {len(pairs)} run(s)")
    for row in rows:
        if row["metric"] == args.metrics[0]:
            sign = "" if args.cells else "+"
            bounds = "" if row["lower"] is None else f" [{row['lower']:{sign}.2f}, {row['upper']:{sign}.2f}]"
            print(f"{row['split']:9s} {row['system']}: {row['mean']:{sign}.2f}{bounds} ({row['turns']} turns)")
    print(f"wrote {', '.join(str(p) for p in paths.values())}", file=sys.stderr)
    return rows


if __name__ == "__main__":
    main()
