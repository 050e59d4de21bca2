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
    previous_index     (Q,) long       each current turn's last history turn, as a row of history_shots (-1: none)
    target_shots       (Q, N, D) float
    num_tokens         int             real (non-pad) tokens, for throughput

With ``swaps`` (stage (b)'s ``identity_weight`` > 0) a batch also holds each current turn's identity swaps
(:mod:`animegamer.data.name_swaps`: the encoder's shots of its caption with another friend named), zero-padded::

    target_swaps       (Q, S, N, D) float
    swap_mask          (Q, S) bool     True on real swaps (a turn that names no friend has none)

With ``name_swap_copies`` = k > 0 (stage (b)'s knob) a window whose current clip names a friend X is also a sample
k more times, each time with X renamed to another character Y of the current clip's identity swaps (in turn over
the windows, so every swap is used): every instruction of the window says Y where it said X, and every shot whose
caption named X is its identity swap for Y (the encoder's shot of that clip's first frame with Y named; decoded, it
draws Y: ``research/spriteworld/swap_shots.py``). Its identity swaps are then the original shot and X's other
swaps. A rename is skipped when a clip of the window names Y already, lacks the swap X -> Y, or the renamed window
no longer fits ``max_seq_len``, and never makes a pair that ``held_out`` holds out (the subject with Y), so the
held-out pairs stay out of training.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset

from animegamer.config import StageBConfig
from animegamer.data.manifest import ClipRecord, Manifest, read_manifest
from animegamer.data.name_swaps import SWAP_NAMES_FIELD, SWAP_SHOT_FIELD, mentions, names_from_tensor, rename
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


def held_out_friends(manifest: Manifest) -> frozenset[frozenset[str]]:
    """The unordered pairs of the manifest's data config's ``held_out_pairs`` (``meta.config``, ``"A:B"`` items):
    a (character, character) pair no training film has. A (character, action) item stays in the set too; a rename
    only ever asks for (subject, character), which no action is. A value that is not a list of strings raises
    ValueError (the manifest is a user's file)."""
    items = (manifest.meta.get("config") or {}).get("held_out_pairs") or []
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise ValueError(f"held_out_pairs of {manifest.path} must be a list of 'A:B' strings, got {items!r}")
    pairs = (item.split(":", 1) for item in items if ":" in item)
    return frozenset(frozenset((a, b)) for a, b in pairs if a and b and a != b)


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
        name_swap_copies: int = 0,
        held_out: frozenset[frozenset[str]] = frozenset(),
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
        # every sample: (window, None) as it is, then (window, (old, new)) for each name swap (module docstring)
        self.items: list[tuple[Window, tuple[str, str] | None]] = [(w, None) for w in self.windows]
        self.swap_names: dict[str, list[tuple[str, str]]] = {}
        if name_swap_copies < 0:
            raise ValueError(f"name_swap_copies={name_swap_copies} must be >= 0")
        if name_swap_copies:
            self.swap_names = self._read_swap_names()
            if not any(self.swap_names.values()):
                raise ValueError(f"name_swap_copies={name_swap_copies}: the shot targets in {store.root} hold no "
                                 f"identity swaps with their names ({SWAP_NAMES_FIELD}); write the stage (a) "
                                 "features again with identity swaps, then the shot targets")
            turn = 0  # windows renamed so far: each next one starts at its next swap
            for w in self.windows:
                renames = self._renames(w, held_out, bos)
                if renames:
                    picks = [renames[(turn + k) % len(renames)] for k in range(min(name_swap_copies, len(renames)))]
                    self.items += [(w, pair) for pair in picks]
                    turn += 1

    @property
    def renamed(self) -> int:
        """Samples that are renamed windows (``name_swap_copies``)."""
        return len(self.items) - len(self.windows)

    def _read_swap_names(self) -> dict[str, list[tuple[str, str]]]:
        """Every window clip's identity swaps' (old, new) names, in the order of its stored swaps."""
        out = {}
        for cid in sorted({c for w in self.windows for c in w.clip_ids}):
            row = self.store.load(cid, (), optional=(SWAP_NAMES_FIELD, SWAP_SHOT_FIELD))
            names = names_from_tensor(row[SWAP_NAMES_FIELD]) if SWAP_NAMES_FIELD in row else []
            if names and len(names) != len(row.get(SWAP_SHOT_FIELD, ())):
                raise ValueError(f"{cid} in {self.store.root}: {len(names)} swap names for "
                                 f"{len(row.get(SWAP_SHOT_FIELD, ()))} identity swaps")
            out[cid] = names
        return out

    def _renames(self, window: Window, held_out: frozenset[frozenset[str]], bos: int) -> list[tuple[str, str]]:
        """The (old, new) renames of ``window`` (module docstring), in the order of its current clip's swaps."""
        subject = self.records[window.current].shot_tags().subject
        # per clip: the names its caption says (its swaps' old names), its swaps, its instruction
        clips = []
        for c in window.clip_ids:
            names = self.swap_names.get(c, [])
            clips.append(({o for o, _ in names}, names, clip_turn(self.records[c]).instruction))
        out = []
        for old, new in self.swap_names.get(window.current, []):
            if frozenset((subject, new)) in held_out:
                continue
            if any(new in named or mentions(text, new) for named, _, text in clips):
                continue  # the window names the new character already
            if any(old in named and (old, new) not in names for named, names, _ in clips):
                continue  # a clip that names the friend has no swap to the new name
            if bos + len(self.layout.build_sequence(self._turns(window, (old, new)), add_bos=False)) \
                    > self.max_seq_len:
                continue
            out.append((old, new))
        return out

    def _turns(self, window: Window, pair: tuple[str, str] | None) -> list[TurnSpec]:
        last = len(window.clip_ids) - 1
        turns = [clip_turn(self.records[c], is_current=i == last) for i, c in enumerate(window.clip_ids)]
        if pair is None:
            return turns
        return [replace(t, instruction=rename(t.instruction, *pair), text_ids=None) for t in turns]

    def _renamed_row(self, clip_id: str, pair: tuple[str, str], current: bool) -> dict[str, torch.Tensor]:
        """A clip's shot (and, for the current turn, its identity swaps) as the window renamed by ``pair`` has
        them: its swap for the new name when its caption named the old one (module docstring)."""
        names = self.swap_names.get(clip_id, [])
        if pair not in names:
            return self._row(clip_id, swaps=current and self.swaps)
        row = self._row(clip_id, swaps=True)
        shot = row["swaps"][names.index(pair)]
        out = {"shot": shot}
        if current and self.swaps:
            others = [row["swaps"][i] for i, (o, n) in enumerate(names) if o == pair[0] and n != pair[1]]
            out["swaps"] = torch.stack([row["shot"], *others])
        return out

    def __len__(self) -> int:
        return len(self.items)

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
        window, pair = self.items[index]
        seq = self.layout.build_sequence(self._turns(window, pair))
        if pair is None:
            current = self._row(window.current, swaps=self.swaps)
            shots = [self._shot(c) for c in window.history] + [current["shot"]]
        else:
            current = self._renamed_row(window.current, pair, current=True)
            shots = [self._renamed_row(c, pair, current=False)["shot"] for c in window.history] + [current["shot"]]
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
        previous_index, seen = [], 0  # seen: history turns collated so far
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
                turns = len(item["history_shots"])
                previous_index.append(seen + turns - 1 if turns else -1)
                seen += turns
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
            "previous_index": torch.tensor(previous_index, dtype=torch.long),  # (Q,)
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
    (``tokenizer``: :func:`~animegamer.models.mllm_tokenizer.load_tokenizer`'s for ``cfg.mllm``)."""
    manifest = read_manifest(cfg.data.manifest)
    windows = windows_from_config(manifest, cfg.data)
    store = TensorStore(cfg.shot_targets)
    if len(store) == 0:
        raise FileNotFoundError(
            f"no shot targets in {cfg.shot_targets}; cache the stage (a) encoder's s_a of every clip first"
        )
    kept, missing = filter_windows(windows, store)
    layout = TurnLayout(tokenizer, get_vocabulary(cfg.mllm.vocabulary), cfg.mllm.num_slots)
    held_out = held_out_friends(manifest) if cfg.name_swap_copies else frozenset()
    dataset = StageBDataset(kept, manifest, store, layout, cfg.max_seq_len, cfg.mllm.shot_dim,
                            swaps=cfg.identity_weight > 0, name_swap_copies=cfg.name_swap_copies, held_out=held_out)
    if accelerator.is_main_process:
        print(f"stage (b) data: {len(dataset.windows)} windows ({cfg.data.split} split) from {cfg.data.manifest}")
        if cfg.name_swap_copies:
            print(f"name swaps: {dataset.renamed} renamed windows more ({cfg.name_swap_copies} at most per window; "
                  f"held-out pairs never made: {sorted(map(sorted, held_out))})")
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
