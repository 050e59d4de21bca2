"""The paper's main table: every system of the config over the benchmark games, scored turn by turn.

    python scripts/evaluate.py --config configs/eval.yaml                               # AnimeGamer vs GC baseline
    python scripts/evaluate.py --config configs/eval.yaml systems=[animegamer,gc_baseline,random,majority]
    python scripts/evaluate.py --config configs/tiny/eval.yaml                          # tiny models on a CPU

Benchmark: ``benchmark`` is a directory written by scripts/make_benchmark.py (LLM-written games, ground-truth
states) or the ``games/`` directory of scripts/spriteworld/make.py (held-out films with their real clips).

Writes to ``output_dir``: ``results.jsonl`` (one metric record per system, game and turn, with the settings that
produced it), ``summary.json``, ``table.md`` / ``table.csv`` (the main table), ``per_turn.png`` (each metric per
turn, per system) and ``clips/<system>/<game>/turn_XXX.mp4``. See animegamer/eval/harness.py for what every column
compares with.
"""

from __future__ import annotations

import sys

from animegamer.cli import parse_config
from animegamer.config import EvalConfig
from animegamer.eval.harness import EvalResult, evaluate


def main(argv: list[str] | None = None) -> EvalResult:
    def flags(parser):
        parser.add_argument("--quiet", action="store_true", help="no progress bars")

    cfg, args = parse_config(EvalConfig, __doc__, argv, extra=flags)
    try:
        result = evaluate(cfg, progress=not args.quiet)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    print(result.files["table_md"].read_text())
    for name, path in result.files.items():
        print(f"{name:10s} {path}")
    return result


if __name__ == "__main__":
    main()
