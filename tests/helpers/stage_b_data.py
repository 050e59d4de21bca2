"""Synthetic stage (b) inputs for tests: a captioned clip manifest and a TensorStore of random shot targets."""

from __future__ import annotations

from pathlib import Path

import torch

from animegamer.data.manifest import ClipRecord, write_manifest
from animegamer.data.name_swaps import SWAP_NAMES_FIELD, SWAP_SHOT_FIELD, names_tensor, swap_pairs
from animegamer.data.tensor_store import TensorStore

NAMES = ["Qiqi", "Sam", "Mia", "Ken"]
MOTIONS = ["run", "sleep", "eat", "dance", "read", "swim", "jump"]
PLACES = ["park", "forest", "bedroom", "kitchen", "beach"]
ADVERBS = ["slowly", "quickly", "happily", "calmly"]


def friend_of(film: int) -> str:
    """The friend a film's social clips name (``friends=True``): the next character after its subject."""
    return NAMES[(film + 1) % len(NAMES)]


def tag_line(film: int, index: int, friends: bool = False) -> str:
    """A valid, varied shot tag line, a pure function of (film, index); with ``friends`` the odd clips of a film
    talk with its friend (:func:`friend_of`)."""
    k = film * 7 + index
    motion = f"talk with {friend_of(film)}" if friends and index % 2 else MOTIONS[k % len(MOTIONS)]
    return (
        f"<S>{NAMES[film % len(NAMES)]}</S><MD>{motion}</MD><EV>{PLACES[k % len(PLACES)]}</EV>"
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
    friends: bool = False,
    meta: dict | None = None,
) -> tuple[Path, Path]:
    """Write ``root/clips.jsonl`` and ``root/shot_targets``; returns their paths.

    ``missing`` clips get no shot target; ``uncaptioned`` clips get no tags; with ``swaps`` every other clip also
    gets that many identity swaps (``swap_shots``: half its target plus noise, as if another friend were named).
    With ``friends`` those are the clips that name the film's friend (:func:`tag_line`), and their swaps carry
    their names (``swap_names``: the friend for each other non-subject character, in :data:`NAMES` order).
    ``meta`` is the manifest's meta (e.g. ``{"config": {"held_out_pairs": [...]}}``).
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
                    tags=None if cid in uncaptioned else tag_line(f, i, friends),
                )
            )
    manifest = write_manifest(root / "clips.jsonl", records, meta)
    g = torch.Generator().manual_seed(seed)
    store = TensorStore(root / "shot_targets")
    shard = {r.clip_id: {"shot_embeds": torch.randn(num_slots, shot_dim, generator=g)}
             for r in records if r.clip_id not in missing}
    tags = {r.clip_id: r.shot_tags() for r in records}
    for k, (cid, row) in enumerate(shard.items()):
        pairs = swap_pairs(tags[cid].motion_text(), tags[cid].subject, NAMES, swaps) if friends and tags[cid] else []
        if swaps and (pairs if friends else k % 2 == 0):
            # half the target and a little noise: a prediction near zero is as near the swap as the target
            noise = torch.randn(len(pairs) if friends else swaps, num_slots, shot_dim, generator=g)
            row[SWAP_SHOT_FIELD] = 0.5 * row["shot_embeds"] + 0.1 * noise
            if friends:
                row[SWAP_NAMES_FIELD] = names_tensor(pairs)
    store.write_shard(shard)
    return manifest, store.root
