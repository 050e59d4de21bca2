"""Training films as evaluation games: the evaluation on films the models trained on, beside the held-out table,
tells what the models do not generalise from what they do not learn at all.

    python research/spriteworld/train_games.py --manifest outputs/spriteworld/data/train.jsonl \\
        --out outputs/spriteworld/data/train_games --films 40
    python scripts/evaluate.py --config outputs/spriteworld/configs/eval.yaml \\
        benchmark=outputs/spriteworld/data/train_games "systems=[animegamer,gc_baseline,reconstruction]" \\
        output_dir=outputs/spriteworld/eval/train_games

The first ``--films`` training films of the manifest (by film id) become game files exactly as the held-out games
are written (``animegamer.spriteworld.films.write_games``: ``<film>.txt`` + ``<film>.jsonl``, the videos relative to
the manifest's directory, so ``--out`` is a folder directly inside it). ``--out`` must be new or empty: the games
of an earlier run are replaced, nothing else is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from animegamer.cli import fail
from animegamer.data.manifest import ManifestError, read_manifest
from animegamer.spriteworld.films import write_games


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--manifest", required=True, help="the training films' manifest (<run>/data/train.jsonl)")
    parser.add_argument("--out", required=True, help="a new folder directly inside the manifest's directory")
    parser.add_argument("--films", type=int, default=40, help="how many training films (the first by film id)")
    args = parser.parse_args(argv)
    manifest_path, out = Path(args.manifest), Path(args.out)
    if args.films < 1:
        fail(f"--films={args.films} must be >= 1")
    if out.resolve().parent != manifest_path.resolve().parent:
        fail(f"--out {out} must be a folder directly inside {manifest_path.parent} (the games' videos are relative "
             "to it)")
    if out.exists() and (not out.is_dir() or any(p for p in out.iterdir() if p.suffix not in (".txt", ".jsonl"))):
        fail(f"--out {out} holds other files than games; choose a new folder")
    try:
        manifest = read_manifest(manifest_path)
    except (ManifestError, OSError) as exc:
        fail(f"--manifest: {exc}")
    films = sorted({r.film_id for r in manifest.records})[: args.films]
    picked = set(films)
    written = write_games(out, [r for r in manifest.records if r.film_id in picked], kind="training-film")
    print(f"wrote {len(written)} training-film games into {out}", file=sys.stderr)
    return written


if __name__ == "__main__":
    main()
