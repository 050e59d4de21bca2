"""Build the tiny random models behind configs/tiny/ (seeded, so every build is identical).

    python scripts/make_tiny_checkpoints.py --out checkpoints/tiny
"""

from __future__ import annotations

import argparse
from pathlib import Path

from animegamer import tiny


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="checkpoints/tiny", help="output directory")
    parser.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    args = parser.parse_args()
    written = tiny.build_all(Path(args.out), seed=args.seed)
    for name, path in written.items():
        print(f"{name:>10}: {path}")


if __name__ == "__main__":
    main()
