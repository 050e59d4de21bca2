"""Prepare a training set from your own films: 2 s clips, motion levels, captions, and the JSONL clip manifest.

    python scripts/prepare_data.py --config configs/prepare_data.yaml films=[/data/films] output_dir=data/myanime
    python scripts/prepare_data.py --config configs/prepare_data.yaml films=[/data/films] output_dir=data/myanime \\
        caption=true characters=data/myanime/characters.json captioner.backend.type=openai \\
        captioner.backend.base_url=http://127.0.0.1:8000/v1 captioner.backend.model=Qwen2.5-VL-7B-Instruct

The flow (animegamer/data/films.py, motion.py, captioning.py, characters.py):

  1. cut      every film (mp4/mkv/webm/avi/mov; files or directories) in a worker process (workers=N): black
              letterbox/pillarbox bars cropped, PySceneDetect ContentDetector scenes (scene_threshold), each scene
              cut from its start into back-to-back clips of clip_seconds at fps (clip_seconds * fps + 1 frames:
              17 at 2 s, 8 fps), centre-cropped to the height:width aspect and resized (never stretched);
              a scene's tail shorter than a clip is dropped, so no clip crosses a cut.
  2. motion   each clip's motion scope, in the same worker: mean optical-flow magnitude (flow=dis OpenCV DIS, or
              flow=raft with raft_weights on disk) of the pixels above flow_threshold (r = 0.2) x the pair's robust
              max (flow_robust_quantile).
  3. levels   motion_levels (5) quantile bins fitted on all clips; the edges and the flow settings go to
              clips.meta.json and are reused on later runs (refit_motion_bins=true refits), so new clips are
              scored the same way.
  4. caption  (caption=true) two steps per clip with a vision-language model (captioner.backend: an OpenAI-
              compatible endpoint or a local transformers directory): which registered characters appear
              (characters=JSON registry of reference images), then the tag line <S><MD><EV><ML><MA><SC><ET><ST>
              with <ML> = the computed level. Invalid answers are retried (captioner.max_attempts); a clip that
              stays invalid is kept with caption_status=invalid and no tags.

Writes output_dir/clips/<film_id>/<clip_index>.mp4, output_dir/clips.jsonl (+ clips.meta.json), the per-film
results output_dir/clips/<film_id>/film.json, and output_dir/prepare_report.json.

No clip crosses a cut: every clip is checked on its own frames before it is written (cut_check_threshold, a
colour-histogram change between two of its frames) and starts again after a cut the scene detector merged; the
report counts the cuts found and the clips moved or dropped for them.

Resumable: a film whose film.json matches the file's content (its size and a hash of bytes sampled through it, not
its path or mtime: touching or moving films re-cuts nothing) and the cut/motion settings is not cut again, and a
clip whose frames are unchanged keeps its caption, even when its film is re-cut; just run the same command again
(e.g. after adding films or after an interruption; Ctrl-C stops at once, exit code 130, keeping finished films).
No rerun reads its own clips as new films: an output_dir that is a films folder or lies inside one, a films folder
inside output_dir/clips, or a film inside output_dir/clips (symlinks followed) is refused before any work
(error: ..., exit 2). Films elsewhere in output_dir (output_dir/raw) are fine. An entry named like a film that is
not a regular file (a named pipe, a device, a symlink loop, a dangling link) is reported by path, counted as
skipped and never opened.
A corrupt or unreadable film is reported by path and skipped while the rest finish; it is tried again on the next
run. Decoder errors are counted per film: clips that would take a smeared frame are dropped, and a film with more
than max_decode_errors is skipped. The summary at the end (and prepare_report.json) counts films, scenes, clips,
captions, skipped films, the cut check and decoder errors per film.
One run per output_dir: a second prepare_data.py there is refused (error: ... naming its PID, exit 2); temp files
a killed run left are removed. SIGTERM stops a run as Ctrl-C does (exit 143), and the film workers never outlive
the main process (on Linux the kernel kills them with it, kill -9 included). A clip that cannot be written whole
(a full disk) is never published: its film is reported as skipped and the others go on. Rotation metadata (phone
footage) is applied; a film with frames over 8192 pixels a side or 8K UHD in area, or without a video stream, is
reported by path and skipped; film names that are not UTF-8 are stored and printed with \\x escapes.
Next step: scripts/precompute_features.py with data.manifest=output_dir/clips.jsonl.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import asdict, replace
from pathlib import Path

from tqdm import tqdm

from animegamer.cli import fail, hold_output_dir, parse_config
from animegamer.config import PrepareDataConfig
from animegamer.data.captioning import Captioner, caption_records
from animegamer.data.characters import RegistryError, read_character_registry
from animegamer.data.cuts import require_whole_frames
from animegamer.data.films import (
    FILM_RECORD,
    CutSettings,
    FilmJob,
    FilmResult,
    assign_film_ids,
    check_folders,
    find_films,
    init_worker,
    printable,
    process_film,
)
from animegamer.data.manifest import ClipRecord, meta_path, read_manifest, write_manifest
from animegamer.data.motion import MotionSettings, fit_motion_bins, motion_level
from animegamer.io import atomic_write_json
from animegamer.states import parse_tags


def content_key(path: Path, samples: int = 16, chunk: int = 1 << 16) -> str:
    """A film's identity: its size and a hash of ``samples`` chunks read evenly through it (a few MB at most).

    Not the path or the mtime, so touching a film or moving the folder keeps finished work; any edit that
    changes the size or the sampled bytes (re-encoding, a fixed download) re-cuts it.
    """
    size = path.stat().st_size
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    with path.open("rb") as handle:
        for i in range(samples):
            handle.seek(max(0, size - chunk) * i // max(1, samples - 1))
            digest.update(handle.read(chunk))
    return f"{size}:{digest.hexdigest()}"


def film_signature(path: Path, cut: CutSettings, motion: MotionSettings) -> dict:
    """What a finished film's results depend on; any change re-cuts the film."""
    return {"content": content_key(path), "cut": asdict(cut), "motion": motion.to_meta()}


def load_finished(film_dir: Path, signature: dict) -> dict | None:
    """The saved result of a film if it was finished with the same signature."""
    record_file = film_dir / FILM_RECORD
    if not record_file.is_file():
        return None
    try:
        saved = json.loads(record_file.read_text())
    except (json.JSONDecodeError, OSError):
        return None
    if not isinstance(saved, dict) or saved.get("signature") != signature:
        return None
    out = film_dir.parent.parent
    if not all((out / clip["video"]).is_file() for clip in saved.get("clips", [])):  # clips deleted since
        return None
    return saved


def cut_films(cfg: PrepareDataConfig, films: dict[str, Path], cut: CutSettings, motion: MotionSettings):
    """Stages 1-2 over all films; returns (per-film saved results, film ids cut in this run, skipped films).

    A KeyboardInterrupt stops the workers at once (they ignore SIGINT and are terminated): films finished so far
    have their film.json written and are kept.
    """
    out = Path(cfg.output_dir)
    done: dict[str, dict] = {}
    jobs: list[FilmJob] = []
    signatures: dict[str, dict] = {}
    for film_id, path in films.items():
        signatures[film_id] = film_signature(path, cut, motion)
        saved = load_finished(out / "clips" / film_id, signatures[film_id])
        if saved is not None:
            done[film_id] = {**saved, "source": printable(str(path))}  # the film may have moved
        else:
            jobs.append(FilmJob(str(path), film_id, str(out), cut, motion))
    if done:
        print(f"cut: {len(done)} film(s) already done, skipped: {', '.join(sorted(done))}")
    skipped: dict[str, str] = {}
    fresh: set[str] = set()

    def finish(result: FilmResult, bar: tqdm) -> None:
        bar.update()
        if result.error:
            skipped[result.source] = result.error
            bar.write(f"skipped {result.source}: {result.error}")
            return
        saved = {
            "signature": signatures[result.film_id],
            "source": result.source,
            "film_id": result.film_id,
            "scenes": result.scenes,
            "crop": result.crop,
            "info": result.info,
            "check": result.check,
            "decode_errors": result.decode_errors,
            "seconds": round(result.seconds, 3),
            "clips": [r.to_json() for r in result.records],
        }
        atomic_write_json(out / "clips" / result.film_id / FILM_RECORD, saved)
        done[result.film_id] = saved
        fresh.add(result.film_id)
        if result.decode_errors:
            bar.write(f"{result.source}: {result.decode_errors} decoder error(s); "
                      f"{result.check['dropped_for_decode_errors']} clip(s) with smeared frames dropped")
        bar.set_postfix_str(f"{result.film_id}: {len(result.scenes)} scenes, {len(result.records)} clips")

    with tqdm(total=len(jobs), desc="cut + motion", unit="film", disable=not jobs) as bar:
        if cfg.workers <= 1 or len(jobs) <= 1:
            for job in jobs:
                finish(process_film(job), bar)
        else:
            pooled_films(jobs, cfg.workers, lambda result: finish(result, bar))
    return done, fresh, skipped


def pooled_films(jobs: list[FilmJob], workers: int, on_result: Callable[[FilmResult], None]) -> None:
    """``on_result(process_film(job))`` for every job, run in worker processes, in the order films finish.

    A worker that dies (killed, e.g. out of memory) breaks the pool: the films not finished by then come back with
    ``error`` set (tried again on the next run) instead of the run hanging or ending in a traceback. An exception
    (Ctrl-C, also inside ``on_result``) terminates the workers at once instead of waiting for their films.
    """
    # spawn: fresh interpreters, no inherited OpenCV/torch thread pools or locks
    context = multiprocessing.get_context("spawn")
    pool = ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context, initializer=init_worker,
                               initargs=(os.getpid(),))  # workers die with this process, even on kill -9
    died = "not cut: a worker process died (killed, out of memory?)"
    try:
        futures = {pool.submit(process_film, job): job for job in jobs}
        for future in as_completed(futures):
            try:
                result = future.result()
            except BrokenProcessPool:
                result = FilmResult(futures[future].film_id, printable(futures[future].path), error=died)
            on_result(result)
    except BaseException:
        # the workers first (they ignore SIGINT): a worker still starting up reads its setup from the pool's pipe,
        # and closing the pool before it is gone made it print a traceback on the pipe's end of file
        for process in multiprocessing.active_children():
            process.terminate()
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown()


def assign_levels(cfg: PrepareDataConfig, records: list[ClipRecord], motion: MotionSettings) -> dict:
    """Stage 3: fit (or reuse) the bin edges and set every clip's motion level; returns the meta entry."""
    previous_file = meta_path(Path(cfg.output_dir) / "clips.jsonl")
    previous = json.loads(previous_file.read_text()).get("motion", {}) if previous_file.is_file() else {}
    reuse = (
        not cfg.refit_motion_bins
        and bool(previous.get("edges"))
        and previous.get("levels") == cfg.motion_levels
        and {k: previous.get(k) for k in motion.to_meta()} == motion.to_meta()
    )
    scores = [r.motion_scope for r in records if r.motion_scope is not None]
    if reuse:
        edges, fitted_on = previous["edges"], previous["fitted_on"]
        print(f"levels: reusing the stored bin edges {[round(e, 4) for e in edges]} (refit_motion_bins=true refits)")
    elif scores:
        edges, fitted_on = fit_motion_bins(scores, cfg.motion_levels), len(scores)
        rounded = [round(e, 4) for e in edges]
        print(f"levels: fitted {cfg.motion_levels} levels on {len(scores)} clips, edges {rounded}")
    else:
        return {**motion.to_meta(), "levels": cfg.motion_levels}
    for record in records:
        if record.motion_scope is not None:
            record.motion_level = motion_level(record.motion_scope, edges)
        if record.tags:  # a caption from an earlier run carries the level it was written with
            tags = parse_tags(record.tags, source=record.clip_id)
            if tags.values.motion_level != record.motion_level:
                record.tags = replace(tags, values=replace(tags.values, motion_level=record.motion_level)).render()
    return {**motion.to_meta(), "levels": cfg.motion_levels, "edges": edges, "fitted_on": fitted_on}


def caption_meta(cfg: PrepareDataConfig, registry) -> dict:
    backend = {k: v for k, v in cfg.captioner.backend.items() if k != "api_key"}
    return {
        "backend": backend,
        "num_frames": cfg.captioner.num_frames,
        "max_attempts": cfg.captioner.max_attempts,
        "characters": registry.names if registry is not None else [],
    }


class Terminated(KeyboardInterrupt):
    """SIGTERM (``kill``, ``docker stop``, systemd): the run stops as on Ctrl-C, its workers with it."""


def _terminate(signum, frame) -> None:
    raise Terminated


def main(argv: list[str] | None = None) -> dict:
    cfg, _ = parse_config(PrepareDataConfig, __doc__, argv)
    previous = signal.signal(signal.SIGTERM, _terminate)
    try:
        return prepare(cfg)
    except KeyboardInterrupt as exc:
        how = "terminated" if isinstance(exc, Terminated) else "interrupted"
        print(f"{how}: finished films and captions are kept; run the same command again to resume", file=sys.stderr)
        raise SystemExit(143 if isinstance(exc, Terminated) else 130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def carry_captions(records: list[ClipRecord], earlier: list[ClipRecord], fresh: set[str]) -> None:
    """Give each new record the caption of an earlier clip with the same frames (``extra["frames_hash"]``);
    clips of films not re-cut in this run also match by clip id (manifests written before clips had hashes)."""
    by_hash = {r.extra["frames_hash"]: r for r in earlier if r.caption_status and r.extra.get("frames_hash")}
    by_id = {r.clip_id: r for r in earlier if r.caption_status and r.film_id not in fresh}
    for record in records:
        old = by_hash.get(record.extra.get("frames_hash")) or by_id.get(record.clip_id)
        if old is not None:
            record.tags, record.caption_status = old.tags, old.caption_status
            record.extra = {**old.extra, **record.extra}


def prepare(cfg: PrepareDataConfig) -> dict:
    started = time.perf_counter()
    out = Path(cfg.output_dir)

    # Everything that can be wrong with the config fails here, before hours of cutting.
    if not cfg.films:
        fail("no films given: set films=[path/to/film.mkv,path/to/dir]")
    try:
        found, unusable = find_films(cfg.films)
        check_folders(cfg.films, found, out)
        films = assign_film_ids(found)
        motion = MotionSettings.from_config(cfg)
    except (FileNotFoundError, ValueError) as exc:
        fail(str(exc))
    if not films:
        fail(f"no film files found in {cfg.films}" + (f" ({len(unusable)} not regular files)" if unusable else ""))
    cut = CutSettings.from_config(cfg)
    if cut.frames_per_clip < 2:
        fail(f"clip_seconds={cfg.clip_seconds} at fps={cfg.fps} gives {cut.frames_per_clip} frame(s) per clip; "
             "a clip needs at least 2")
    try:
        require_whole_frames(cut)
    except ValueError as exc:
        fail(str(exc))
    registry = captioner = None
    if cfg.caption:
        try:
            registry = read_character_registry(cfg.characters) if cfg.characters else None
            captioner = Captioner.from_config(cfg.captioner, registry)
        except (RegistryError, ValueError, FileNotFoundError) as exc:
            fail(str(exc))
    print(f"prepare_data: {len(films)} film(s) -> {out} ({cut.height}x{cut.width}, {cut.fps} fps, "
          f"{cut.frames_per_clip} frames per {cut.clip_seconds:g} s clip, flow={motion.method})")
    # one run per output_dir; the clip folders' temp files of a killed run go (output_dir/clips/<film_id>/)
    with hold_output_dir(out, temp_depth=2):
        return run(cfg, films, {printable(k): v for k, v in unusable.items()}, cut, motion, registry, captioner,
                   started)


def run(cfg: PrepareDataConfig, films: dict[str, Path], unusable: dict[str, str], cut: CutSettings,
        motion: MotionSettings, registry, captioner, started: float) -> dict:
    """Stages 1-4 and the summary, once ``prepare`` checked the settings and holds ``output_dir``."""
    out = Path(cfg.output_dir)
    manifest_file = out / "clips.jsonl"
    # 1-2. cut + motion, one worker per film.
    done, fresh, skipped = cut_films(cfg, films, cut, motion)
    skipped = {**unusable, **skipped}

    # Captions of unchanged clips carry over from the previous manifest, also into re-cut films.
    records = [ClipRecord(**data) for film_id in films for data in done.get(film_id, {}).get("clips", [])]
    if manifest_file.is_file():
        carry_captions(records, read_manifest(manifest_file).records, fresh)

    # 3. motion levels.
    meta = {"motion": assign_levels(cfg, records, motion), "cut": asdict(cut)}
    meta["films"] = {film_id: done[film_id]["source"] for film_id in films if film_id in done}
    write_manifest(manifest_file, records, meta)

    # 4. captions, saved as they come so an interruption loses little.
    captions = {"ok": 0, "invalid": 0, "failed": 0}
    if captioner is not None:
        meta["caption"] = caption_meta(cfg, registry)
        todo = sum(1 for r in records if not r.caption_status and r.motion_level is not None)
        workers = 1 if cfg.captioner.backend.get("type") == "transformers" else cfg.captioner.workers
        with tqdm(total=todo, desc="caption", unit="clip", disable=not todo) as bar:
            completed = [0]

            def on_result(record, result, error):
                if error:
                    bar.write(f"caption failed, will retry next run: {error}")
                elif result.status == "invalid":
                    bar.write(f"caption invalid after {result.attempts} calls: {record.clip_id}: {result.error}")
                completed[0] += 1
                if completed[0] % 25 == 0:
                    write_manifest(manifest_file, records, meta)
                bar.update()

            try:
                captions = caption_records(captioner, records, out, workers, on_result)
            finally:  # also on Ctrl-C: the captions received so far are kept
                write_manifest(manifest_file, records, meta)

    # Summary.
    status = [r.caption_status for r in records]
    checks = {f: {**done[f].get("check", {}), "decode_errors": done[f].get("decode_errors", 0)} for f in done}
    summary = {
        "films": len(films) + len(unusable),
        "films_cut": len(fresh),
        "films_already_done": len(done) - len(fresh),
        "films_skipped": len(skipped),
        "scenes": sum(len(done[f]["scenes"]) for f in done),
        "clips": len(records),
        "captions_ok": status.count("ok"),
        "captions_invalid": status.count("invalid"),
        "captions_failed_this_run": captions["failed"],
        "uncaptioned": status.count(""),
        "cuts_found_in_clips": sum(len(c.get("cuts_found", [])) for c in checks.values()),
        "clips_moved_for_cuts": sum(c.get("moved", 0) for c in checks.values()),
        "clips_dropped_for_cuts": sum(c.get("dropped_for_cuts", 0) for c in checks.values()),
        "decode_errors": sum(c["decode_errors"] for c in checks.values()),
        "clips_dropped_for_decode_errors": sum(c.get("dropped_for_decode_errors", 0) for c in checks.values()),
        "seconds": round(time.perf_counter() - started, 2),
        "manifest": str(manifest_file),
        "skipped": skipped,
        "per_film": checks,  # the cut check and decoder errors of every finished film
    }
    atomic_write_json(out / "prepare_report.json", summary)
    print(
        f"done in {summary['seconds']:.1f} s: {summary['films']} films ({summary['films_cut']} cut now, "
        f"{summary['films_already_done']} already done, {summary['films_skipped']} skipped), "
        f"{summary['scenes']} scenes, {summary['clips']} clips; cut check: {summary['cuts_found_in_clips']} cuts "
        f"inside planned clips, {summary['clips_moved_for_cuts']} clips moved, {summary['clips_dropped_for_cuts']} "
        f"dropped; {summary['decode_errors']} decoder errors"
        + (f", captions {summary['captions_ok']} ok / {summary['captions_invalid']} invalid / "
           f"{summary['uncaptioned']} not captioned" if cfg.caption else "")
    )
    for source, error in skipped.items():
        print(f"  skipped {source}: {error}")
    print(f"manifest: {manifest_file}")
    return summary


if __name__ == "__main__":
    main()
