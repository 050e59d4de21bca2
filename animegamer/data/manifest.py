"""The JSONL clip manifest: one clip per line, plus a sidecar ``<manifest>.meta.json`` for dataset metadata.

    {"clip_id": "film01_00012", "video": "clips/film01/00012.mp4", "film_id": "film01", "clip_index": 12,
     "start": 24.0, "end": 26.0, "tags": "<S>Qiqi</S>…<ST>-1</ST>", "motion_scope": 1.73, "motion_level": 3}

``video`` is relative to the manifest's directory (or absolute). ``tags``/``motion_*`` are filled by later
pipeline steps and may be null until then. The meta file holds e.g. the motion-level bin edges, the flow
settings and the caption model, so new clips are scored the same way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from animegamer.io import atomic_write_json, atomic_write_jsonl, check_regular_file, iter_jsonl, read_json_bounded
from animegamer.states import NUM_MOTION_LEVELS, ShotTags, TagError, parse_tags

MAX_MANIFEST_BYTES = 4 << 30  # a million clips take about 300 MB


class ManifestError(ValueError):
    """A manifest line is malformed; the message names the file and line number."""


@dataclass
class ClipRecord:
    clip_id: str  # unique in the manifest, e.g. "<film_id>_<clip_index:05d>"
    video: str  # clip file, relative to the manifest directory or absolute
    film_id: str
    clip_index: int  # position of the clip within its film (timestamp order)
    start: float  # seconds in the film
    end: float
    tags: str | None = None  # shot tag line (animegamer.states), None until captioned
    motion_scope: float | None = None  # mean flow magnitude of moving pixels
    motion_level: int | None = None  # 1..5, quantised with the dataset's bin edges
    caption_status: str = ""  # "" not captioned | ok | invalid (kept, never guessed)
    extra: dict[str, Any] = field(default_factory=dict)  # anything else (scene index, characters, ...)

    def shot_tags(self) -> ShotTags | None:
        return parse_tags(self.tags, source=self.clip_id) if self.tags else None

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["extra"]:
            d.pop("extra")
        return d


_REQUIRED = {
    "clip_id": str, "video": str, "film_id": str, "clip_index": int, "start": (int, float), "end": (int, float)
}
_FIELDS = set(ClipRecord.__dataclass_fields__)


def _record_from_json(data: Any, where: str) -> ClipRecord:
    if not isinstance(data, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    for name, kind in _REQUIRED.items():
        if name not in data:
            raise ManifestError(f"{where}: missing field {name!r}")
        if not isinstance(data[name], kind) or isinstance(data[name], bool):
            raise ManifestError(f"{where}: field {name!r} has the wrong type ({type(data[name]).__name__})")
    unknown = set(data) - _FIELDS
    if unknown:
        raise ManifestError(f"{where}: unknown field(s) {sorted(unknown)}")
    record = ClipRecord(**data)
    if not record.clip_id or not record.video:
        raise ManifestError(f"{where}: clip_id and video must not be empty")
    if record.end <= record.start or record.start < 0:
        raise ManifestError(f"{where}: times must satisfy 0 <= start < end (got {record.start}, {record.end})")
    if record.motion_level is not None and not 1 <= record.motion_level <= NUM_MOTION_LEVELS:
        raise ManifestError(f"{where}: motion_level {record.motion_level} outside 1..{NUM_MOTION_LEVELS}")
    if record.tags:
        try:
            parse_tags(record.tags)
        except TagError as exc:
            raise ManifestError(f"{where}: {exc}") from None
    return record


@dataclass
class Manifest:
    path: Path
    records: list[ClipRecord]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.path.parent

    def video_path(self, record: ClipRecord) -> Path:
        p = Path(record.video)
        return p if p.is_absolute() else self.root / p

    def by_id(self) -> dict[str, ClipRecord]:
        return {r.clip_id: r for r in self.records}

    def films(self) -> dict[str, list[ClipRecord]]:
        """Clips grouped by film, each film in clip_index order."""
        out: dict[str, list[ClipRecord]] = {}
        for r in self.records:
            out.setdefault(r.film_id, []).append(r)
        return {k: sorted(v, key=lambda r: r.clip_index) for k, v in sorted(out.items())}

    def sample_split(self, split: str, count: int) -> list[ClipRecord]:
        """Up to ``count`` tagged clips of the meta's ``splits[split]`` films, evenly spread in manifest order."""
        films = set(self.meta.get("splits", {}).get(split, []))
        records = [r for r in self.records if r.tags and r.film_id in films]
        if not records:
            raise ValueError(f"{self.path}: no tagged clips in the '{split}' films of its meta splits")
        count = min(count, len(records))  # more than there are: every one, once
        picks = [round(i * (len(records) - 1) / max(1, count - 1)) for i in range(count)]
        return [records[i] for i in picks]

    def __len__(self) -> int:
        return len(self.records)


def meta_path(path: str | Path) -> Path:
    path = Path(path)
    return path.with_name(path.name + ".meta.json") if path.suffix != ".jsonl" else path.with_suffix(".meta.json")


def read_manifest(path: str | Path) -> Manifest:
    """Read and validate a manifest; a malformed line raises :class:`ManifestError` naming file and line."""
    path = Path(path)
    try:  # a named pipe would block, a device read without end
        check_regular_file(path, MAX_MANIFEST_BYTES)
    except FileNotFoundError:
        raise ManifestError(f"manifest not found: {path}") from None
    except ValueError as exc:
        raise ManifestError(str(exc)) from None
    records: list[ClipRecord] = []
    seen: dict[str, int] = {}
    for number, data in iter_jsonl(path, ManifestError):
        where = f"{path}:{number}"
        record = _record_from_json(data, where)
        if record.clip_id in seen:
            first = seen[record.clip_id]
            raise ManifestError(f"{where}: duplicate clip_id {record.clip_id!r} (first on line {first})")
        seen[record.clip_id] = number
        records.append(record)
    meta_file = meta_path(path)
    meta = read_json_bounded(meta_file) if meta_file.exists() else {}  # a pipe or a device there: refused
    if not isinstance(meta, dict):
        raise ManifestError(f"{meta_file}: not a manifest's meta (a JSON object expected)")
    return Manifest(path=path, records=records, meta=meta)


def write_manifest(path: str | Path, records: list[ClipRecord], meta: dict[str, Any] | None = None) -> Path:
    """Write records (and the meta sidecar if given) atomically."""
    path = Path(path)
    atomic_write_jsonl(path, [r.to_json() for r in records])
    if meta is not None:
        atomic_write_json(meta_path(path), meta)
    return path
