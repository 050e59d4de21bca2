"""Synthetic stage (b) inputs for tests: a captioned clip manifest and a TensorStore of random shot targets."""

from __future__ import annotations

from pathlib import Path

import torch

from animegamer.data.manifest import ClipRecord, write_manifest
from animegamer.data.name_swaps import SWAP_SHOT_FIELD
from animegamer.data.tensor_store import TensorStore

NAMES = ["Qiqi", "Sam", "Mia", "Ken"]
MOTIONS = ["run", "sleep", "eat", "dance", "read", "swim", "jump"]
PLACES = ["park", "forest", "bedroom", "kitchen", "beach"]
ADVERBS = ["slowly", "quickly", "happily", "calmly"]


def tag_line(film: int, index: int) -> str:
    """A valid, varied shot tag line, a pure function of (film, index)."""
    k = film * 7 + index
    return (
        f"<S>{NAMES[film % len(NAMES)]}</S><MD>{MOTIONS[k % len(MOTIONS)]}</MD><EV>{PLACES[k % len(PLACES)]}</EV>"
        f"<ML>{k % 5 + 1}</ML><MA>{ADVERBS[k % len(ADVERBS)]}</MA><SC>{k % 2}</SC><ET>{(k // 2) % 2}</ET>"
        f"<ST>{k % 3 - 1}</ST>"
    )


def clip_id(film: int, index: int) -> str:
    return f"film{film:02d}_{index:05d}"


def write_stage_b_data(
    root: Path,
    films: int = 3,
    clips_per_film: int = 5,
    num_slots: int = 8,
    shot_dim: int = 16,
    missing: tuple[str, ...] = (),
    uncaptioned: tuple[str, ...] = (),
    seed: int = 0,
    swaps: int = 0,
) -> tuple[Path, Path]:
    """Write ``root/clips.jsonl`` and ``root/shot_targets``; returns their paths.

    ``missing`` clips get no shot target; ``uncaptioned`` clips get no tags; with ``swaps`` every other clip also
    gets that many identity swaps (``swap_shots``: half its target plus noise, as if another friend were named).
    """
    records = []
    for f in range(films):
        for i in range(clips_per_film):
            cid = clip_id(f, i)
            records.append(
                ClipRecord(
                    clip_id=cid,
                    video=f"clips/{cid}.mp4",
                    film_id=f"film{f:02d}",
                    clip_index=i,
                    start=2.0 * i,
                    end=2.0 * i + 2.0,
                    tags=None if cid in uncaptioned else tag_line(f, i),
                )
            )
    manifest = write_manifest(root / "clips.jsonl", records)
    g = torch.Generator().manual_seed(seed)
    store = TensorStore(root / "shot_targets")
    shard = {r.clip_id: {"shot_embeds": torch.randn(num_slots, shot_dim, generator=g)}
             for r in records if r.clip_id not in missing}
    for k, row in enumerate(shard.values()):
        if swaps and k % 2 == 0:
            # half the target and a little noise: a prediction near zero is as near the swap as the target
            noise = torch.randn(swaps, num_slots, shot_dim, generator=g)
            row[SWAP_SHOT_FIELD] = 0.5 * row["shot_embeds"] + 0.1 * noise
    store.write_shard(shard)
    return manifest, store.root
