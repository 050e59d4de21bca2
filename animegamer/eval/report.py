"""Tables in the paper's layout (markdown + CSV) and metric-per-turn plots (PNG) from metric summaries and records.

The columns, in the paper's order, each with its direction (↑ higher is better, ↓ lower is better):

    CLIP-I ↑  DreamSim ↓  CLIP-T ↑  ACC-F ↑  MAE-F ↓  ACC-S ↑  MAE-S ↓  PSNR ↑  SSIM ↑  s/turn ↓
    [Friend-N ↑  Friend-R ↑  Hero ↑]  [judge scores ↑]

The identity columns (SpriteWorld games: the named friend drawn, the friend only earlier shots show drawn, the
protagonist drawn) and the judge columns appear only when some row has such a value.

A metric a row could not compute shows "–"; the notes under the markdown table say why, and say how the numbers
were made (CLIP model and scale, what CLIP-I compares with, how motion levels were obtained).
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Sequence
from pathlib import Path

from animegamer.eval.metrics import METRICS, MetricRecord, MetricSummary, per_turn
from animegamer.io import atomic_path, atomic_write_text

MAIN_COLUMNS = ("clip_i", "dreamsim", "clip_t", "acc_f", "mae_f", "acc_s", "mae_s", "psnr", "ssim", "seconds")
# SpriteWorld games only: who is drawn (animegamer.spriteworld.identity)
IDENTITY_COLUMNS = ("friend_named", "friend_remembered", "hero_on_screen")
JUDGE_COLUMNS = ("judge_overall", "judge_instruction_following", "judge_contextual_coherence",
                 "judge_character_consistency")
PLOT_METRICS = ("clip_i", "dreamsim", "clip_t", "acc_f", "mae_f", "acc_s", "psnr", "ssim")


def column_label(metric: str) -> str:
    """The column header of a metric with its direction arrow, e.g. ``CLIP-I ↑`` or ``s/turn ↓``."""
    if metric == "seconds":
        return "s/turn ↓"
    info = METRICS[metric]
    return f"{info.label} {'↑' if info.higher_is_better else '↓'}"


def format_value(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    if math.isinf(value):
        return "inf"
    if metric in ("psnr", "seconds") or metric.startswith("judge_"):
        return f"{value:.2f}"
    return f"{value:.3f}"


def table_columns(entries: Sequence[tuple[str, MetricSummary]]) -> list[str]:
    """The main columns, plus the identity and the judge columns when any row has such a value."""
    def any_value(metrics: Sequence[str]) -> bool:
        return any(s.means.get(m) is not None for _, s in entries for m in metrics)

    return (list(MAIN_COLUMNS) + (list(IDENTITY_COLUMNS) if any_value(IDENTITY_COLUMNS) else [])
            + (list(JUDGE_COLUMNS) if any_value(JUDGE_COLUMNS) else []))


def _notes(entries: Sequence[tuple[str, MetricSummary]], columns: list[str]) -> list[str]:
    """How the numbers were made and why a metric is missing: one line per fact, naming the rows it is true of."""
    grouped: dict[str, list[str]] = {}  # fact -> labels, in first-seen order
    for label, summary in entries:
        st = summary.settings
        parts = []
        if st.clip_model:
            parts.append(f"CLIP {st.clip_model}, scale {st.clip_scale:g}, {st.clip_frames or 'all'} frames per clip")
        if st.reference:
            parts.append(f"CLIP-I/DreamSim vs {st.reference}")
        flow = st.flow or {}
        if flow.get("levels") == "measured":
            parts.append(f"ACC-F/MAE-F: level measured on the generated clip by {flow.get('method')} flow, edges "
                         f"{flow.get('edges_from')}")
        elif flow:
            parts.append(f"ACC-F/MAE-F: predicted level compared ({flow.get('why', '')})")
        reasons: dict[str, list[str]] = {}
        for metric in columns:
            if metric in summary.missing:
                reasons.setdefault(summary.missing[metric], []).append(column_label(metric).split(" ")[0])
        for why, names in reasons.items():
            head, _, rest = why.partition(": ")
            parts.append(f"{'/'.join(names)} missing: {rest if rest and head in names else why}")
        for part in parts:
            grouped.setdefault(part, []).append(label)
    everyone = [label for label, _ in entries]
    return [f"- {text}" if labels == everyone else f"- **{', '.join(labels)}**: {text}"
            for text, labels in grouped.items()]


def markdown_table(entries: Sequence[tuple[str, MetricSummary]], title: str = "", first_column: str = "system") -> str:
    """The table as markdown: one row per ``(label, summary)``, then the notes."""
    if not entries:
        raise ValueError("no rows for the table")
    columns = table_columns(entries)
    lines = [f"# {title}", ""] if title else []
    lines.append("| " + " | ".join([first_column, *map(column_label, columns)]) + " |")
    lines.append("|" + "---|" + "---:|" * len(columns))
    for label, summary in entries:
        cells = [format_value(m, summary.means.get(m)) for m in columns]
        lines.append("| " + " | ".join([label, *cells]) + " |")
    return "\n".join([*lines, "", *_notes(entries, columns), ""])


def csv_table(entries: Sequence[tuple[str, MetricSummary]], first_column: str = "system") -> str:
    """The table as CSV: full-precision means (empty = missing) and the number of turns each mean is over."""
    columns = table_columns(entries)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow([first_column, *map(column_label, columns), "turns"])
    for label, summary in entries:
        values = ["" if summary.means.get(m) is None else repr(float(summary.means[m])) for m in columns]
        turns = max((summary.counts.get(m, 0) for m in ("seconds", "acc_f", "acc_s", "clip_t")), default=0)
        writer.writerow([label, *values, turns])
    return buffer.getvalue()


def write_table(stem: str | Path, entries: Sequence[tuple[str, MetricSummary]], title: str = "",
                first_column: str = "system") -> tuple[Path, Path]:
    """``<stem>.md`` and ``<stem>.csv``, written atomically; returns both paths."""
    stem = Path(stem)
    md, table_csv = stem.with_suffix(".md"), stem.with_suffix(".csv")
    atomic_write_text(md, markdown_table(entries, title, first_column))
    atomic_write_text(table_csv, csv_table(entries, first_column))
    return md, table_csv


def plot_per_turn(records: dict[str, list[MetricRecord]], path: str | Path,
                  metrics: Sequence[str] = PLOT_METRICS) -> Path:
    """One panel per metric with per-turn values, one line per system: does consistency decay over a game?"""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    curves = {m: {s: per_turn(rs, m) for s, rs in records.items() if rs} for m in metrics}
    curves = {m: {s: c for s, c in by_system.items() if c} for m, by_system in curves.items()}
    shown = [m for m in metrics if curves[m]]
    if not shown:
        raise ValueError("no per-turn values to plot")
    cols = min(4, len(shown))
    rows = math.ceil(len(shown) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols, 2.8 * rows), squeeze=False)
    colors = {system: f"C{i % 10}" for i, system in enumerate(records)}  # one colour per system in every panel
    for ax, metric in zip(axes.flat, shown, strict=False):
        for system, curve in curves[metric].items():
            ax.plot([t + 1 for t in curve], list(curve.values()), marker="o", markersize=3, label=system,
                    color=colors[system])
        ax.set_title(column_label(metric))
        ax.set_xlabel("turn")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(shown):]:
        ax.axis("off")
    legend: dict[str, object] = {}  # every system once, whichever panels it appears in
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(label, handle)
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=min(5, len(legend)), frameon=False)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)
    return path
