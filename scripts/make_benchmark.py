"""Write the benchmark: an LLM writes N 10-turn life-simulation games per character, validated, with ground truth.

    python scripts/make_benchmark.py --config configs/benchmark_gen.yaml backend.base_url=http://127.0.0.1:8000/v1 \\
        characters=[Qiqi,Sora] games_per_character=10

Writes ``output_dir/<game_id>/game.txt`` (one instruction per turn), ``output_dir/<game_id>/ground_truth.jsonl``
(the tags of every turn) and the index ``output_dir/benchmark.json``. A rerun keeps the games already written and
retries only the missing or failed ones. Exits with status 1 if any game failed validation ``max_attempts`` times.
"""

from __future__ import annotations

import sys

from animegamer.cli import parse_config
from animegamer.config import BenchmarkGenConfig
from animegamer.eval.benchmark import BenchmarkError, generate_benchmark
from animegamer.llm import LLMError


def main(argv: list[str] | None = None) -> int:
    cfg, _ = parse_config(BenchmarkGenConfig, __doc__, argv)
    try:
        report = generate_benchmark(cfg)
    except (BenchmarkError, LLMError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    total = len(report.stored) + len(report.existing)
    print(f"{cfg.output_dir}: {total} games ({len(report.stored)} new, {len(report.existing)} kept), "
          f"{report.rejected_answers} answers rejected, {len(report.failed)} games failed")
    for game_id, errors in report.failed.items():
        print(f"failed {game_id}: {errors[-1]}", file=sys.stderr)
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
