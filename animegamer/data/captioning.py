"""Captioning clips with a vision-language model, in the two steps of the paper's supplement.

1. **Characters.** The model sees the reference images of every registered character
   (:mod:`animegamer.data.characters`) followed by ``num_frames`` (8) frames sampled evenly from the clip, and
   answers which characters appear: ``<C>Qiqi, Sora</C>`` or ``<C>none</C>``. Only registered names are accepted.
   Without a registry this step is skipped.
2. **Description.** The model sees the frames again, the characters found and the clip's motion level (computed
   from optical flow, :mod:`animegamer.data.motion`), and writes one tag line
   ``<S>…</S><MD>…</MD><EV>…</EV><MA>…</MA><SC>0|1</SC><ET>0|1</ET><ST>-1|0|1</ST>``. Chatter around the tags is
   ignored; the tags themselves are validated with :func:`animegamer.states.parse_tags`. The ``<ML>`` tag is always
   the computed motion level (one written by the model is discarded).

The prompts are templates in :class:`animegamer.config.CaptionConfig`. An invalid answer is asked again (a fresh
request whose prompt carries the validation error) up to ``max_attempts`` times per step; a clip still invalid
after that gets ``caption_status="invalid"`` and no tags, never a guessed caption. Backends come from
:func:`animegamer.llm.make_backend`: any OpenAI-compatible endpoint (vLLM, LMDeploy, ...) or a local transformers
vision-language model directory.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from animegamer.config import CaptionConfig
from animegamer.data.characters import CharacterRegistry
from animegamer.data.manifest import ClipRecord
from animegamer.data.video import read_video
from animegamer.llm import LLMError, make_backend
from animegamer.states import NUM_MOTION_LEVELS, TAG_ORDER, ShotTags, TagError, parse_tags

_CHARACTERS_RE = re.compile(r"<C>(.*?)</C>", re.S)
_KNOWN_TAG_RE = re.compile(r"<({})>.*?</\1>".format("|".join(TAG_ORDER)), re.S)
_ML_RE = re.compile(r"<ML>.*?</ML>", re.S)


class CaptionInvalid(ValueError):
    """A model answer that does not follow the requested format; the message says what is wrong."""


@dataclass
class CaptionResult:
    status: str  # ok | invalid
    tags: str | None  # canonical tag line when ok
    characters: list[str] = field(default_factory=list)  # registered characters found in step 1
    attempts: int = 0  # model calls made for this clip
    error: str = ""  # the last validation error when invalid


def parse_characters(answer: str, registry: CharacterRegistry) -> list[str]:
    """The registered characters named in a step-1 answer (``<C>a, b</C>`` or ``<C>none</C>``), in answer order."""
    found = _CHARACTERS_RE.findall(answer)
    if len(found) != 1:
        raise CaptionInvalid(f"expected exactly one <C>...</C> in the answer, found {len(found)}")
    body = found[0].strip()
    if body.casefold() == "none":
        return []
    names: list[str] = []
    for item in body.split(","):
        item = item.strip()
        if not item:
            raise CaptionInvalid(f"empty name in <C>{body}</C>")
        name = registry.canonical(item)
        if name is None:
            raise CaptionInvalid(f"{item!r} is not one of the characters {registry.names} (or 'none')")
        if name not in names:
            names.append(name)
    return names


def parse_description(answer: str, motion_level: int, source: str = "") -> ShotTags:
    """The shot tags of a step-2 answer with ``<ML>`` set to the computed ``motion_level``.

    The tag line is the span from the first to the last known tag; text before or after it is ignored, text
    between tags is not.
    """
    spans = [m.span() for m in _KNOWN_TAG_RE.finditer(answer)]
    if not spans:
        raise CaptionInvalid("no tags found; expected <S>...</S><MD>...</MD>...<ST>...</ST>")
    line = _ML_RE.sub("", answer[spans[0][0] : spans[-1][1]])
    try:
        return parse_tags(f"{line}<ML>{motion_level}</ML>", source=source)
    except TagError as exc:
        raise CaptionInvalid(str(exc)) from None


def sample_indices(num_frames: int, count: int) -> np.ndarray:
    """``count`` frame indices spread evenly over ``num_frames`` (first and last included)."""
    return np.linspace(0, num_frames - 1, count).round().astype(int)


def _shrink(image: np.ndarray, max_side: int) -> np.ndarray:
    import cv2

    h, w = image.shape[:2]
    if not max_side or max(h, w) <= max_side:
        return image
    scale = max_side / max(h, w)
    return cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)


_TEMPLATE_KEYS = {
    "system_prompt": {},
    "characters_prompt": {"num_references": 2, "reference_list": "image 1: A", "num_frames": 8, "names": "A"},
    "describe_prompt": {"num_frames": 8, "characters": "A", "motion_level": 3, "num_levels": 5},
    "retry_prompt": {"error": "missing tag <ST>"},
}


def check_templates(cfg: CaptionConfig) -> None:
    """Every prompt template formats with the placeholders it is given; raises ValueError naming the template."""
    for name, values in _TEMPLATE_KEYS.items():
        try:
            getattr(cfg, name).format(**values)
        except (KeyError, IndexError, ValueError) as exc:
            raise ValueError(
                f"captioner.{name}: bad template ({type(exc).__name__}: {exc}); placeholders available: "
                f"{sorted(values)} (write literal braces as {{{{ }}}})"
            ) from None


class Captioner:
    """Runs both captioning steps for clips with one backend; thread-safe for HTTP backends."""

    def __init__(
        self,
        cfg: CaptionConfig,
        backend: Any,
        registry: CharacterRegistry | None = None,
        num_levels: int = NUM_MOTION_LEVELS,
    ):
        check_templates(cfg)
        self.cfg = cfg
        self.backend = backend
        self.registry = registry
        self.num_levels = num_levels
        self.references: list[np.ndarray] = []
        labels = []
        if registry is not None:
            for name in registry.names:
                images = registry.load_images(name, cfg.image_size)
                first = len(self.references) + 1
                span = f"image {first}" if len(images) == 1 else f"images {first}-{first + len(images) - 1}"
                labels.append(f"{span}: {name}")
                self.references.extend(images)
        self.reference_list = "; ".join(labels)

    @classmethod
    def from_config(cls, cfg: CaptionConfig, registry: CharacterRegistry | None = None) -> Captioner:
        if not cfg.backend:
            raise ValueError(
                "captioner.backend is empty: set e.g. captioner.backend.type=openai "
                "captioner.backend.base_url=http://127.0.0.1:8000/v1 captioner.backend.model=NAME, "
                "or captioner.backend.type=transformers captioner.backend.path=DIR"
            )
        return cls(cfg, make_backend(dict(cfg.backend)), registry)

    def _ask(self, prompt: str, images: list[np.ndarray], parse: Callable[[str], Any]) -> tuple[Any, int, str]:
        """(parsed answer or None, calls made, last error). Retries are fresh requests carrying the error."""
        error = ""
        for attempt in range(1, self.cfg.max_attempts + 1):
            text = prompt if not error else prompt + "\n\n" + self.cfg.retry_prompt.format(error=error)
            messages = [{"role": "user", "content": text}]
            if self.cfg.system_prompt:
                messages.insert(0, {"role": "system", "content": self.cfg.system_prompt})
            answer = self.backend.chat(
                messages, images=images, max_tokens=self.cfg.max_tokens, temperature=self.cfg.temperature
            )
            try:
                return parse(answer), attempt, ""
            except CaptionInvalid as exc:
                error = str(exc)
        return None, self.cfg.max_attempts, error

    def caption(self, frames: np.ndarray, motion_level: int, source: str = "") -> CaptionResult:
        """Caption (T, H, W, 3) uint8 clip frames. Backend failures raise :class:`animegamer.llm.LLMError`."""
        if not 1 <= motion_level <= self.num_levels:
            raise ValueError(f"{source}: motion level {motion_level} outside 1..{self.num_levels}")
        picked = [_shrink(frames[i], self.cfg.image_size) for i in sample_indices(len(frames), self.cfg.num_frames)]
        characters: list[str] = []
        attempts = 0
        if self.registry is not None:
            prompt = self.cfg.characters_prompt.format(
                num_references=len(self.references),
                reference_list=self.reference_list,
                num_frames=len(picked),
                names=", ".join(self.registry.names),
            )
            registry = self.registry
            found, used, error = self._ask(prompt, self.references + picked, lambda a: parse_characters(a, registry))
            attempts += used
            if found is None:
                return CaptionResult("invalid", None, [], attempts, f"characters step: {error}")
            characters = found
        prompt = self.cfg.describe_prompt.format(
            num_frames=len(picked),
            characters=", ".join(characters) if characters else "none of the known characters",
            motion_level=motion_level,
            num_levels=self.num_levels,
        )
        tags, used, error = self._ask(prompt, picked, lambda a: parse_description(a, motion_level, source))
        attempts += used
        if tags is None:
            return CaptionResult("invalid", None, characters, attempts, f"description step: {error}")
        return CaptionResult("ok", tags.render(), characters, attempts)


def apply_result(record: ClipRecord, result: CaptionResult) -> None:
    """Store a caption result in a manifest record (characters and any error go to ``extra``)."""
    record.tags = result.tags
    record.caption_status = result.status
    record.extra["characters"] = result.characters
    if result.error:
        record.extra["caption_error"] = result.error
    else:
        record.extra.pop("caption_error", None)


def caption_records(
    captioner: Captioner,
    records: list[ClipRecord],
    root: str | Path,
    workers: int = 1,
    on_result: Callable[[ClipRecord, CaptionResult | None, str], None] | None = None,
) -> dict[str, int]:
    """Caption every record that has a motion level and no caption yet, updating the records in place.

    ``root`` is the directory clip paths are relative to. ``on_result(record, result, error)`` is called after
    each clip (``result`` None and ``error`` set when the backend failed; such a clip stays uncaptioned and is
    tried again on the next run). Returns counts ``{"ok", "invalid", "failed"}``.
    """

    todo = [r for r in records if not r.caption_status and r.motion_level is not None]
    counts = {"ok": 0, "invalid": 0, "failed": 0}

    def run(record: ClipRecord) -> CaptionResult:
        path = Path(record.video) if Path(record.video).is_absolute() else Path(root) / record.video
        frames, _ = read_video(path)
        return captioner.caption(frames, record.motion_level, source=record.clip_id)

    pool = ThreadPoolExecutor(max_workers=max(1, workers))
    try:
        futures = {pool.submit(run, r): r for r in todo}
        for future in as_completed(futures):
            record = futures[future]
            try:
                result = future.result()
            except (LLMError, OSError, RuntimeError) as exc:  # backend down, unreadable clip: retried next run
                counts["failed"] += 1
                if on_result is not None:
                    on_result(record, None, f"{record.clip_id}: {exc}")
                continue
            apply_result(record, result)
            counts[result.status] += 1
            if on_result is not None:
                on_result(record, result, "")
    finally:  # on Ctrl-C the queued clips are cancelled instead of captioned first; the running calls end
        pool.shutdown(wait=False, cancel_futures=True)
    return counts
