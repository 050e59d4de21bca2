"""Ablation tables: train each row's variant (any stage, any scale), evaluate it, print the table in paper layout.

    python scripts/run_ablations.py --config configs/ablations/representation.yaml    # encoder/decoder variants
    python scripts/run_ablations.py --config configs/ablations/pipeline.yaml          # adaptation, cosine loss
    python scripts/run_ablations.py --config configs/ablations/pipeline.yaml --skip-train   # existing checkpoints
    python scripts/run_ablations.py --config configs/ablations/representation.yaml --table-only
    python scripts/run_ablations.py --config configs/tiny/ablations.yaml              # tiny, on a CPU

A ``kind: ablations`` config lists rows; each row names the training runs that make its variant (a stage script
and its run config, e.g. ``configs/ablations/stage_a_fusion_add.yaml``) and the evaluation overrides that point the
evaluation at them; a row that retrains only the game says so with ``retrain_game`` (its stage (b) overrides: a
stage (b) from ``stage_b_config`` with them and a stage (c) on it, evaluated together; :func:`row_plan`). Training
runs go through the stage recipes (animegamer/recipes/) in this process, or, with
``launcher`` set (e.g. ``launcher="accelerate launch --config_file configs/accelerate/multi_gpu.yaml"``), as
subprocesses under that launcher, so the same table runs on a laptop or on GPU nodes. Config strings may refer to
``${output_dir}`` of the ablations config.

Writes ``output_dir/<row>/`` (each row's evaluation: results.jsonl, table, per-turn plot) and
``output_dir/table.md`` / ``table.csv`` (one line per row and system) and ``output_dir/table_intervals.{md,csv,json}``
(every cell with its 95 % bootstrap interval over games, split into history-dependent turns, fully specified turns
and held-out pairs, and the paired differences of the first line against every other; see
:mod:`animegamer.eval.intervals`). ``--table-only`` rebuilds the tables from the rows' existing results;
``--rows a,b`` runs those rows only, and the tables keep every other row whose results ``output_dir`` already has.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path

from animegamer.cli import REPO_ROOT, parse_config
from animegamer.config import AblationRow, AblationsConfig, AblationStep, ConfigError, EvalConfig, load_config
from animegamer.eval.games import load_games
from animegamer.eval.harness import RESULTS_FILE, evaluate, read_results
from animegamer.eval.intervals import difference_rows, interval_rows, turn_splits, write_interval_table
from animegamer.eval.metrics import MetricSummary, summarize
from animegamer.eval.report import markdown_table, write_table
from animegamer.recipes import train_stage

SCRIPTS = REPO_ROOT / "scripts"  # the stage commands a launcher runs
STAGES = ("stage_a", "stage_b", "stage_c")


def run_step(step: AblationStep, common: list[str], launcher: str) -> None:
    """One training run: ``scripts/train_<stage>.py --config <config> <common> <overrides>``."""
    if step.script not in STAGES:
        raise ValueError(f"script={step.script!r} is not one of {list(STAGES)}")
    script = SCRIPTS / f"train_{step.script}.py"
    if not script.is_file():
        raise FileNotFoundError(f"{script} does not exist")
    argv = ["--config", step.config, *common, *step.overrides]
    print(f"train: {script.name} {shlex.join(argv)}", flush=True)
    if launcher:
        subprocess.run([*shlex.split(launcher), str(script), *argv], check=True)
        return
    train_stage(step.script, argv)


def row_plan(row: AblationRow, cfg: AblationsConfig) -> tuple[list[AblationStep], list[str]]:
    """A row's training runs and its own evaluation overrides, its ``retrain_game`` written out: a stage (b) from
    ``cfg.stage_b_config`` with those overrides into ``<output_dir>/<name>/stage_b``, a stage (c) on it into
    ``.../stage_c``, and the game evaluated with the two checkpoints (before the row's ``eval_overrides``)."""
    if not row.retrain_game:
        return list(row.train), list(row.eval_overrides)
    if row.train:
        raise ValueError(f"row {row.name}: retrain_game and train both name its training runs; keep one")
    runs = f"{cfg.output_dir}/{row.name}"
    stage_b = AblationStep("stage_b", cfg.stage_b_config, [*row.retrain_game, f"output_dir={runs}/stage_b"])
    stage_c = AblationStep("stage_c", cfg.stage_c_config, [f"stage_b_checkpoint={runs}/stage_b/checkpoints/latest",
                                                          f"output_dir={runs}/stage_c"])
    checkpoints = [f"inference.decoder_checkpoint={runs}/stage_c/checkpoints/latest",
                   f"inference.mllm_checkpoint={runs}/stage_b/checkpoints/latest"]
    return [stage_b, stage_c], [*row.eval_overrides, *checkpoints]


def row_entries(label: str, summaries: list[MetricSummary]) -> list[tuple[str, MetricSummary]]:
    """Table lines of one row: its label, with the system appended when the row evaluates several."""
    if len(summaries) == 1:
        return [(label, summaries[0])]
    return [(f"{label} ({s.system})", s) for s in summaries]


def main(argv: list[str] | None = None) -> list[tuple[str, MetricSummary]]:
    def flags(parser):
        parser.add_argument("--skip-train", action="store_true", help="evaluate existing checkpoints only")
        parser.add_argument("--table-only", action="store_true", help="rebuild the table from existing results")
        parser.add_argument("--rows", default="", help="comma-separated row names to run (default: all); the "
                            "table keeps the other rows' earlier results where output_dir has them")
        parser.add_argument("--quiet", action="store_true", help="no progress bars")

    cfg, args = parse_config(AblationsConfig, __doc__, argv, extra=flags)
    names = [row.name for row in cfg.rows]
    if not cfg.rows or not all(names) or len(set(names)) != len(names):
        raise SystemExit(f"error: rows need unique, non-empty names (got {names})")
    wanted = [n for n in args.rows.split(",") if n] or names
    unknown = sorted(set(wanted) - set(names))
    if unknown:
        raise SystemExit(f"error: --rows names unknown rows {unknown}; the config has {names}")
    try:
        plans = {row.name: row_plan(row, cfg) for row in cfg.rows}
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    out = Path(cfg.output_dir)
    entries: list[tuple[str, MetricSummary]] = []
    labelled: dict[str, list] = {}  # table line -> its per-turn records, for the intervals
    splits: dict[tuple[str, int], tuple[str, ...]] = {}
    for row in cfg.rows:
        label = row.label or row.name
        row_dir = out / row.name
        steps, own_overrides = plans[row.name]
        eval_overrides = [*cfg.eval_overrides, *own_overrides, f"output_dir={row_dir}"]
        results = row_dir / RESULTS_FILE
        kept = row.name not in wanted  # not run now: its earlier results, if any, stay in the table
        if kept and (args.table_only or not results.is_file()):
            continue
        if kept:
            print(f"row {row.name}: not run (--rows); the table keeps its results in {results}", file=sys.stderr)
        if args.table_only or kept:
            if not results.is_file():
                raise SystemExit(f"error: row {row.name}: no results at {results} (run without --table-only)")
            grouped = read_results(results)
            summaries = [summarize(records) for records in grouped.values()]
            entries += row_entries(label, summaries)
            try:
                eval_cfg = load_config(row.eval_config or cfg.eval_config, eval_overrides, schema=EvalConfig)
                splits |= turn_splits(load_games(eval_cfg.benchmark, eval_cfg.max_games))
            except (ConfigError, ValueError, FileNotFoundError) as exc:
                raise SystemExit(f"error: row {row.name}: {exc}") from None
            labelled |= dict(zip((name for name, _ in row_entries(label, summaries)), grouped.values(), strict=True))
            continue
        started = time.perf_counter()
        if not (cfg.skip_train or args.skip_train):
            for step in steps:
                run_step(step, cfg.train_overrides, cfg.launcher)
        try:
            eval_cfg = load_config(row.eval_config or cfg.eval_config, eval_overrides, schema=EvalConfig)
            result = evaluate(eval_cfg, progress=not args.quiet)
            splits |= turn_splits(load_games(eval_cfg.benchmark, eval_cfg.max_games))
        except (ConfigError, ValueError, FileNotFoundError) as exc:
            raise SystemExit(f"error: row {row.name}: {exc}") from None
        row_lines = row_entries(label, result.summaries)
        entries += row_lines
        labelled |= {name: result.records[s.system] for (name, _), s in zip(row_lines, result.summaries, strict=True)}
        print(f"row {row.name}: done in {time.perf_counter() - started:.1f} s", file=sys.stderr)
    title = f"Ablations ({Path(args.config).name if args.config else 'defaults'})"
    md, table_csv = write_table(out / "table", entries, title=title, first_column="ablation")
    rows = interval_rows(labelled, splits)
    if labelled:  # paired differences of the first line (the main system) against every other line
        rows += difference_rows(next(iter(labelled)), labelled, splits)
    intervals = write_interval_table(out / "table_intervals", rows, title=title)
    print(markdown_table(entries, title, first_column="ablation"))
    print(f"table      {md}\ncsv        {table_csv}\nintervals  {intervals['md']} (+ .csv, .json)")
    return entries

