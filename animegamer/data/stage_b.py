"""Stage (b) samples and batches: windows of shots -> token ids, slot positions, shot targets.

A sample is one :class:`~animegamer.data.sequences.Window`. Each clip becomes a turn whose instruction is rendered
from its tags (``ShotTags.instruction().render()``) and whose values are its tagged state values; the sequence is
laid out by :meth:`animegamer.tokens.TurnLayout.build_sequence`. Shot representations come from the stage (a)
cache, a :class:`TensorStore` holding ``shot_embeds`` (N, shot_dim) per clip id.

A window longer than ``max_seq_len`` tokens loses its oldest history turns until it fits (reported once).

Collated batch (R rows of T tokens; positions index the flattened (R*T) sequence)::

    input_ids          (R, T) long     pad id after the end of each row
    labels             (R, T) long     IGNORE_INDEX except the current turns' value tokens
    position_ids       (R, T) long     restart at 0 for every sequence of a packed row
    attention_mask     (R, T) long     1 on real tokens (only without packing: packed rows rely on position_ids)
    history_positions  (M, N) long     slots of every history turn in the batch
    history_shots      (M, N, D) float
    query_positions    (Q, N) long     slots of every current turn (one per sample)
    target_shots       (Q, N, D) float
    num_tokens         int             real (non-pad) tokens, for throughput

With ``swaps`` (stage (b)'s ``identity_weight`` > 0) a batch also holds each current turn's identity swaps
(:mod:`animegamer.data.name_swaps`: the encoder's shots of its caption with another friend named), zero-padded::

    target_swaps       (Q, S, N, D) float
    swap_mask          (Q, S) bool     True on real swaps (a turn that names no friend has none)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from animegamer.config import StageBConfig
from animegamer.data.manifest import ClipRecord, Manifest, read_manifest
from animegamer.data.name_swaps import SWAP_SHOT_FIELD
from animegamer.data.sequences import Window, windows_from_config
from animegamer.data.tensor_store import TensorStore
from animegamer.io import atomic_write_text
from animegamer.tokens import IGNORE_INDEX, TurnLayout, TurnSpec, get_vocabulary

SHOT_FIELD = "shot_embeds"
PAD_MULTIPLE = 8  # rows are padded to a multiple of this (tensor-core friendly), never past max_seq_len


def filter_windows(windows: list[Window], store: TensorStore) -> tuple[list[Window], list[str]]:
    """(windows whose every clip has a cached shot target, sorted ids of the clips that lack one)."""
    missing = sorted({cid for w in windows for cid in w.clip_ids if cid not in store})
    lacking = set(missing)
    return [w for w in windows if not lacking.intersection(w.clip_ids)], missing


def clip_turn(record: ClipRecord, is_current: bool = False) -> TurnSpec:
    """The turn of a captioned clip: instruction from its tags, its tagged state values."""
    tags = record.shot_tags()
    if tags is None:
        raise ValueError(f"clip {record.clip_id} has no tags; it cannot be a turn")
    return TurnSpec(tags.instruction().render(), tags.values, is_current=is_current)


class StageBDataset(Dataset):
    """Windows -> dicts of token ids, labels, slot positions and shot tensors (see module docstring)."""

    def __init__(
        self,
        windows: list[Window],
        manifest: Manifest,
        store: TensorStore,
        layout: TurnLayout,
        max_seq_len: int,
        shot_dim: int,
        swaps: bool = False,
    ):
        if not windows:
            raise ValueError("no stage (b) windows: check the manifest, the split and the shot targets")
        self.records = manifest.by_id()
        self.store, self.layout = store, layout
        self.num_slots, self.shot_dim, self.max_seq_len = layout.num_slots, shot_dim, max_seq_len
        self.swaps = swaps
        bos = 1 if getattr(layout.tokenizer, "bos_token_id", None) is not None else 0
        turn_len: dict[str, int] = {}
        for cid in {c for w in windows for c in w.clip_ids}:
            turn_len[cid] = len(layout.build_sequence([clip_turn(self.records[cid])], add_bos=False))
        self.windows: list[Window] = []
        self.trimmed = 0  # windows that lost history turns to fit max_seq_len
        self.too_long: list[str] = []  # current clips whose turn alone exceeds max_seq_len
        for w in windows:
            ids = list(w.clip_ids)
            while ids and bos + sum(turn_len[c] for c in ids) > max_seq_len:
                ids.pop(0)
            if not ids or ids[-1] != w.current:
                self.too_long.append(w.current)
                continue
            self.trimmed += len(ids) < len(w.clip_ids)
            self.windows.append(Window(w.film_id, tuple(ids)))
        if not self.windows:
            raise ValueError(f"every window is longer than max_seq_len={max_seq_len} even without history")

    def __len__(self) -> int:
        return len(self.windows)

    def _shot(self, clip_id: str) -> torch.Tensor:
        """A clip's shot target (N, D), checked against the MLLM's slots and width."""
        return self._row(clip_id)["shot"]

    def _row(self, clip_id: str, swaps: bool = False) -> dict[str, torch.Tensor]:
        """A clip's shot target (N, D) as ``shot``, and with ``swaps`` its identity swaps (S, N, D) as ``swaps``
        ((0, N, D) when it names no friend), from one read of the store."""
        row = self.store.load(clip_id, (SHOT_FIELD,), optional=(SWAP_SHOT_FIELD,) if swaps else ())
        shot = row[SHOT_FIELD]
        if tuple(shot.shape) != (self.num_slots, self.shot_dim):
            raise ValueError(
                f"shot target of {clip_id} in {self.store.root} has shape {tuple(shot.shape)}; "
                f"expected ({self.num_slots}, {self.shot_dim}) = (mllm.num_slots, mllm.shot_dim)"
            )
        out = {"shot": shot.float()}
        if swaps:
            found = row.get(SWAP_SHOT_FIELD, torch.zeros(0, self.num_slots, self.shot_dim))
            if tuple(found.shape[1:]) != (self.num_slots, self.shot_dim):
                raise ValueError(f"identity swaps of {clip_id} in {self.store.root} have shape "
                                 f"{tuple(found.shape)}; expected (S, {self.num_slots}, {self.shot_dim})")
            out["swaps"] = found.float()
        return out

    def __getitem__(self, index: int) -> dict:
        window = self.windows[index]
        turns = [clip_turn(self.records[c]) for c in window.history]
        turns.append(clip_turn(self.records[window.current], is_current=True))
        seq = self.layout.build_sequence(turns)
        current = self._row(window.current, swaps=self.swaps)
        shots = [self._shot(c) for c in window.history] + [current["shot"]]
        empty = torch.zeros(0, self.num_slots, self.shot_dim)
        item = {
            "input_ids": torch.tensor(seq.input_ids, dtype=torch.long),
            "labels": torch.tensor(seq.labels, dtype=torch.long),
            "history_positions": torch.tensor(seq.slot_positions[:-1], dtype=torch.long).view(-1, self.num_slots),
            "history_shots": torch.stack(shots[:-1]) if len(shots) > 1 else empty,
            "query_positions": torch.tensor(seq.slot_positions[-1], dtype=torch.long),
            "target_shot": shots[-1],
        }
        if self.swaps:
            item["target_swaps"] = current["swaps"]
        return item


@dataclass
class StageBCollator:
    """Pads (or packs, then pads) samples into rows of at most ``max_seq_len`` tokens."""

    pad_id: int
    max_seq_len: int
    pack: bool = False

    def _rows(self, items: list[dict]) -> list[list[dict]]:
        if not self.pack:
            return [[item] for item in items]
        rows: list[list[dict]] = []
        used: list[int] = []
        for item in items:  # next fit, in sampler order: deterministic and cheap
            n = len(item["input_ids"])
            if rows and used[-1] + n <= self.max_seq_len:
                rows[-1].append(item)
                used[-1] += n
            else:
                rows.append([item])
                used.append(n)
        return rows

    def __call__(self, items: list[dict]) -> dict:
        rows = self._rows(items)
        longest = max(sum(len(i["input_ids"]) for i in row) for row in rows)
        if longest > self.max_seq_len:
            raise ValueError(f"a sample of {longest} tokens exceeds max_seq_len={self.max_seq_len}")
        length = min(-(-longest // PAD_MULTIPLE) * PAD_MULTIPLE, self.max_seq_len)
        input_ids = torch.full((len(rows), length), self.pad_id, dtype=torch.long)
        labels = torch.full((len(rows), length), IGNORE_INDEX, dtype=torch.long)
        position_ids = torch.zeros((len(rows), length), dtype=torch.long)
        attention_mask = torch.zeros((len(rows), length), dtype=torch.long)
        history_positions, history_shots, query_positions, target_shots = [], [], [], []
        for r, row in enumerate(rows):
            offset = r * length  # flat index of this row's first token
            start = 0
            for item in row:
                n = len(item["input_ids"])
                input_ids[r, start : start + n] = item["input_ids"]
                labels[r, start : start + n] = item["labels"]
                position_ids[r, start : start + n] = torch.arange(n)
                attention_mask[r, start : start + n] = 1
                history_positions.append(item["history_positions"] + offset + start)
                history_shots.append(item["history_shots"])
                query_positions.append(item["query_positions"] + offset + start)
                target_shots.append(item["target_shot"])
                start += n
            # pads continue the positions, so in a packed row they form a sequence of their own
            position_ids[r, start:] = torch.arange(length - start)
        batch = {
            "input_ids": input_ids,
            "labels": labels,
            "position_ids": position_ids,
            "history_positions": torch.cat(history_positions),  # (M, N)
            "history_shots": torch.cat(history_shots),  # (M, N, D)
            "query_positions": torch.stack(query_positions),  # (Q, N)
            "target_shots": torch.stack(target_shots),  # (Q, N, D)
            "num_tokens": int(attention_mask.sum()),
        }
        if not self.pack:
            batch["attention_mask"] = attention_mask
        if "target_swaps" in items[0]:
            batch["target_swaps"], batch["swap_mask"] = pad_swaps([item["target_swaps"] for row in rows
                                                                   for item in row])
        return batch


def pad_swaps(swaps: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-turn (S_i, N, D) swaps -> zero-padded (Q, S, N, D) and the (Q, S) mask of real ones (S >= 1)."""
    most = max(1, max(len(s) for s in swaps))
    padded = swaps[0].new_zeros(len(swaps), most, *swaps[0].shape[1:])
    mask = torch.zeros(len(swaps), most, dtype=torch.bool)
    for q, s in enumerate(swaps):
        padded[q, : len(s)] = s
        mask[q, : len(s)] = True
    return padded, mask


def move_batch(batch: dict, device: torch.device) -> dict:
    """Tensors of a batch to ``device`` (non-blocking); other values unchanged."""
    return {k: v.to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()}


def build_dataset(cfg: StageBConfig, accelerator, tokenizer: Any) -> StageBDataset:
    """Windows of the configured split whose shots all have cached targets, laid out with the MLLM's tokenizer
    (``tokenizer``: :func:`~animegamer.models.mllm.load_tokenizer`'s for ``cfg.mllm``)."""
    manifest = read_manifest(cfg.data.manifest)
    windows = windows_from_config(manifest, cfg.data)
    store = TensorStore(cfg.shot_targets)
    if len(store) == 0:
        raise FileNotFoundError(
            f"no shot targets in {cfg.shot_targets}; cache the stage (a) encoder's s_a of every clip first"
        )
    kept, missing = filter_windows(windows, store)
    layout = TurnLayout(tokenizer, get_vocabulary(cfg.mllm.vocabulary), cfg.mllm.num_slots)
    dataset = StageBDataset(kept, manifest, store, layout, cfg.max_seq_len, cfg.mllm.shot_dim,
                            swaps=cfg.identity_weight > 0)
    if accelerator.is_main_process:
        print(f"stage (b) data: {len(dataset)} windows ({cfg.data.split} split) from {cfg.data.manifest}")
        if missing:
            report = Path(cfg.output_dir) / "missing_shot_targets.txt"
            atomic_write_text(report, "".join(f"{cid}\n" for cid in missing))
            print(
                f"warning: {len(missing)} clips have no shot target in {cfg.shot_targets}; skipped "
                f"{len(windows) - len(kept)} windows (clip ids in {report})"
            )
        if dataset.swaps:
            current = sorted({w.current for w in dataset.windows})
            with_swaps = sum(SWAP_SHOT_FIELD in store.load(c, (), optional=(SWAP_SHOT_FIELD,)) for c in current)
            print(f"identity term: {with_swaps} of {len(current)} current clips have identity swaps"
                  + ("" if with_swaps else f" (none in {cfg.shot_targets}: the term is 0; the stage (a) features "
                                           "hold no swaps' text tokens)"))
        if dataset.trimmed or dataset.too_long:
            print(
                f"note: {dataset.trimmed} windows lost history turns to fit max_seq_len={cfg.max_seq_len}; "
                f"{len(dataset.too_long)} dropped as too long"
            )
    return dataset
