"""Agreement with the teacher: how close each fast sampler's clips come to the guided multi-step teacher's.

    result = teacher_agreement(teacher, students, conditions, teacher_sampling, undistilled=(1, 2, 4),
                               caches=("first_block", "magcache"))
    write_agreement(result, "outputs/agreement")        # teacher_agreement.json + .md, atomically

Stage (d) trains a student to land where the teacher's guided ODE lands from the same noise, so the measure of a
few-step sampler that stage optimises is its distance to the teacher's clip from the same noise and condition (the
eval harness measures the distance to the real clips instead). Every sampler gets, per condition (a turn of a
held-out game: the MLLM's shot representation and motion level), the same seeded Gaussian noise:

    teacher          the adapted decoder with the teacher's sampler: N guided DDIM steps with its dynamic CFG (what
                     the students' sampler.json records), 2 transformer calls per guided step
    distilled K      a stage (d) student's own K-step sampler: K conditional calls
    undistilled K    the teacher's decoder at the K timesteps a K-step student samples at, no CFG: K calls
    cache <method>   the teacher's sampler with one of diffusers' cache hooks (animegamer.sampling.cache)

Each row reports transformer calls per turn (batch-B units: a guided call counts 2, counted by a forward hook), the
relative L2 of its final latents to the teacher's and the PSNR / SSIM of its decoded frames to the teacher's frames,
means with 95 % bootstrap intervals over games (animegamer.eval.intervals); the teacher row is the reference and
has none. For each K with both a student and an undistilled row, the paired PSNR gain of distillation (per turn,
student minus undistilled, resampled by game) says whether training beat simply taking fewer steps.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from animegamer.bench.options import WorkCounter, distilled_timesteps
from animegamer.config import SamplingConfig
from animegamer.eval.intervals import bootstrap_interval
from animegamer.eval.metrics import psnr, ssim
from animegamer.io import atomic_write_json, atomic_write_text
from animegamer.sampling.cache import MagRatios, TransformerCache, calibrate_mag_ratios
from animegamer.sampling.denoise import sample
from animegamer.sampling.fewstep import FewStepSampler, fewstep_sample

RESULT_NAME = "teacher_agreement"
TEACHER_FIELDS = ("steps", "scheduler", "guidance_scale", "dynamic_cfg", "dynamic_cfg_exponent",
                  "guidance_steps_fraction")
METRICS = ("rel_l2", "psnr", "ssim")


@dataclass(frozen=True)
class Condition:
    """One turn to render: game index, turn index, s_a (N, H), motion level, the noise seed every sampler shares."""

    game: int
    turn: int
    shot: torch.Tensor
    level: int
    seed: int


@dataclass(frozen=True)
class Row:
    """One sampler of the table: ``sample(s_a (1, N, H), levels (1,), generator) -> latents`` on ``decoder``, with
    the cache ``method`` installed on it while it runs (None: no cache)."""

    name: str
    kind: str  # teacher | distilled | undistilled | cache
    steps: int
    decoder: torch.nn.Module
    sample: Callable[[torch.Tensor, torch.Tensor, torch.Generator], torch.Tensor]
    cache: str | None = None


@dataclass
class Student:
    """A stage (d) checkpoint: its decoder (loaded) and its few-step sampler (sampler.json)."""

    path: str
    decoder: torch.nn.Module
    sampler: FewStepSampler


def teacher_sampling(sampling: SamplingConfig, students: list[Student]) -> SamplingConfig:
    """The teacher's sampler: ``sampling`` with the teacher record of the students' sampler.json (all must agree),
    or ``sampling`` as it is (plain preset, no cache) without students. ValueError names a disagreement."""
    records = {s.path: {k: s.sampler.teacher[k] for k in TEACHER_FIELDS if k in s.sampler.teacher} for s in students}
    distinct = {tuple(sorted(r.items())) for r in records.values()}
    if len(distinct) > 1:
        raise ValueError(f"the students were distilled from different teacher samplers: {records}")
    fields = next(iter(records.values())) if records else {}
    return dataclasses.replace(sampling, preset="standard", cache="none", **fields)


def _noise(decoder, sampling: SamplingConfig, generator: torch.Generator) -> torch.Tensor:
    """Gaussian latents (1, F, C, h, w), drawn as sampling.denoise.sample and PresetSampler draw them from
    ``generator``."""
    shape = (1, *decoder.latent_shape(sampling.num_frames, sampling.height, sampling.width))
    return torch.randn(shape, generator=generator, device=generator.device)


def _render(decoder, sample: Callable, conditions: list[Condition], tick: Callable[[], None]
            ) -> Iterator[tuple[float, torch.Tensor, np.ndarray]]:
    """(transformer calls, final latents (1, F, C, h, w) on the CPU, frames (T, H, W, 3) uint8) per condition."""
    counter = WorkCounter(decoder.transformer, 1)
    try:
        for c in conditions:
            counter.reset()
            with torch.no_grad():
                latents = sample(c.shot[None].to(decoder.dtype), torch.tensor([c.level]),
                                 torch.Generator().manual_seed(c.seed))
                frames = decoder.decode_latents(latents)[0].numpy()
            tick()
            yield counter.calls, latents.float().cpu(), frames
    finally:
        counter.remove()


def _interval(per_game: dict[int, list[float]]) -> dict:
    mean, low, high = bootstrap_interval([per_game[g] for g in sorted(per_game)])
    return {"mean": mean, "low": low, "high": high}


def teacher_agreement(
    teacher,
    students: list[Student],
    conditions: list[Condition],
    sampling: SamplingConfig,
    undistilled: tuple[int, ...] = (1, 2, 4),
    caches: tuple[str, ...] = (),
    magcache_ratios: MagRatios | None = None,
    progress: Callable[[], None] = lambda: None,
) -> dict:
    """Render ``conditions`` with every row (module docstring) and compare with the teacher; ``sampling``: the
    teacher's sampler (:func:`teacher_sampling`). ``magcache`` uses ``magcache_ratios`` or, without them, ratios
    calibrated first on the first game's conditions (recorded in the result)."""
    if not conditions:
        raise ValueError("no conditions to render")

    def guided(shot, level, g):
        return sample(teacher, shot, level, sampling, generator=g, decode=False)

    rows = [Row("teacher", "teacher", sampling.steps, teacher, guided)]
    by_steps = {s.sampler.steps: s for s in students}
    for student in sorted(students, key=lambda s: -s.sampler.steps):
        rows.append(Row(f"distilled {student.sampler.steps}", "distilled", student.sampler.steps, student.decoder,
                        lambda shot, level, g, s=student: fewstep_sample(s.decoder, shot, level, s.sampler,
                                                                         _noise(s.decoder, sampling, g))))
    for k in sorted(undistilled, reverse=True):
        # a student's own timesteps where there is one of K steps, else those a K-step student would learn
        times = by_steps[k].sampler.timesteps if k in by_steps else distilled_timesteps(teacher, sampling.steps, k)
        plain = FewStepSampler(tuple(times))
        rows.append(Row(f"undistilled {k}", "undistilled", k, teacher,
                        lambda shot, level, g, p=plain: fewstep_sample(teacher, shot, level, p,
                                                                       _noise(teacher, sampling, g))))
    rows += [Row(f"cache {method}", "cache", sampling.steps, teacher, guided, method) for method in caches]

    calibration = None
    reference: list[tuple[torch.Tensor, np.ndarray]] = []
    result_rows = {}
    for spec in rows:
        cache = None
        if spec.cache is not None:
            ratios = None
            if spec.cache == "magcache":
                if magcache_ratios is None:
                    first = [c for c in conditions if c.game == conditions[0].game]
                    per_clip = calibrate_mag_ratios(teacher.transformer, sampling.steps, [
                        lambda c=c: sample(teacher, c.shot[None].to(teacher.dtype), torch.tensor([c.level]), sampling,
                                                   generator=torch.Generator().manual_seed(c.seed), decode=False)
                        for c in first])
                    magcache_ratios = MagRatios(tuple(sum(col) / len(col) for col in zip(*per_clip, strict=True)))
                    calibration = {"calibrated_on": f"game {conditions[0].game}: {len(first)} turns (also evaluated)"}
                ratios = magcache_ratios
            cache = TransformerCache(teacher.transformer, spec.cache, sampling.cache_threshold, mag_ratios=ratios)
        per_turn, per_game = [], {m: {} for m in METRICS}
        try:
            for i, (calls, latents, frames) in enumerate(_render(spec.decoder, spec.sample, conditions, progress)):
                c = conditions[i]
                turn = {"game": c.game, "turn": c.turn, "transformer_calls": calls}
                if spec.kind == "teacher":
                    reference.append((latents, frames))
                else:
                    ref_latents, ref_frames = reference[i]
                    turn.update(rel_l2=float((latents - ref_latents).norm() / ref_latents.norm()),
                                psnr=psnr(frames, ref_frames), ssim=ssim(frames, ref_frames))
                    for m in METRICS:
                        per_game[m].setdefault(c.game, []).append(turn[m])
                per_turn.append(turn)
        finally:
            if cache is not None:
                cache.remove()
        row = {"kind": spec.kind, "steps": spec.steps,
               "transformer_calls_per_turn": float(np.mean([t["transformer_calls"] for t in per_turn])),
               "per_turn": per_turn}
        if spec.kind == "teacher":
            row["note"] = "the reference: PSNR to itself is infinite, not reported"
        else:
            row.update({m: _interval(per_game[m]) for m in METRICS})
        result_rows[spec.name] = row

    paired = {}
    for k in sorted(set(by_steps) & set(undistilled)):
        gains: dict[int, list[float]] = {}
        for a, b in zip(result_rows[f"distilled {k}"]["per_turn"], result_rows[f"undistilled {k}"]["per_turn"],
                        strict=True):
            if math.isfinite(a["psnr"]) and math.isfinite(b["psnr"]):
                gains.setdefault(a["game"], []).append(a["psnr"] - b["psnr"])
        if gains:
            paired[f"distilled {k} - undistilled {k}"] = _interval(gains)
    return {
        "rows": result_rows,
        "paired_psnr_gain_db": paired,
        "teacher_sampling": {k: getattr(sampling, k) for k in TEACHER_FIELDS},
        "students": {f"distilled {s.sampler.steps}": {"checkpoint": s.path, "timesteps": list(s.sampler.timesteps)}
                     for s in students},
        "magcache": calibration or ({"ratios": "given"} if "magcache" in caches else None),
        "games": len({c.game for c in conditions}),
        "turns": len(conditions),
    }


def _cell(interval: dict, digits: int) -> str:
    low, high = interval["low"], interval["high"]
    bounds = f" [{low:.{digits}f}, {high:.{digits}f}]" if low is not None and high is not None else ""
    return f"{interval['mean']:.{digits}f}{bounds}"


def agreement_markdown(result: dict) -> str:
    t = result["teacher_sampling"]
    lines = [
        f"**Agreement with the teacher** ({result['turns']} turns of {result['games']} held-out games; teacher: "
        f"{t['steps']} {t['scheduler']} steps, CFG {t['guidance_scale']:g}"
        f"{' dynamic' if t['dynamic_cfg'] else ''}; the same noise per turn for every sampler), mean [95% bootstrap "
        "interval over games]:",
        "",
        "| sampler | transformer calls per turn | latents: relative L2 to the teacher ↓ | frames: PSNR to the teacher "
        "(dB) ↑ | SSIM to the teacher ↑ |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, row in result["rows"].items():
        calls = f"{row['transformer_calls_per_turn']:g}"
        if row["kind"] == "teacher":
            lines.append(f"| {name} (the reference) | {calls} | — | — | — |")
        else:
            lines.append(f"| {name} | {calls} | {_cell(row['rel_l2'], 3)} | {_cell(row['psnr'], 2)} | "
                         f"{_cell(row['ssim'], 3)} |")
    for name, gain in result["paired_psnr_gain_db"].items():
        lines.append(f"\nPaired PSNR gain, {name}: {_cell(gain, 2)} dB.")
    if result.get("magcache") and "calibrated_on" in result["magcache"]:
        lines.append(f"\nMagCache's ratios were calibrated on {result['magcache']['calibrated_on']}.")
    return "\n".join(lines) + "\n"


def _strict_json(value):
    """``value`` with every infinite or NaN float as the string "inf" / "-inf" / "nan" (strict JSON has none; the
    PSNR of identical frames is infinite)."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _strict_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_strict_json(v) for v in value]
    return value


def write_agreement(result: dict, out_dir: str | Path) -> tuple[Path, Path]:
    """``out_dir/teacher_agreement.json`` (every number, per turn) and ``.md`` (the table), atomically."""
    out = Path(out_dir)
    json_path, md_path = out / f"{RESULT_NAME}.json", out / f"{RESULT_NAME}.md"
    atomic_write_json(json_path, _strict_json(result))
    atomic_write_text(md_path, agreement_markdown(result))
    return json_path, md_path
