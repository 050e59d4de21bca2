"""Stage (c) data: the frozen MLLM's prediction of every training clip, cached once, paired with the real clip.

Every stage (b) window of the configured split (:mod:`animegamer.data.sequences`) becomes one prediction: the
MLLM predicts the current clip's s_a from its instruction (rendered from the clip's tags) and a history laid out by
:func:`animegamer.models.mllm_turn.predict_turn` exactly as at inference. ``history`` says which:

- ``teacher`` (the paper's): the earlier clips' stage (a) shot targets with their tagged state values, the input
  stage (b) trained on;
- ``own``: the MLLM's own predictions of the earlier clips (shots and values), each made from its own earlier
  predictions from the start of the film, as a game plays the film's instructions; the decoder then learns to
  render what the MLLM predicts at play time, drift included. An earlier clip that is no window's current clip
  (no features) enters as its stage (a) target.

A window longer than ``max_seq_len`` tokens loses its oldest history turns, as in stage (b).

    predictions_cache/ (a TensorStore, one entry per window's current clip)
        shot_embeds            (N, H) float32   the MLLM's predicted s_a of the clip
        values                 (4,) int64       its predicted motion level, social, entertainment, stamina
        predictions_meta.json  what the predictions depend on (MLLM checkpoint digest, shot targets, window
                               settings); a cache made with other settings is refused, never silently reused

Filling is resumable (clips already cached are skipped) and spreads over processes: each process predicts its
share of a block of about ``shard_size`` windows (``own``: whole films, in clip order), and the main process
gathers the block and writes it as one shard, so no process sits in a long barrier while another one predicts.

:class:`StageCDataset` pairs each cached prediction with the clip's real latents (``data.features_dir``) and its
motion level: the decoder learns to render the MLLM's slightly-off s_a as the real clip.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from animegamer.config import StageCConfig
from animegamer.data.features import motion_level_of, read_skipped
from animegamer.data.manifest import ClipRecord, Manifest
from animegamer.data.sequences import Window, windows_from_config
from animegamer.data.stage_b import SHOT_FIELD, StageBDataset, clip_turn, filter_windows
from animegamer.data.tensor_store import TensorStore
from animegamer.io import atomic_write_json, resolve_checkpoint
from animegamer.models.mllm_turn import HistoryTurn, TurnPrediction, predict_turn
from animegamer.states import StateValues
from animegamer.tokens import TurnLayout

META_FILE = "predictions_meta.json"
VALUES_FIELD = "values"  # the prediction's state values: motion_level, social, entertainment, stamina
MLLM_WEIGHT_FILES = ("adapter_model.safetensors", "mllm_trained.safetensors")


# --------------------------------------------------------------------------------------------
# Which windows
# --------------------------------------------------------------------------------------------


def select_windows(cfg: StageCConfig, manifest: Manifest, layout: TurnLayout) -> tuple[list[Window], list[str]]:
    """The windows stage (c) predicts and trains on (one per current clip), and a report line per clip left out.

    A window is kept when its current clip has precomputed features and every clip of it has a stage (a) shot
    target; its history is trimmed to ``cfg.max_seq_len`` tokens like stage (b)'s.
    """
    targets = TensorStore(cfg.shot_targets)
    if len(targets) == 0:
        raise FileNotFoundError(
            f"no shot targets in {cfg.shot_targets}; stage (a) writes them at the end of training "
            "(or run scripts/encode_shots.py)"
        )
    features = TensorStore(cfg.data.features_dir)
    reasons = read_skipped(cfg.data.features_dir)
    records = manifest.by_id()
    left_out: list[str] = []

    def report(clip_id: str, why: str) -> None:
        left_out.append(f"{manifest.video_path(records[clip_id])} ({clip_id}): {why}")

    seen: set[str] = set()
    with_features = []
    for window in windows_from_config(manifest, cfg.data):
        if window.current in seen:
            continue
        seen.add(window.current)
        if window.current in features:
            with_features.append(window)
        else:
            report(window.current, reasons.get(window.current, {}).get("reason", "no precomputed features"))
    kept, missing = filter_windows(with_features, targets)
    lacking = set(missing)
    for window in with_features:
        absent = [c for c in window.clip_ids if c in lacking]
        if absent:
            report(window.current, f"no stage (a) shot target in {cfg.shot_targets} for {', '.join(absent)}")
    if not kept:
        raise ValueError(
            f"no stage (c) windows: no clip of the {cfg.data.split!r} split of {cfg.data.manifest} has both "
            f"features in {cfg.data.features_dir} and shot targets in {cfg.shot_targets}"
        )
    fitted = StageBDataset(kept, manifest, targets, layout, cfg.max_seq_len, cfg.mllm.shot_dim)
    for clip_id in fitted.too_long:
        report(clip_id, f"its turn alone is longer than max_seq_len={cfg.max_seq_len} tokens")
    return fitted.windows, left_out


def teacher_turn(clip_id: str, records: dict[str, ClipRecord], targets: TensorStore) -> HistoryTurn:
    """An earlier clip as a teacher-forced history turn: its instruction, stage (a) s_a and true values."""
    spec = clip_turn(records[clip_id])
    shot = targets.load(clip_id, (SHOT_FIELD,))[SHOT_FIELD].float()  # (N, shot_dim)
    return HistoryTurn(spec.instruction, shot, spec.values)


def history_of(window: Window, records: dict[str, ClipRecord], targets: TensorStore) -> list[HistoryTurn]:
    """The teacher-forced history of a window."""
    return [teacher_turn(clip_id, records, targets) for clip_id in window.history]


# --------------------------------------------------------------------------------------------
# The predictions cache
# --------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()


def prediction_settings(cfg: StageCConfig) -> dict:
    """What the cached predictions depend on. ``compare`` is checked on reuse; ``paths`` are recorded only.

    The MLLM is identified by the digest of its trained weights (a retrained stage (b) under the same path is a
    different model), the shot targets by the ``source.json`` stage (a) wrote beside them.
    """
    checkpoint = resolve_checkpoint(cfg.stage_b_checkpoint)
    missing = [name for name in MLLM_WEIGHT_FILES if not (checkpoint / name).is_file()]
    if missing:
        raise FileNotFoundError(f"{checkpoint} is not an MLLM checkpoint: {missing[0]} is missing")
    source = Path(cfg.shot_targets) / "source.json"
    data = cfg.data
    windows = {"history_turns": data.history_turns, "split_by": data.split_by, "max_seq_len": cfg.max_seq_len}
    if data.split_by == "time":  # runs are cut at the split, so a clip's history depends on it
        windows |= {"split": data.split, "test_fraction": data.test_fraction}
    compare = {
        "mllm_weights": {name: _sha256(checkpoint / name) for name in MLLM_WEIGHT_FILES},
        "mllm": {k: getattr(cfg.mllm, k) for k in ("vocabulary", "num_slots", "shot_dim")},
        "shot_targets": json.loads(source.read_text()) if source.is_file() else None,
        "windows": windows,
    }
    if cfg.history != "teacher":  # caches made before the choice existed are teacher-forced and stay valid
        compare["history"] = cfg.history
    return {
        "compare": compare,
        "paths": {
            "stage_b_checkpoint": str(checkpoint),
            "mllm_pretrained": cfg.mllm.pretrained,
            "shot_targets": cfg.shot_targets,
            "manifest": data.manifest,
        },
    }


def check_prediction_settings(cache_dir: str | Path, settings: dict) -> None:
    """Raise ValueError when ``cache_dir`` holds predictions made with other settings (names what changed)."""
    meta = Path(cache_dir) / META_FILE
    if not meta.is_file():
        if len(TensorStore(cache_dir)):
            raise ValueError(f"{cache_dir} holds predictions but no {META_FILE}; delete it or use another directory")
        return
    old = json.loads(meta.read_text()).get("compare", {})
    changed = sorted(k for k, v in settings["compare"].items() if old.get(k) != v)
    if changed:
        raise ValueError(
            f"the MLLM predictions in {cache_dir} were made with other {', '.join(changed)} (see {meta}); "
            "delete that directory or set predictions_cache to a new one"
        )


@dataclass
class PredictionSummary:
    written: int = 0  # predictions made by this call (all processes)
    cached: int = 0  # windows whose prediction was already in the cache

    def __str__(self) -> str:
        return f"MLLM predictions: {self.written} made, {self.cached} already cached"


def _same(objects: list) -> list:
    return objects


def _values_tensor(values: StateValues) -> torch.Tensor:
    return torch.tensor([values.motion_level, values.social, values.entertainment, values.stamina], dtype=torch.long)


def _own_history(window: Window, own: dict[str, TurnPrediction], cache: TensorStore,
                 records: dict[str, ClipRecord], targets: TensorStore) -> list[HistoryTurn]:
    """A window's history as the MLLM itself predicted it (this call's predictions, else the cache's), an earlier
    clip with no prediction as its stage (a) target and tagged values."""
    turns = []
    for clip_id in window.history:
        if clip_id in own:
            shot, values = own[clip_id].shot_embeds, own[clip_id].values
        elif clip_id in cache:
            entry = cache.load(clip_id, (SHOT_FIELD, VALUES_FIELD))
            shot, values = entry[SHOT_FIELD].float(), StateValues(*entry[VALUES_FIELD].tolist())
        else:
            turns.append(teacher_turn(clip_id, records, targets))
            continue
        turns.append(HistoryTurn(clip_turn(records[clip_id]).instruction, shot, values))
    return turns


def _work_units(windows: list[Window], records: dict[str, ClipRecord], history: str) -> list[list[Window]]:
    """What one process predicts in one go: a window (teacher-forced), or a film's windows in clip order (own)."""
    if history == "teacher":
        return [[w] for w in windows]
    films: dict[str, list[Window]] = {}
    for window in windows:
        films.setdefault(window.film_id, []).append(window)
    return [sorted(film, key=lambda w: records[w.current].clip_index) for film in films.values()]


@torch.no_grad()
def fill_predictions(
    model,
    windows: list[Window],
    manifest: Manifest,
    targets: TensorStore,
    cache_dir: str | Path,
    settings: dict,
    rank: int = 0,
    world_size: int = 1,
    gather: Callable[[list], list] = _same,
    shard_size: int = 64,
    progress: bool = True,
    history: str = "teacher",
) -> PredictionSummary:
    """Predict s_a for every window whose current clip is not yet in ``cache_dir``, and write them there.

    ``history``: ``teacher`` or ``own`` (module doc). Every process calls this with the same arguments; process
    ``rank`` predicts every ``world_size``-th unit (a window, or a film's windows) of each block of about
    ``shard_size`` windows, and ``gather`` (e.g. ``accelerate.utils.gather_object``) brings the block to the main
    process, which alone writes. ``model`` is only read: it is used in eval mode, without gradients.
    """
    if history not in ("teacher", "own"):
        raise ValueError(f"history={history!r} is not 'teacher' or 'own'")
    cache = TensorStore(cache_dir)
    todo = [w for w in windows if w.current not in cache]
    summary = PredictionSummary(cached=len(windows) - len(todo))
    if not todo:
        return summary
    if rank == 0:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(cache_dir) / META_FILE, settings)
    records = manifest.by_id()
    units = _work_units(todo, records, history)
    bar = tqdm(total=len(todo), desc="MLLM predictions", unit="clip", disable=not progress)
    start = 0
    while start < len(units):
        end, size = start, 0
        while end < len(units) and (size < shard_size or end == start):
            size, end = size + len(units[end]), end + 1
        mine = []
        for unit in units[start:end][rank::world_size]:
            own: dict[str, TurnPrediction] = {}
            for window in unit:
                turn = clip_turn(records[window.current], is_current=True)
                past = (history_of(window, records, targets) if history == "teacher"
                        else _own_history(window, own, cache, records, targets))
                own[window.current] = predict_turn(model, past, turn.instruction)
                mine.append((window.current, own[window.current].shot_embeds.contiguous(),  # (N, shot_dim) float32
                             _values_tensor(own[window.current].values)))
        block_predictions = gather(mine)
        if rank == 0:
            cache.write_shard({clip_id: {SHOT_FIELD: shot, VALUES_FIELD: values}
                               for clip_id, shot, values in block_predictions})
        summary.written += size
        bar.update(size)
        start = end
    bar.close()
    return summary


# --------------------------------------------------------------------------------------------
# Stage (c) dataset
# --------------------------------------------------------------------------------------------


class StageCDataset(Dataset):
    """Cached MLLM prediction + real clip: shot_embeds (N, H), latents (F, C, h, w), motion_level."""

    def __init__(self, features_dir: str | Path, predictions_dir: str | Path, items: list[tuple[str, int]]):
        if not items:
            raise ValueError(f"no stage (c) clips: nothing in {predictions_dir} has features in {features_dir}")
        self.features_dir, self.predictions_dir = Path(features_dir), Path(predictions_dir)
        self.items = items
        # opened lazily: safetensors handles must not cross DataLoader worker processes
        self._features: TensorStore | None = None
        self._predictions: TensorStore | None = None

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if self._features is None:
            self._features = TensorStore(self.features_dir)
            self._predictions = TensorStore(self.predictions_dir)
        clip_id, level = self.items[index]
        latents = self._features.load(clip_id, ("latents",))["latents"]  # (C, F, h, w)
        shot = self._predictions.load(clip_id, (SHOT_FIELD,))[SHOT_FIELD]  # (N, H)
        return {
            "latents": latents.permute(1, 0, 2, 3).float(),  # (F, C, h, w)
            "shot_embeds": shot.float(),
            "motion_level": torch.tensor(level, dtype=torch.long),
        }


def build_dataset(cfg: StageCConfig, manifest: Manifest, windows: list[Window]) -> StageCDataset:
    """The dataset of the windows' current clips: each clip's cached prediction, real latents and motion level."""
    cache = TensorStore(cfg.predictions_cache)
    uncached = [w.current for w in windows if w.current not in cache]
    if uncached:
        raise ValueError(f"{len(uncached)} clips have no MLLM prediction in {cfg.predictions_cache}: {uncached[:3]}")
    records = manifest.by_id()
    items = [(w.current, motion_level_of(records[w.current])) for w in windows]
    return StageCDataset(cfg.data.features_dir, cfg.predictions_cache, items)
