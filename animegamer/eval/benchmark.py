"""The benchmark: 10-turn life-simulation games written by an LLM, validated, stored with their ground truth.

The paper's construction: an LLM writes a story for a given character as one shot tag line per turn,

    <S>Qiqi</S><MD>run along the river</MD><EV>park</EV><ML>4</ML><MA>happily</MA><SC>0</SC><ET>1</ET><ST>-1</ST>

and the tags give both the player's instruction (``ShotTags.instruction()``) and the ground truth of the turn
(motion level, social, entertainment, stamina). Every answer is validated strictly (exactly ``turns`` lines, every
line a valid tag line of the right character that renders to a valid instruction, no repeat of an earlier story);
a rejected answer is retried with the reason, up to ``max_attempts`` answers, then the game is reported as failed.

On disk::

    <dir>/benchmark.json                 index: games, generator settings, failed games
    <dir>/<game_id>/game.txt             one instruction per turn (readable by states.read_game_file)
    <dir>/<game_id>/ground_truth.jsonl   one row per turn: turn, the tag fields, the rendered tag line

``load_benchmark(dir)`` reads it back as :class:`BenchmarkGame` objects, re-validating everything.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tqdm import tqdm

from animegamer.config import BenchmarkGenConfig
from animegamer.io import atomic_write_json, atomic_write_jsonl, atomic_write_text, iter_jsonl
from animegamer.llm import make_backend
from animegamer.states import (
    MAX_INSTRUCTION_CHARS,
    Instruction,
    ShotTags,
    StateValues,
    TagError,
    parse_instruction,
    parse_tags,
    read_game_file,
)

INDEX_NAME = "benchmark.json"
INDEX_FORMAT = 1
GAME_FILE = "game.txt"
TRUTH_FILE = "ground_truth.jsonl"


class BenchmarkError(ValueError):
    """A benchmark answer or file is invalid; the message names the file (or answer) and what is wrong."""


def fill_template(template: str, **fields: Any) -> str:
    """Replace ``{name}`` for each given field; other braces (e.g. a JSON example) are left alone."""
    for name, value in fields.items():
        template = template.replace("{" + name + "}", str(value))
    return template


@dataclass(frozen=True)
class BenchmarkGame:
    """One benchmark game: the character, its shots (ground truth) and where it is stored."""

    game_id: str
    character: str
    shots: tuple[ShotTags, ...]
    path: Path

    @property
    def instructions(self) -> list[Instruction]:
        """The player's instruction per turn."""
        return [shot.instruction() for shot in self.shots]

    @property
    def values(self) -> list[StateValues]:
        """The ground-truth motion level and state deltas per turn."""
        return [shot.values for shot in self.shots]

    def __len__(self) -> int:
        return len(self.shots)


# --------------------------------------------------------------------------------------------
# Validation of one LLM answer
# --------------------------------------------------------------------------------------------


def _answer_lines(text: str) -> list[str]:
    """Non-blank lines of an answer; a Markdown code fence around the whole answer is tolerated."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if lines and lines[0].startswith("```"):
        lines = lines[1:]
    if lines and lines[-1].startswith("```"):
        lines = lines[:-1]
    return lines


def parse_story(text: str, character: str, turns: int, *, source: str = "answer") -> list[ShotTags]:
    """Validate an LLM answer and return its shots; raise :class:`TagError`/:class:`BenchmarkError` naming the line.

    Accepted: exactly ``turns`` tag lines (blank lines and a surrounding code fence ignored), each parsed by
    :func:`parse_tags`, with ``<S>`` equal to ``character`` (case-insensitive; stored with the given spelling), and an
    instruction that survives a render/parse round trip (no semicolons in the motion or background, not too long).
    """
    lines = _answer_lines(text)
    if len(lines) != turns:
        raise BenchmarkError(f"{source}: expected exactly {turns} tag lines, got {len(lines)}")
    shots = []
    for number, line in enumerate(lines, start=1):
        shot = parse_tags(line, source=source, line=number)
        if shot.subject.casefold() != character.casefold():
            raise TagError(f"{shot.subject!r} is not the character {character!r}", source=source, line=number,
                           field="subject")
        shot = replace(shot, subject=character)
        instruction = shot.instruction()
        try:
            round_trip = parse_instruction(instruction.render()) == instruction
        except TagError:
            round_trip = False
        if not round_trip:
            raise TagError(f"does not make a valid instruction: {instruction.render()!r} (MD, MA and EV must not "
                           f"contain ';', at most {MAX_INSTRUCTION_CHARS} characters in all)",
                           source=source, line=number, field="motion")
        shots.append(shot)
    return shots


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------


def write_game(root: str | Path, game_id: str, character: str, shots: list[ShotTags]) -> BenchmarkGame:
    """Store one game (``game.txt`` + ``ground_truth.jsonl``) atomically under ``root/game_id``."""
    path = Path(root) / game_id
    atomic_write_text(path / GAME_FILE, "".join(shot.instruction().render() + "\n" for shot in shots))
    rows = [{"turn": turn, **shot.to_dict(), "tags": shot.render()} for turn, shot in enumerate(shots)]
    atomic_write_jsonl(path / TRUTH_FILE, rows)
    return BenchmarkGame(game_id, character, tuple(shots), path)


def read_game(root: str | Path, game_id: str, character: str) -> BenchmarkGame:
    """Read and re-validate one stored game; errors name the file and line."""
    path = Path(root) / game_id
    truth_path = path / TRUTH_FILE
    for required in (path / GAME_FILE, truth_path):
        if not required.is_file():
            raise BenchmarkError(f"{required}: missing")
    instructions = read_game_file(str(path / GAME_FILE))
    shots = []
    for number, row in iter_jsonl(truth_path, BenchmarkError):
        if not isinstance(row, dict) or "tags" not in row:
            raise BenchmarkError(f"{truth_path}:{number}: expected an object with a 'tags' line")
        shot = parse_tags(str(row["tags"]), source=str(truth_path), line=number)
        fields = {key: row.get(key) for key in shot.to_dict()}
        if fields != shot.to_dict() or row.get("turn") != len(shots):
            raise BenchmarkError(f"{truth_path}:{number}: fields or turn disagree with its tags {row['tags']!r}")
        if shot.subject != character:
            raise BenchmarkError(f"{truth_path}:{number}: subject {shot.subject!r} is not {character!r}")
        shots.append(shot)
    if len(shots) != len(instructions):
        raise BenchmarkError(f"{path}: {len(instructions)} instructions but {len(shots)} ground-truth rows")
    for turn, (instruction, shot) in enumerate(zip(instructions, shots, strict=True)):
        if instruction != shot.instruction():
            raise BenchmarkError(f"{path / GAME_FILE}: turn {turn + 1} {instruction.render()!r} does not match "
                                 f"its ground truth {shot.instruction().render()!r}")
    return BenchmarkGame(game_id, character, tuple(shots), path)


def read_index(root: str | Path) -> dict[str, Any]:
    path = Path(root) / INDEX_NAME
    if not path.is_file():
        raise BenchmarkError(f"{path}: benchmark index not found (generate it with scripts/make_benchmark.py)")
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise BenchmarkError(f"{path}: not valid JSON ({exc.msg})") from None
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT or not isinstance(index.get("games"), list):
        raise BenchmarkError(f"{path}: not a benchmark index of format {INDEX_FORMAT}")
    return index


def load_benchmark(root: str | Path, max_games: int = 0) -> list[BenchmarkGame]:
    """Every game listed in ``root/benchmark.json`` (the first ``max_games`` if > 0), validated, in index order."""
    index = read_index(root)
    entries = index["games"][:max_games] if max_games > 0 else index["games"]
    games = []
    for entry in entries:
        game = read_game(root, entry["game_id"], entry["character"])
        if len(game) != index["turns"]:
            raise BenchmarkError(f"{game.path}: {len(game)} turns, the index says {index['turns']}")
        games.append(game)
    return games


# --------------------------------------------------------------------------------------------
# Generation
# --------------------------------------------------------------------------------------------


def game_slug(character: str) -> str:
    """A file-system friendly id prefix for a character name."""
    if any(ch in character for ch in ";<>\n\r\t") or character != character.strip():
        raise BenchmarkError(f"character name {character!r} cannot be used in tag lines and instructions")
    slug = re.sub(r"[^a-z0-9]+", "-", character.casefold()).strip("-")
    if not slug:
        raise BenchmarkError(f"character name {character!r} has no letters or digits")
    return slug


@dataclass
class StoryResult:
    """What one game's generation gave: the shots (None if every answer was rejected) and each rejection."""

    shots: list[ShotTags] | None
    attempts: int
    errors: list[str] = field(default_factory=list)


class StoryWriter:
    """Asks a chat backend for one game's story and validates the answer, retrying with the rejection reason."""

    def __init__(self, backend, *, turns: int, system_prompt: str, prompt: str, retry_prompt: str,
                 max_attempts: int = 3, temperature: float = 0.9, max_tokens: int = 2048):
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        self.backend = backend
        self.turns = turns
        self.system_prompt, self.prompt, self.retry_prompt = system_prompt, prompt, retry_prompt
        self.max_attempts = max_attempts
        self.temperature, self.max_tokens = temperature, max_tokens

    def write(self, character: str, number: int, known: dict[tuple[str, ...], str] | None = None) -> StoryResult:
        """Story ``number`` for ``character``; ``known`` maps rendered stories to game ids, to reject repeats."""
        known = known or {}
        messages = [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": fill_template(self.prompt, character=character, turns=self.turns,
                                                      number=number)},
        ]
        errors = []
        for attempt in range(1, self.max_attempts + 1):
            answer = self.backend.chat(messages, max_tokens=self.max_tokens, temperature=self.temperature)
            try:
                shots = parse_story(answer, character, self.turns)
                rendered = tuple(shot.render() for shot in shots)
                if rendered in known:
                    raise BenchmarkError(f"answer: the same story as game {known[rendered]}; write a different one")
                return StoryResult(shots, attempt, errors)
            except (TagError, BenchmarkError) as exc:
                errors.append(str(exc))
                retry = fill_template(self.retry_prompt, error=exc, turns=self.turns, character=character)
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": retry}]
        return StoryResult(None, self.max_attempts, errors)


@dataclass
class GenerationReport:
    stored: list[str] = field(default_factory=list)  # game ids written in this run
    existing: list[str] = field(default_factory=list)  # game ids already in the index (resumed run)
    failed: dict[str, list[str]] = field(default_factory=dict)  # game id -> rejection reasons
    rejected_answers: int = 0  # answers that failed validation, including those of games stored after a retry


def _public_backend(spec: dict[str, Any]) -> dict[str, Any]:
    """The backend spec without secrets, for the index."""
    return {k: v for k, v in spec.items() if k in ("type", "model", "base_url", "path")}


def generate_benchmark(cfg: BenchmarkGenConfig, backend=None, progress: bool = True) -> GenerationReport:
    """Write ``cfg.games_per_character`` games per character into ``cfg.output_dir``.

    Resumable: games already listed in the index are kept and skipped; the index is rewritten after every game.
    ``backend`` defaults to ``animegamer.llm.make_backend(cfg.backend)``.
    """

    if not cfg.characters:
        raise BenchmarkError("no characters given (set characters=[Name,...])")
    if cfg.turns < 1 or cfg.games_per_character < 1:
        raise BenchmarkError("turns and games_per_character must be at least 1")
    slugs = [game_slug(c) for c in cfg.characters]
    if len(set(slugs)) != len(slugs):
        raise BenchmarkError(f"character names collide as ids: {cfg.characters}")
    root = Path(cfg.output_dir)
    index_path = root / INDEX_NAME
    if index_path.exists():
        index = read_index(root)
        if index["turns"] != cfg.turns:
            raise BenchmarkError(f"{index_path}: has {index['turns']}-turn games, this run asks for {cfg.turns}")
    else:
        index = {"format": INDEX_FORMAT, "turns": cfg.turns, "games": [], "failed": {}}
    index["generator"] = {"backend": _public_backend(cfg.backend), "temperature": cfg.temperature,
                          "max_attempts": cfg.max_attempts}
    done = {entry["game_id"]: entry for entry in index["games"]}
    known: dict[str, dict[tuple[str, ...], str]] = {c: {} for c in cfg.characters}
    report = GenerationReport()
    for entry in index["games"]:
        if entry["character"] in known:
            game = read_game(root, entry["game_id"], entry["character"])
            known[entry["character"]][tuple(shot.render() for shot in game.shots)] = game.game_id

    writer = StoryWriter(
        backend if backend is not None else make_backend(cfg.backend), turns=cfg.turns,
        system_prompt=cfg.system_prompt, prompt=cfg.prompt, retry_prompt=cfg.retry_prompt,
        max_attempts=cfg.max_attempts, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
    )
    jobs = [(c, f"{s}_{k:03d}", k) for c, s in zip(cfg.characters, slugs, strict=True)
            for k in range(cfg.games_per_character)]
    order = {game_id: position for position, (_, game_id, _) in enumerate(jobs)}
    for character, game_id, k in tqdm(jobs, desc="benchmark games", disable=not progress):
        if game_id in done:
            report.existing.append(game_id)
            continue
        result = writer.write(character, k + 1, known[character])
        report.rejected_answers += len(result.errors)
        if result.shots is None:
            report.failed[game_id] = result.errors
            index["failed"][game_id] = {"character": character, "errors": result.errors}
        else:
            write_game(root, game_id, character, result.shots)
            known[character][tuple(shot.render() for shot in result.shots)] = game_id
            index["games"].append({"game_id": game_id, "character": character, "turns": cfg.turns,
                                   "attempts": result.attempts})
            index["games"].sort(key=lambda entry: order.get(entry["game_id"], len(order)))  # resumed runs fill gaps
            index["failed"].pop(game_id, None)
            report.stored.append(game_id)
        atomic_write_json(index_path, index)
    return report
