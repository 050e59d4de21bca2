"""LLM-as-judge: a vision-language model scores a whole played game on the paper's four criteria.

The judge sees ``frames_per_turn`` frames of every turn's clip (in turn order, optionally after reference images of
the character) and the turn instructions, and must answer with exactly one JSON object of four integer scores 1..10:

    {"overall": 6, "instruction_following": 7, "contextual_coherence": 5, "character_consistency": 8}

Anything else (prose around it, a missing or extra key, 7.5, "7", 11) is rejected by :func:`parse_judgement`; the
request is repeated with the rejection reason up to ``max_attempts`` times, then the game's judgement is recorded as
failed. A score is never guessed from a malformed answer.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from animegamer.config import JudgeConfig
from animegamer.eval.benchmark import fill_template
from animegamer.eval.metrics import MetricRecord, MetricSettings, sample_frames
from animegamer.llm import make_backend
from animegamer.states import Instruction

JUDGE_CRITERIA = ("overall", "instruction_following", "contextual_coherence", "character_consistency")
SCORE_MIN, SCORE_MAX = 1, 10


class JudgeFormatError(ValueError):
    """The judge's answer is not exactly the required JSON object of four integer scores."""


@dataclass(frozen=True)
class JudgeScores:
    overall: int
    instruction_following: int
    contextual_coherence: int
    character_consistency: int

    def to_dict(self) -> dict[str, int]:
        return asdict(self)


def parse_judgement(text: str) -> JudgeScores:
    """Parse the judge's answer strictly: one JSON object (a surrounding Markdown code fence is tolerated) whose
    keys are exactly :data:`JUDGE_CRITERIA` and whose values are integers in 1..10."""
    body = text.strip()
    if body.startswith("```"):
        lines = body.splitlines()
        if len(lines) < 3 or lines[-1].strip() != "```":
            raise JudgeFormatError("unterminated code fence")
        body = "\n".join(lines[1:-1]).strip()
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        raise JudgeFormatError(f"not a JSON object ({exc.msg} at character {exc.pos})") from None
    if not isinstance(data, dict):
        raise JudgeFormatError(f"expected a JSON object, got {type(data).__name__}")
    missing = [key for key in JUDGE_CRITERIA if key not in data]
    extra = [key for key in data if key not in JUDGE_CRITERIA]
    if missing or extra:
        raise JudgeFormatError(f"keys must be exactly {list(JUDGE_CRITERIA)} (missing {missing}, unexpected {extra})")
    for key in JUDGE_CRITERIA:
        value = data[key]
        if not isinstance(value, int) or isinstance(value, bool) or not SCORE_MIN <= value <= SCORE_MAX:
            raise JudgeFormatError(f"{key}={value!r} is not an integer in {SCORE_MIN}..{SCORE_MAX}")
    return JudgeScores(**{key: data[key] for key in JUDGE_CRITERIA})


@dataclass
class Judgement:
    """The judge's verdict on one game; ``scores`` is None when every answer was malformed (see ``errors``)."""

    game_id: str
    scores: JudgeScores | None
    attempts: int
    errors: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.scores is None

    def to_dict(self) -> dict:
        return {"game_id": self.game_id, "scores": self.scores.to_dict() if self.scores else None,
                "attempts": self.attempts, "errors": self.errors}

    def to_record(self, system: str, settings: MetricSettings) -> MetricRecord:
        """A game-level (``turn = -1``) metric record with ``judge_<criterion>`` values."""
        names = [f"judge_{key}" for key in JUDGE_CRITERIA]
        if self.scores is None:
            reason = f"judge failed after {self.attempts} answers: {self.errors[-1] if self.errors else 'no answer'}"
            return MetricRecord(system, self.game_id, -1, dict.fromkeys(names), dict.fromkeys(names, reason),
                                settings)
        values = {f"judge_{key}": float(v) for key, v in self.scores.to_dict().items()}
        return MetricRecord(system, self.game_id, -1, values, {}, settings)


def _downscale(frame: np.ndarray, max_side: int) -> np.ndarray:
    if max_side <= 0 or max(frame.shape[:2]) <= max_side:
        return frame
    from PIL import Image

    h, w = frame.shape[:2]
    scale = max_side / max(h, w)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(frame).resize(size, Image.Resampling.BICUBIC))


class LLMJudge:
    """Scores games with a chat backend that accepts images (``backend.chat(messages, images=...)``)."""

    def __init__(self, backend, *, system_prompt: str, prompt: str, retry_prompt: str, frames_per_turn: int = 2,
                 max_image_side: int = 360, max_attempts: int = 3, temperature: float = 0.0, max_tokens: int = 256):
        if max_attempts < 1 or frames_per_turn < 1:
            raise ValueError("max_attempts and frames_per_turn must be at least 1")
        self.backend = backend
        self.system_prompt, self.prompt, self.retry_prompt = system_prompt, prompt, retry_prompt
        self.frames_per_turn = frames_per_turn
        self.max_image_side = max_image_side
        self.max_attempts = max_attempts
        self.temperature, self.max_tokens = temperature, max_tokens

    @classmethod
    def from_config(cls, cfg: JudgeConfig, backend=None) -> LLMJudge:
        """Build the judge; ``backend`` defaults to ``animegamer.llm.make_backend(cfg.backend)``."""

        if backend is None:
            if not cfg.backend:
                raise ValueError("judge.backend is empty: no LLM judge configured")
            backend = make_backend(cfg.backend)
        return cls(backend, system_prompt=cfg.system_prompt, prompt=cfg.prompt, retry_prompt=cfg.retry_prompt,
                   frames_per_turn=cfg.frames_per_turn, max_image_side=cfg.max_image_side,
                   max_attempts=cfg.max_attempts, temperature=cfg.temperature, max_tokens=cfg.max_tokens)

    def build_request(self, character: str, instructions: Sequence[str | Instruction],
                      clips: Sequence[np.ndarray | torch.Tensor],
                      references: np.ndarray | torch.Tensor | None = None) -> tuple[str, list[np.ndarray]]:
        """The user prompt and the images (references first, then each turn's sampled frames, in turn order)."""
        if len(instructions) != len(clips) or not clips:
            raise ValueError(f"need one clip per instruction, got {len(clips)} clips for {len(instructions)} turns")
        images: list[np.ndarray] = []
        note = ""
        if references is not None:
            images += [_downscale(image, self.max_image_side) for image in sample_frames(references, 0)]
            note = f"Images 1-{len(images)} show {character} as a reference. "
        lines = []
        for turn, (instruction, clip) in enumerate(zip(instructions, clips, strict=True), start=1):
            frames = sample_frames(clip, self.frames_per_turn)
            first, last = len(images) + 1, len(images) + len(frames)
            where = f"image {first}" if first == last else f"images {first}-{last}"
            text = instruction.render() if isinstance(instruction, Instruction) else str(instruction)
            lines.append(f"Turn {turn} ({where}): {text}")
            images += [_downscale(frame, self.max_image_side) for frame in frames]
        prompt = fill_template(self.prompt, character=character, references=note,
                               frames_per_turn=self.frames_per_turn, instructions="\n".join(lines))
        return prompt, images

    def judge(self, game_id: str, character: str, instructions: Sequence[str | Instruction],
              clips: Sequence[np.ndarray | torch.Tensor],
              references: np.ndarray | torch.Tensor | None = None) -> Judgement:
        """Ask for scores until an answer parses (at most ``max_attempts`` requests); backend errors propagate."""
        prompt, images = self.build_request(character, instructions, clips, references)
        errors: list[str] = []
        for attempt in range(1, self.max_attempts + 1):
            # Each retry is a fresh single-turn request (the images belong to its one user message), with the
            # previous rejection appended so the judge can correct its format.
            text = prompt if not errors else prompt + "\n\n" + fill_template(self.retry_prompt, error=errors[-1])
            messages = [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": text}]
            answer = self.backend.chat(messages, images=images, max_tokens=self.max_tokens,
                                       temperature=self.temperature)
            try:
                return Judgement(game_id, parse_judgement(answer), attempt, errors)
            except JudgeFormatError as exc:
                errors.append(str(exc))
        return Judgement(game_id, None, self.max_attempts, errors)


def summarize_judgements(judgements: Sequence[Judgement]) -> dict[str, float | int | None]:
    """Mean score per criterion over the judged games, with the number judged and failed."""
    scored = [j.scores for j in judgements if j.scores is not None]
    summary: dict[str, float | int | None] = {
        key: (sum(getattr(s, key) for s in scored) / len(scored) if scored else None) for key in JUDGE_CRITERIA
    }
    summary["judged"] = len(scored)
    summary["failed"] = len(judgements) - len(scored)
    return summary
