"""Write a SpriteWorld dataset: drawn clips (mp4), the JSONL manifest with tags and true motion, held-out games.

    python scripts/spriteworld/make.py --config configs/spriteworld/data.yaml
    python scripts/spriteworld/make.py --config configs/spriteworld/data.yaml output_dir=outputs/tiny/data num_films=4

Writes ``output_dir/clips/<film>/<index>.mp4``, ``output_dir/clips.jsonl`` (+ ``clips.meta.json``: motion bin
edges, train/test films) and ``output_dir/games/<film>.txt`` + ``.jsonl`` (test films as games with ground truth).
"""

from __future__ import annotations

import time

from animegamer.cli import parse_config
from animegamer.config import SpriteWorldConfig
from animegamer.data.manifest import read_manifest
from animegamer.spriteworld import write_dataset


def main() -> None:
    cfg, _ = parse_config(SpriteWorldConfig, __doc__)
    start = time.perf_counter()
    try:
        path = write_dataset(cfg)
    except ValueError as exc:
        raise SystemExit(f"error: {exc}") from None
    manifest = read_manifest(path)
    splits = manifest.meta["splits"]
    print(
        f"wrote {len(manifest)} clips from {len(manifest.films())} films ({len(splits['train'])} train, "
        f"{len(splits['test'])} test) to {path} in {time.perf_counter() - start:.1f} s; "
        f"motion bin edges {[round(e, 3) for e in manifest.meta['motion']['edges']]}"
    )


if __name__ == "__main__":
    main()
