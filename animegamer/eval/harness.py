"""The evaluation loop behind scripts/evaluate.py and scripts/run_ablations.py: systems x games x turns -> metrics.

    result = evaluate(load_config("configs/eval.yaml"))      # writes output_dir/{results.jsonl, table.md, ...}

Per turn (one :class:`MetricRecord` per system, game and turn; the LLM judge adds one per game with ``turn = -1``):

- **CLIP-T**: generated frames against the turn's instruction.
- **CLIP-I / DreamSim**: generated frames against the turn's ground-truth clip (frame t against frame t, the real
  clip resampled to the generated frame count and size) when the games have clips; else against the character's
  reference images of ``characters`` (every pair); else reported missing.
- **PSNR / SSIM**: against the resampled ground-truth clip, when there is one.
- **Friend-N / Friend-R / Hero** (SpriteWorld games, whose turns say who the real clip shows): whether the friend in
  view is the second character drawn, on turns whose instruction names it (N) or leaves it to earlier shots (R),
  and whether the protagonist is drawn, by the characters' colours (:mod:`animegamer.spriteworld.identity`).
- **ACC-F / MAE-F**: the motion level *measured* on the generated clip with the training data's flow settings and
  bin edges (``motion_manifest`` meta) against the ground-truth level. When the meta's levels are not flow levels
  (SpriteWorld's true motion) the edges are refitted by flow on ``motion_calibration_clips`` training clips, so
  generated and real clips are binned alike. Without a manifest, or for a system that renders nothing, the
  system's *predicted* level is compared instead; ``MetricSettings.flow["levels"]`` says which.
- **ACC-S / MAE-S**: predicted social / entertainment / stamina against the ground truth (systems that predict a
  state); ``acc_level`` is the accuracy of the predicted (not measured) motion level.
- **seconds**: the system's model time for the turn (with ``render_batch`` > 1 the clips of a game render in batches
  across games, and a batch's time is shared evenly by its clips).

``clip_games`` limits the clips written under ``output_dir/clips/<system>/<game>/`` to the first games (writing
every clip of a long evaluation costs about as much as rendering it on a CPU); a system's clips of an earlier
evaluation in the same ``output_dir`` are removed first, so every clip there is from this one.

Beside the table of means, ``table_intervals.{md,csv,json}`` gives every cell a 95 % bootstrap interval over games,
split into history-dependent turns, fully specified turns and held-out pairs, and the paired differences of the
first system against each other one (:mod:`animegamer.eval.intervals`).

Every record carries its :class:`MetricSettings` (CLIP model, scale, frames, reference, DreamSim, flow), and
:func:`~animegamer.eval.metrics.summarize` refuses to average records made with different settings.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from animegamer.config import DataConfig, EvalConfig, to_yaml
from animegamer.data.characters import read_character_registry
from animegamer.data.manifest import ClipRecord, Manifest, read_manifest
from animegamer.data.motion import MotionSettings, edges_from_meta, fit_motion_bins, motion_level, scorer_for
from animegamer.data.sequences import split_films
from animegamer.data.video import read_video
from animegamer.eval.benchmark import BenchmarkGame
from animegamer.eval.games import GroundTruthGame, load_games
from animegamer.eval.intervals import difference_rows, interval_rows, turn_splits, write_interval_table
from animegamer.eval.judge import Judgement, LLMJudge
from animegamer.eval.metrics import (
    CLIPScorer,
    MetricRecord,
    MetricSettings,
    MetricSummary,
    motion_level_metrics,
    psnr,
    sample_frame_indices,
    ssim,
    state_metrics,
    summarize,
    try_dreamsim,
)
from animegamer.eval.report import IDENTITY_COLUMNS, plot_per_turn, write_table
from animegamer.eval.systems import RENDERING, SYSTEMS, TurnOutput, build_system
from animegamer.io import atomic_write_json, atomic_write_jsonl, atomic_write_text
from animegamer.llm import LLMError
from animegamer.states import ShotTags

RESULTS_FILE = "results.jsonl"
SUMMARY_FILE = "summary.json"


# --------------------------------------------------------------------------------------------
# Training clips and motion levels of generated clips
# --------------------------------------------------------------------------------------------


def training_clips(manifest: Manifest) -> list[ClipRecord]:
    """Tagged clips of the training split: the meta's ``splits["train"]`` films, else the film split of stage b."""

    films = manifest.meta.get("splits", {}).get("train")
    if films is None:
        films, _ = split_films([r.film_id for r in manifest.records], DataConfig().test_fraction)
    keep = set(films)
    return [r for r in manifest.records if r.tags and r.film_id in keep]


@dataclass
class LevelMeter:
    """Measures the motion level of a clip with fixed flow settings and bin edges."""

    settings: object  # animegamer.data.motion.MotionSettings
    edges: list[float]
    info: dict  # recorded as MetricSettings.flow

    def level(self, frames: np.ndarray) -> int:
        return motion_level(scorer_for(self.settings).score(frames), self.edges)


def build_level_meter(manifest: Manifest, calibration_clips: int = 64, progress: bool = True) -> LevelMeter:
    """The data's flow settings and edges from the manifest meta; edges refitted by flow if its levels are not."""

    motion = manifest.meta.get("motion")
    if not isinstance(motion, dict):
        raise ValueError(f"{manifest.path}: the meta has no 'motion' settings (run scripts/prepare_data.py)")
    info: dict = {"levels": "measured", "manifest": str(manifest.path)}
    if motion.get("method") in ("dis", "raft"):
        settings = MotionSettings.from_meta(motion)
        edges = edges_from_meta(manifest.meta)
        info["edges_from"] = "manifest meta"
    else:
        settings = MotionSettings(method="dis", height=int(motion.get("height", 0)), width=int(motion.get("width", 0)),
                                  fps=float(motion.get("fps", 0.0)))
        clips = training_clips(manifest) or [r for r in manifest.records if r.tags]
        step = max(1, len(clips) // max(1, calibration_clips))
        chosen = clips[::step][:calibration_clips]
        if len(chosen) < 5:
            raise ValueError(f"{manifest.path}: {len(chosen)} clips are too few to refit motion level edges by flow")
        scorer = scorer_for(settings)
        scopes = [scorer.score(read_video(manifest.video_path(r))[0])
                  for r in tqdm(chosen, desc="motion calibration", disable=not progress, leave=False)]
        edges = fit_motion_bins(scopes)
        info["edges_from"] = (f"refitted by flow on {len(chosen)} training clips (the meta's levels measure "
                              f"{motion.get('method', 'something else')})")
    info |= {**settings.to_meta(), "edges": edges}
    return LevelMeter(settings, edges, info)


# --------------------------------------------------------------------------------------------
# Scoring one turn
# --------------------------------------------------------------------------------------------


def match_clip(truth: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``truth`` (T', H', W', 3) resampled to the frame count (evenly spaced) and size (area filter) of ``like``."""
    import cv2

    frames = truth[sample_frame_indices(len(truth), len(like))]
    if len(frames) < len(like):  # a shorter real clip: repeat its last frame
        frames = np.concatenate([frames, np.repeat(frames[-1:], len(like) - len(frames), axis=0)])
    h, w = like.shape[1:3]
    if frames.shape[1:3] != (h, w):
        frames = np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA) for f in frames])
    return np.ascontiguousarray(frames)


@dataclass
class MetricTools:
    """The scorers shared by all systems, and why a missing one is missing."""

    clip: CLIPScorer | None = None
    dreamsim: object | None = None  # DreamSimScorer
    dreamsim_reason: str = ""
    meter: LevelMeter | None = None
    meter_reason: str = ""
    reference: str = ""  # "truth" | "characters" | ""
    registry: object | None = None  # CharacterRegistry
    reference_images: dict[str, np.ndarray] = field(default_factory=dict)

    def references(self, character: str) -> np.ndarray | None:
        if self.registry is None:
            return None
        if character not in self.reference_images:
            name = self.registry.canonical(character)
            if name is None:
                return None
            images = self.registry.load_images(name, max_side=448)
            # CLIP's transform resizes each image; stacking needs one size, so each is letterboxed to a square
            self.reference_images[character] = np.stack([_square(image, 448) for image in images])
        return self.reference_images[character]


def _square(image: np.ndarray, side: int) -> np.ndarray:
    import cv2

    h, w = image.shape[:2]
    scale = side / max(h, w)
    resized = cv2.resize(image, (max(1, round(w * scale)), max(1, round(h * scale))), interpolation=cv2.INTER_AREA)
    out = np.full((side, side, 3), 255, np.uint8)
    top, left = (side - resized.shape[0]) // 2, (side - resized.shape[1]) // 2
    out[top : top + resized.shape[0], left : left + resized.shape[1]] = resized
    return out


def settings_for(renders: bool, tools: MetricTools, frames_per_clip: int, clip_scale: float) -> MetricSettings:
    """The settings recorded with every record of one system."""
    if not renders:
        return MetricSettings(flow={"levels": "predicted", "why": "the system renders no clip"})
    reference = {
        "truth": "ground-truth clip of the turn, resampled to the generated frames and size (pairing=paired)",
        "characters": "character reference images of the registry (pairing=all)",
    }.get(tools.reference, "")
    flow = tools.meter.info if tools.meter else {"levels": "predicted", "why": tools.meter_reason}
    return MetricSettings(
        clip_model=tools.clip.name if tools.clip else "", clip_scale=clip_scale, clip_frames=frames_per_clip,
        reference=reference, dreamsim=tools.dreamsim.name if tools.dreamsim else f"missing: {tools.dreamsim_reason}",
        flow=flow,
    )


def score_turn(output: TurnOutput, truth: ShotTags, truth_frames: np.ndarray | None,
               references: np.ndarray | None, tools: MetricTools) -> tuple[dict[str, float | None], dict[str, str]]:
    """The metric values of one turn, and the reason for each metric left out."""
    values: dict[str, float | None] = {"seconds": output.seconds}
    missing: dict[str, str] = {}
    frames = output.frames
    if frames is None:
        for name in ("clip_i", "dreamsim", "clip_t", "psnr", "ssim"):
            missing[name] = "the system renders no clip"
    else:
        values["clip_t"] = tools.clip.clip_t(frames, output.instruction)
        matched = match_clip(truth_frames, frames) if truth_frames is not None else None
        reference, pairing = (matched, "paired") if matched is not None else (references, "all")
        if reference is None:
            why = "no ground-truth clip and no character reference images (set characters=registry.json)"
            missing["clip_i"] = missing["dreamsim"] = why
        else:
            values["clip_i"] = tools.clip.clip_i(frames, reference, pairing=pairing)
            if tools.dreamsim is not None:
                values["dreamsim"] = tools.dreamsim.distance(frames, reference, pairing=pairing)
            else:
                missing["dreamsim"] = tools.dreamsim_reason
        if matched is not None:
            values["psnr"], values["ssim"] = psnr(frames, matched), ssim(frames, matched)
        else:
            missing["psnr"] = missing["ssim"] = "no ground-truth clip"
    level = None
    if frames is not None and tools.meter is not None:
        level = tools.meter.level(frames)
    elif output.motion_level is not None:
        level = output.motion_level
    if level is not None:
        values |= motion_level_metrics([level], [truth.values.motion_level])
    else:
        missing["acc_f"] = missing["mae_f"] = "no clip and no predicted motion level"
    if output.values is not None:
        values |= state_metrics([output.values], [truth.values])
        values["acc_level"] = float(output.values.motion_level == truth.values.motion_level)
    else:
        missing["acc_s"] = missing["mae_s"] = "the system predicts no character state"
    return values, missing


# --------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------


@dataclass
class EvalResult:
    records: dict[str, list[MetricRecord]]  # system -> its records, in game and turn order
    summaries: list[MetricSummary]
    files: dict[str, Path]


def _tools(cfg: EvalConfig, games: list[BenchmarkGame], renders: bool, manifest: Manifest | None,
           progress: bool) -> MetricTools:
    tools = MetricTools()
    if not renders:
        return tools
    device = "cuda" if cfg.inference.device != "cpu" and torch.cuda.is_available() else "cpu"
    tools.clip = CLIPScorer.from_config(cfg.metrics_clip, scale=cfg.clip_scale, frames_per_clip=cfg.frames_per_clip,
                                        device=device)
    tools.dreamsim, tools.dreamsim_reason = try_dreamsim(cfg.dreamsim_path, frames_per_clip=cfg.frames_per_clip,
                                                         device=device)
    if manifest is not None:
        tools.meter = build_level_meter(manifest, cfg.motion_calibration_clips, progress)
    else:
        tools.meter_reason = "no motion_manifest: generated clips are not measured"
    if all(isinstance(g, GroundTruthGame) and g.has_clips() for g in games):
        tools.reference = "truth"
    elif cfg.characters:

        tools.registry = read_character_registry(cfg.characters)
        tools.reference = "characters"
    return tools


def _judge_record(judge, system: str, game: BenchmarkGame, outputs: list[TurnOutput], references,
                  settings: MetricSettings) -> MetricRecord:

    try:
        judgement = judge.judge(game.game_id, game.character, [o.instruction for o in outputs],
                                [o.frames for o in outputs], references)
    except LLMError as exc:  # one unreachable answer costs this game's judgement, not the evaluation
        judgement = Judgement(game.game_id, None, 0, [f"backend error: {exc}"])
    return judgement.to_record(system, settings)


def _score_game(name: str, game: BenchmarkGame, outputs: list[TurnOutput], tools: MetricTools, judge,
                settings: MetricSettings) -> list[MetricRecord]:
    """The records of one game played by system ``name``: one per turn, and the judge's (if any)."""
    references = tools.references(game.character) if tools.reference == "characters" else None
    records = []
    for turn, (output, shot) in enumerate(zip(outputs, game.shots, strict=True)):
        truth = game.clip_frames(turn) if tools.reference == "truth" and output.frames is not None else None
        values, missing = score_turn(output, shot, truth, references, tools)
        cast = game.cast(turn) if isinstance(game, GroundTruthGame) else None
        if cast is not None:  # a SpriteWorld turn: who is drawn
            if output.frames is not None:
                values |= cast.score(output.frames)
            else:
                missing |= dict.fromkeys(IDENTITY_COLUMNS, "the system renders no clip")
        records.append(MetricRecord(name, game.game_id, turn, values, missing, settings))
    if judge is not None and all(o.frames is not None for o in outputs):
        records.append(_judge_record(judge, name, game, outputs, references, settings))
    return records


def evaluate(cfg: EvalConfig, progress: bool = True) -> EvalResult:
    """Play every game with every system of ``cfg``, score every turn, write results, tables and plots."""

    unknown = [s for s in cfg.systems if s not in SYSTEMS]
    if unknown or not cfg.systems:
        raise ValueError(f"systems={cfg.systems}: choose from {list(SYSTEMS)}")
    if cfg.render_batch < 1 or cfg.clip_games < -1:
        raise ValueError(f"render_batch={cfg.render_batch} must be 1 or more and clip_games={cfg.clip_games} "
                         "-1 (all), 0 (none) or more")
    games = load_games(cfg.benchmark, cfg.max_games)
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out / "config.yaml", to_yaml(cfg))
    manifest = read_manifest(cfg.motion_manifest) if cfg.motion_manifest else None
    train = training_clips(manifest) if manifest is not None else []
    renders = any(s in RENDERING for s in cfg.systems)
    tools = _tools(cfg, games, renders, manifest, progress)
    judge = None
    if cfg.judge.backend:

        judge = LLMJudge.from_config(cfg.judge)

    records: dict[str, list[MetricRecord]] = {}
    results_path = out / RESULTS_FILE
    for name in cfg.systems:
        system = build_system(name, cfg, train)
        settings = settings_for(name in RENDERING, tools, cfg.frames_per_clip, cfg.clip_scale)
        system_records: list[MetricRecord] = []
        shutil.rmtree(out / "clips" / name, ignore_errors=True)  # no clips of an earlier evaluation beside these
        turns = sum(len(g) for g in games)
        with tqdm(total=turns, desc=name, unit="turn", disable=not progress) as bar:
            # render_batch games at a time: their clips render in batches of render_batch (1: game by game)
            for first in range(0, len(games), cfg.render_batch):
                group = games[first : first + cfg.render_batch]
                dirs = [out / "clips" / name / game.game_id if cfg.clip_games < 0 or first + i < cfg.clip_games
                        else None for i, game in enumerate(group)]
                for game, outputs in zip(group, system.play_games(group, dirs, cfg.render_batch), strict=True):
                    if len(outputs) != len(game):
                        raise RuntimeError(f"{name} played {len(outputs)} turns of {game.game_id}, "
                                           f"expected {len(game)}")
                    system_records += _score_game(name, game, outputs, tools, judge, settings)
                    bar.update(len(game))
                    bar.set_postfix(s_per_turn=f"{np.mean([o.seconds for o in outputs]):.2f}")
        records[name] = system_records
        # rewritten after every system, so a later system's failure keeps the finished ones
        atomic_write_jsonl(results_path, [r.to_dict() for done in records.values() for r in done])
        del system
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    summaries = [summarize(records[name]) for name in cfg.systems]
    files = {"results": results_path, "summary": out / SUMMARY_FILE}
    atomic_write_json(files["summary"], {
        "benchmark": cfg.benchmark, "games": [g.game_id for g in games], "turns": sum(len(g) for g in games),
        "systems": {s.system: s.to_dict() for s in summaries},
    })
    files["table_md"], files["table_csv"] = write_table(out / "table", [(s.system, s) for s in summaries],
                                                        title=f"{len(games)} games from {cfg.benchmark}")
    files["plot"] = plot_per_turn(records, out / "per_turn.png")
    splits = turn_splits(games)
    rows = interval_rows(records, splits) + difference_rows(cfg.systems[0], records, splits)
    interval_files = write_interval_table(out / "table_intervals", rows,
                                          title=f"{len(games)} games from {cfg.benchmark}")
    files |= {f"intervals_{kind}": path for kind, path in interval_files.items()}
    return EvalResult(records, summaries, files)


def read_results(path: str | Path) -> dict[str, list[MetricRecord]]:
    """Records of a results.jsonl, grouped by system in file order."""
    grouped: dict[str, list[MetricRecord]] = {}
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                record = MetricRecord.from_dict(json.loads(line))
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a metric record ({exc})") from None
            grouped.setdefault(record.system, []).append(record)
    if not grouped:
        print(f"warning: {path} holds no records", file=sys.stderr)
    return grouped
