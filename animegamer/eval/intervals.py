"""95 % bootstrap intervals over games, and the evaluation table split by what each turn depends on.

A table mean over 156 turns of 13 games hides how much it would move with other games: turns of one game share
its character, places and the model's history, so they are not independent draws. The interval here resamples
*games* with replacement (the turns of a drawn game come with it) and takes the percentile interval of the
turn-weighted mean, so "within noise" is a number.

Splits (from the games' per-turn marks, ``GroundTruthGame.marks``; SpriteWorld's memory world writes them):

    all        every turn
    history    turns whose picture depends on something only earlier turns show (the instruction leaves it out)
    far        history-dependent turns whose unsaid part was last shown 2 or more turns back (only K >= 2 sees it)
    full       turns whose instruction names everything the picture shows
    held_out   turns with a (character, action) or (character, friend) pair no training film has
    seen       the other marked turns (the yardstick of held_out)

Games without marks contribute to ``all`` only.

    records, splits = {"AnimeGamer": animegamer_records, "GC": gc_records}, turn_splits(games)
    rows = interval_rows(records, splits) + difference_rows("AnimeGamer", records, splits)  # paired: AG − GC
    write_interval_table("out/table_intervals", rows)        # .md (one table per split), .csv, .json
"""

from __future__ import annotations

import csv
import io
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from animegamer.eval.metrics import MetricRecord
from animegamer.eval.report import column_label
from animegamer.io import atomic_write_json, atomic_write_text

SPLITS = ("all", "history", "far", "full", "held_out", "seen")
SPLIT_TITLES = {
    "all": "all turns",
    "history": "history-dependent turns (the instruction leaves out what earlier turns fixed)",
    "far": "history beyond the turn before (what the instruction leaves unsaid was last shown 2+ turns back)",
    "full": "fully specified turns (the instruction names everything drawn)",
    "held_out": "held-out pairs (a character with an action or friend no training film pairs it with)",
    "seen": "seen pairs (the other turns of the same games)",
}
INTERVAL_METRICS = ("clip_i", "psnr", "ssim", "acc_f", "mae_f", "acc_s", "mae_s", "friend_named", "friend_remembered",
                    "hero_on_screen")
RESAMPLES, LEVEL, SEED = 2000, 0.95, 0


def bootstrap_interval(per_game: Sequence[Sequence[float]], *, resamples: int = RESAMPLES, level: float = LEVEL,
                       seed: int = SEED) -> tuple[float, float | None, float | None]:
    """(mean over all turns, lower, upper): the percentile interval of the turn-weighted mean, games resampled.

    ``per_game`` holds each game's turn values; empty games are dropped. With one game there is nothing to
    resample and the bounds are None. An infinite value (PSNR of identical clips) makes every bound infinite.
    Deterministic in ``seed``.
    """
    if not 0.0 < level < 1.0 or resamples < 1:
        raise ValueError(f"level must be in (0, 1) and resamples >= 1, got {level}, {resamples}")
    games = [np.asarray(g, np.float64) for g in per_game if len(g)]
    if not games:
        raise ValueError("no values to bootstrap")
    sums = np.array([g.sum() for g in games])  # (G,)
    counts = np.array([len(g) for g in games], np.float64)  # (G,)
    mean = float(sums.sum() / counts.sum())
    if not math.isfinite(mean):
        return mean, mean, mean
    if len(games) < 2:
        return mean, None, None
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, len(games), size=(resamples, len(games)))  # (R, G) game indices
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)  # (R,)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return mean, float(lo), float(hi)


def turn_splits(games: Iterable) -> dict[tuple[str, int], tuple[str, ...]]:
    """``(game_id, turn) -> split names`` of every turn of ``games`` (objects with ``game_id``, ``shots`` and
    optionally ``marks``, per turn ``{"depends": "full" | "history" | "new", "held_out_pair": bool,
    "reach": int}``)."""
    splits = {}
    for game in games:
        marks = getattr(game, "marks", ()) or ()
        for turn in range(len(game.shots)):
            splits[(game.game_id, turn)] = ("all", *(mark_splits(marks[turn]) if marks else ()))
    return splits


def mark_splits(mark: Mapping) -> tuple[str, ...]:
    """The splits a turn's memory marks put it in (besides ``all``): ``history`` / ``full``, ``far`` (a history
    turn whose answer is ``reach`` >= 2 turns back), ``held_out`` / ``seen``."""
    names = [mark["depends"]] if mark.get("depends") in ("history", "full") else []
    if mark.get("depends") == "history" and mark.get("reach", 0) >= 2:
        names.append("far")
    names.append("held_out" if mark.get("held_out_pair") else "seen")
    return tuple(names)


def interval_rows(records: Mapping[str, Sequence[MetricRecord]], splits: Mapping[tuple[str, int], Sequence[str]],
                  metrics: Sequence[str] = INTERVAL_METRICS, *, resamples: int = RESAMPLES, level: float = LEVEL,
                  seed: int = SEED) -> list[dict]:
    """One row per (system label, split, metric) with a value: mean, lower, upper, turns, games.

    ``records`` maps a row label to one system's per-turn records; game-level records (``turn < 0``) and turns
    not in ``splits`` are skipped. Every cell is bootstrapped with the same ``seed``.
    """
    rows = []
    for label, system_records in records.items():
        for split in SPLITS:
            for metric in metrics:
                by_game: dict[str, list[float]] = defaultdict(list)
                for r in system_records:
                    value = r.values.get(metric)
                    if r.turn >= 0 and value is not None and split in splits.get((r.game_id, r.turn), ()):
                        by_game[r.game_id].append(float(value))
                if not by_game:
                    continue
                mean, lo, hi = bootstrap_interval(list(by_game.values()), resamples=resamples, level=level,
                                                  seed=seed)
                rows.append({"system": label, "split": split, "metric": metric, "mean": mean, "lower": lo,
                             "upper": hi, "turns": sum(map(len, by_game.values())), "games": len(by_game)})
    return rows


def difference_rows(reference: str, records: Mapping[str, Sequence[MetricRecord]],
                    splits: Mapping[tuple[str, int], Sequence[str]], metrics: Sequence[str] = INTERVAL_METRICS, *,
                    resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED) -> list[dict]:
    """Paired differences ``reference - other`` on the turns both scored, per split and metric, with the bootstrap
    interval over games: two systems on the same turns differ far less noisily than their two means suggest.

    Rows look like :func:`interval_rows`' with ``system = "<reference> − <other>"``."""
    rows = []
    for other in records:
        if other != reference:
            rows += mean_difference_rows(f"{reference} − {other}", [(records[reference], records[other])], splits,
                                         metrics, resamples=resamples, level=level, seed=seed)
    return rows


def _turn_values(records: Sequence[MetricRecord], metric: str) -> dict[tuple[str, int], float]:
    """``(game_id, turn) -> value`` of ``metric`` on the turns ``records`` scored it (game-level records skipped)."""
    return {(r.game_id, r.turn): float(r.values[metric]) for r in records
            if r.turn >= 0 and r.values.get(metric) is not None}


def _split_rows(label: str, per_turn: Mapping[str, Mapping[tuple[str, int], float]],
                splits: Mapping[tuple[str, int], Sequence[str]], metrics: Sequence[str], *, resamples: int,
                level: float, seed: int, split_names: Sequence[str] = SPLITS) -> list[dict]:
    """:func:`interval_rows`' rows of one label from its per-turn values (``metric -> {(game, turn): value}``)."""
    rows = []
    for split in split_names:
        for metric in metrics:
            by_game: dict[str, list[float]] = defaultdict(list)
            for key, value in per_turn[metric].items():
                if split in splits.get(key, ()):
                    by_game[key[0]].append(value)
            if not by_game:
                continue
            mean, lo, hi = bootstrap_interval(list(by_game.values()), resamples=resamples, level=level, seed=seed)
            rows.append({"system": label, "split": split, "metric": metric, "mean": mean, "lower": lo,
                         "upper": hi, "turns": sum(map(len, by_game.values())), "games": len(by_game)})
    return rows


def mean_difference_rows(label: str, pairs: Sequence[tuple[Sequence[MetricRecord], Sequence[MetricRecord]]],
                         splits: Mapping[tuple[str, int], Sequence[str]], metrics: Sequence[str] = INTERVAL_METRICS,
                         *, resamples: int = RESAMPLES, level: float = LEVEL, seed: int = SEED,
                         split_names: Sequence[str] = SPLITS) -> list[dict]:
    """The paired difference ``a - b`` of each ``(a, b)`` pair (e.g. K = 3 and K = 1 of one training run), averaged
    over the pairs turn by turn, on the turns every pair scored; bootstrap interval over games (the runs are
    fixed: the interval is the games' noise, not the runs'). One pair is :func:`difference_rows`' cell.
    ``split_names``: as in :func:`mean_cell_rows`."""
    if not pairs:
        raise ValueError("no pairs of records to difference")
    mean_diffs = {}  # metric -> {(game, turn): a - b averaged over the pairs}, on turns every pair scored finitely
    for metric in metrics:
        per_pair = [(_turn_values(a, metric), _turn_values(b, metric)) for a, b in pairs]
        mean_diffs[metric] = {}
        for key in sorted(set.intersection(*(set(a) & set(b) for a, b in per_pair))):
            diffs = [a[key] - b[key] for a, b in per_pair]
            if all(map(math.isfinite, diffs)):
                mean_diffs[metric][key] = sum(diffs) / len(diffs)
    return _split_rows(label, mean_diffs, splits, metrics, resamples=resamples, level=level, seed=seed,
                       split_names=split_names)


def mean_cell_rows(label: str, runs: Sequence[Sequence[MetricRecord]], splits: Mapping[tuple[str, int], Sequence[str]],
                   metrics: Sequence[str] = INTERVAL_METRICS, *, resamples: int = RESAMPLES, level: float = LEVEL,
                   seed: int = SEED, split_names: Sequence[str] = SPLITS) -> list[dict]:
    """Each turn's value averaged over ``runs`` (one system's records from runs of one recipe that differ only in a
    seed), on the turns every run scored; bootstrap interval over games (the runs are fixed, as in
    :func:`mean_difference_rows`). One run is :func:`interval_rows`' cell: a recipe's cell without one seed's luck.
    ``split_names``: the splits of ``splits`` to report, in order (another grouping of turns than :data:`SPLITS`)."""
    if not runs:
        raise ValueError("no runs of records to average")
    means = {}
    for metric in metrics:
        per_run = [_turn_values(records, metric) for records in runs]
        means[metric] = {key: sum(run[key] for run in per_run) / len(per_run)
                         for key in sorted(set.intersection(*map(set, per_run)))}
    return _split_rows(label, means, splits, metrics, resamples=resamples, level=level, seed=seed,
                       split_names=split_names)


def _cell(metric: str, row: dict | None) -> str:
    if row is None:
        return "–"
    digits = 2 if metric == "psnr" else 3
    mean = row["mean"]
    if not math.isfinite(mean):
        return "inf"
    if row["lower"] is None:
        return f"{mean:.{digits}f}"
    return f"{mean:.{digits}f} [{row['lower']:.{digits}f}, {row['upper']:.{digits}f}]"


def interval_markdown(rows: Sequence[dict], title: str = "", *, resamples: int = RESAMPLES,
                      level: float = LEVEL) -> str:
    """One markdown table per split that has rows: systems x metrics, each cell ``mean [lower, upper]``."""

    lines = [f"# {title}", ""] if title else []
    lines.append(f"Cells: mean over turns [{level:.0%} bootstrap interval over games, {resamples} resamples].")
    for split in SPLITS:
        in_split = [r for r in rows if r["split"] == split]
        if not in_split:
            continue
        metrics = [m for m in INTERVAL_METRICS if any(r["metric"] == m for r in in_split)]
        metrics += sorted({r["metric"] for r in in_split} - set(metrics))
        systems = list(dict.fromkeys(r["system"] for r in in_split))
        cells = {(r["system"], r["metric"]): r for r in in_split}
        lines += ["", f"## {SPLIT_TITLES[split]}", ""]
        lines.append("| system | turns (games) | " + " | ".join(column_label(m) for m in metrics) + " |")
        lines.append("|---|---:|" + "---:|" * len(metrics))
        for system in systems:
            sized = max((cells[(system, m)] for m in metrics if (system, m) in cells), key=lambda r: r["turns"])
            lines.append(f"| {system} | {sized['turns']} ({sized['games']}) | "
                         + " | ".join(_cell(m, cells.get((system, m))) for m in metrics) + " |")
    return "\n".join(lines) + "\n"


def write_interval_table(stem: str | Path, rows: Sequence[dict], title: str = "", *, resamples: int = RESAMPLES,
                         level: float = LEVEL, seed: int = SEED) -> dict[str, Path]:
    """``<stem>.md`` (tables per split), ``<stem>.csv`` (one line per cell) and ``<stem>.json``, atomically."""
    stem = Path(stem)
    buffer = io.StringIO()
    fields = ["system", "split", "metric", "mean", "lower", "upper", "turns", "games"]
    writer = csv.DictWriter(buffer, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: ("" if row[k] is None else row[k]) for k in fields})
    paths = {"md": stem.with_suffix(".md"), "csv": stem.with_suffix(".csv"), "json": stem.with_suffix(".json")}
    atomic_write_text(paths["md"], interval_markdown(rows, title, resamples=resamples, level=level))
    atomic_write_text(paths["csv"], buffer.getvalue())
    atomic_write_json(paths["json"], {"resamples": resamples, "level": level, "seed": seed,
                                      "resampled": "games (with all their turns)", "rows": list(rows)})
    return paths
