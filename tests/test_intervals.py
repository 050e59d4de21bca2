"""Bootstrap intervals over games and the split table (animegamer.eval.intervals)."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from animegamer.eval.intervals import (
    bootstrap_interval,
    difference_rows,
    interval_markdown,
    interval_rows,
    mean_cell_rows,
    mean_difference_rows,
    turn_splits,
    write_interval_table,
)
from animegamer.eval.metrics import MetricRecord


def test_bootstrap_is_seeded_and_brackets_the_mean():
    games = [[20.0, 21.0, 19.5], [18.0, 18.5], [22.0, 23.0, 22.5, 21.0], [19.0]]
    mean, lo, hi = bootstrap_interval(games, seed=3)
    assert mean == pytest.approx(sum(map(sum, games)) / 10)
    assert lo < mean < hi
    assert bootstrap_interval(games, seed=3) == (mean, lo, hi)
    assert bootstrap_interval(games, resamples=10, seed=4) != bootstrap_interval(games, resamples=10, seed=3)


def test_bootstrap_resamples_games_not_turns():
    # Two games of opposite values: a resample holds 0, 1 or 2 copies of each, so the mean is 0, 0.5 or 1 and the
    # 95 % interval reaches both ends (resampling the 20 turns would give a narrow interval around 0.5).
    mean, lo, hi = bootstrap_interval([[0.0] * 10, [1.0] * 10], resamples=4000)
    assert (mean, lo, hi) == (0.5, 0.0, 1.0)
    # Games that agree leave no spread at all.
    assert bootstrap_interval([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0]]) == (2.0, 2.0, 2.0)


def test_bootstrap_edge_cases():
    assert bootstrap_interval([[4.0, 6.0]]) == (5.0, None, None)
    assert bootstrap_interval([[1.0], [], [3.0]])[0] == 2.0  # empty games are dropped
    mean, lo, hi = bootstrap_interval([[math.inf], [20.0]])
    assert math.isinf(mean) and math.isinf(lo) and math.isinf(hi)
    with pytest.raises(ValueError, match="no values"):
        bootstrap_interval([[], []])
    with pytest.raises(ValueError, match="level"):
        bootstrap_interval([[1.0]], level=1.5)


def _records(system: str, values: dict[tuple[str, int], float]) -> list[MetricRecord]:
    return [MetricRecord(system, game, turn, {"psnr": v, "acc_f": float(v > 20)}) for (game, turn), v in
            values.items()]


def test_split_table_counts_each_split_and_writes_files(tmp_path):
    marks = ({"depends": "full"}, {"depends": "history", "held_out_pair": True, "reach": 3}, {"depends": "new"})
    games = [SimpleNamespace(game_id=g, shots=(None,) * 3, marks=marks) for g in ("g0", "g1")]
    games.append(SimpleNamespace(game_id="old", shots=(None,) * 2))  # no marks: counted in "all" only
    splits = turn_splits(games)
    assert splits[("g0", 1)] == ("all", "history", "far", "held_out") and splits[("old", 0)] == ("all",)
    assert splits[("g0", 0)] == ("all", "full", "seen")
    values = {("g0", 0): 21.0, ("g0", 1): 18.0, ("g0", 2): 19.0, ("g1", 0): 23.0, ("g1", 1): 16.0, ("g1", 2): 20.0,
              ("old", 0): 25.0, ("old", 1): 25.0}
    records = _records("sys", values)
    records.append(MetricRecord("sys", "g0", -1, {"psnr": 99.0}))  # game-level: never a turn
    rows = interval_rows({"AnimeGamer": records}, splits, ("psnr", "acc_f"))
    cell = {(r["split"], r["metric"]): r for r in rows}
    assert cell[("all", "psnr")]["turns"] == 8 and cell[("all", "psnr")]["games"] == 3
    assert cell[("history", "psnr")]["mean"] == pytest.approx(17.0)
    assert cell[("full", "psnr")]["mean"] == pytest.approx(22.0) and cell[("full", "psnr")]["turns"] == 2
    assert cell[("held_out", "acc_f")]["mean"] == 0.0
    paths = write_interval_table(tmp_path / "t", rows, title="demo")
    md = paths["md"].read_text()
    assert "## history-dependent turns" in md and "## fully specified turns" in md and "## held-out pairs" in md
    assert "| AnimeGamer | 2 (2) | 17.00 [16.00, 18.00]" in md
    assert len(paths["csv"].read_text().splitlines()) == len(rows) + 1
    assert json.loads(paths["json"].read_text())["rows"][0]["system"] == "AnimeGamer"
    assert "– " not in interval_markdown(rows)


def test_paired_differences_are_tighter_than_the_two_means():
    # Games differ a lot, but system a beats b by exactly 1 on every turn: the paired interval is a point.
    games = {"g0": [10.0, 11.0], "g1": [30.0, 29.0], "g2": [20.0, 22.0]}
    a = [MetricRecord("a", g, t, {"psnr": v + 1.0}) for g, vs in games.items() for t, v in enumerate(vs)]
    b = [MetricRecord("b", g, t, {"psnr": v}) for g, vs in games.items() for t, v in enumerate(vs)]
    b.append(MetricRecord("b", "g3", 0, {"psnr": 5.0}))  # a turn a never played is not compared
    splits = {(g, t): ("all",) for g in (*games, "g3") for t in range(2)}
    (row,) = difference_rows("a", {"a": a, "b": b}, splits, ("psnr",))
    assert row["system"] == "a − b" and (row["mean"], row["lower"], row["upper"]) == (1.0, 1.0, 1.0)
    assert row["turns"] == 6 and row["games"] == 3
    means = {r["system"]: r for r in interval_rows({"a": a, "b": b}, splits, ("psnr",))}
    assert means["a"]["upper"] - means["a"]["lower"] > 5  # the unpaired intervals overlap widely


def test_mean_difference_over_runs_averages_turn_by_turn():
    # Two runs: run 0's K = 3 beats its K = 1 by 2 on every turn, run 1's by 0 on g0 and 1 on g1; a turn one run
    # did not score is left out of the mean.
    splits = {(g, t): ("all", "far" if t else "full") for g in ("g0", "g1") for t in range(2)}
    k1 = {key: 15.0 for key in splits}
    run0 = (_records("k3", {key: 17.0 for key in splits}), _records("k1", k1))
    run1 = (_records("k3", {("g0", 0): 15.0, ("g0", 1): 15.0, ("g1", 0): 16.0}), _records("k1", k1))
    rows = {(r["split"], r["metric"]): r for r in mean_difference_rows("mean", [run0, run1], splits, ("psnr",))}
    assert rows[("all", "psnr")]["turns"] == 3 and rows[("far", "psnr")]["turns"] == 1
    assert rows[("all", "psnr")]["mean"] == pytest.approx((1.0 + 1.0 + 1.5) / 3)
    assert rows[("full", "psnr")]["mean"] == pytest.approx(1.25)
    # another grouping of the turns (here by turn index) through split_names
    by_turn = {(g, t): (f"turn {t}",) for g, t in splits}
    late = mean_difference_rows("mean", [run0, run1], by_turn, ("psnr",), split_names=("turn 1",))
    assert [(r["split"], r["turns"], r["mean"]) for r in late] == [("turn 1", 1, pytest.approx(1.0))]  # g0 only
    (one,) = [r for r in mean_difference_rows("run 0", [run0], splits, ("psnr",)) if r["split"] == "all"]
    assert (one["mean"], one["lower"], one["upper"], one["turns"]) == (2.0, 2.0, 2.0, 4)
    # one pair is difference_rows' cell
    same = difference_rows("k3", {"k3": run0[0], "k1": run0[1]}, splits, ("psnr",))
    assert [r | {"system": "run 0"} for r in same if r["split"] == "all"] == [one]
    with pytest.raises(ValueError, match="no pairs"):
        mean_difference_rows("none", [], splits)


def test_mean_cell_over_runs_averages_turn_by_turn():
    # Three seeds of one recipe scoring a 0/1 metric: each turn's value is averaged over the seeds (a turn one seed
    # did not score is left out), and one run is interval_rows' cell exactly.
    splits = {(g, t): ("all", "held_out" if g == "g1" else "seen") for g in ("g0", "g1") for t in range(2)}
    def _named(values):
        return [MetricRecord("a", game, turn, {"friend_named": v}) for (game, turn), v in values.items()]

    seeds = [_named({("g0", 0): 1.0, ("g0", 1): 1.0, ("g1", 0): 0.0, ("g1", 1): 1.0}),
             _named({("g0", 0): 1.0, ("g0", 1): 0.0, ("g1", 0): 0.0, ("g1", 1): 1.0}),
             _named({("g0", 0): 1.0, ("g0", 1): 1.0, ("g1", 0): 1.0})]
    rows = {r["split"]: r for r in mean_cell_rows("3 seeds", seeds, splits, ("friend_named",))}
    assert rows["all"]["turns"] == 3 and rows["all"]["games"] == 2
    assert rows["all"]["mean"] == pytest.approx((1.0 + 2 / 3 + 1 / 3) / 3)
    assert rows["seen"]["mean"] == pytest.approx(5 / 6) and rows["held_out"]["mean"] == pytest.approx(1 / 3)
    assert rows["all"]["lower"] <= rows["all"]["mean"] <= rows["all"]["upper"]
    one = mean_cell_rows("a", seeds[:1], splits, ("friend_named",))
    assert one == interval_rows({"a": seeds[0]}, splits, ("friend_named",))
    with pytest.raises(ValueError, match="no runs"):
        mean_cell_rows("none", [], splits)
