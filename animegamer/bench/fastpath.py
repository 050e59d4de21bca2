"""The half-second turn: a whole game turn on the fast path, eager and compiled, bf16 and FP8, with the CogVideoX VAE
or the stage (e) small decoder, part by part and end to end.

    result = bench_fast_path(decoder, mllm, small, FastPathSettings(sampling, history_turns=3), device)

Every row plays the game's own turn, :meth:`animegamer.game.turn.AnimeGamer.play_turn` (the core's
:class:`MLLMPredictor` and :class:`DecoderRenderer`, no file written): the MLLM's prefill + state decoding with K
history turns, the 4-step distilled student (the stage (d) student's timesteps; random weights, so a speed figure
only), then the streamed decode to uint8 frames on the host. Rows:

    eager                       LoRA merged, nothing compiled; the MLLM's static KV cache (``mllm.kv_cache``)
    eager, dynamic MLLM cache   the same with the MLLM's dynamic cache (transformers', the turn before the static
                                one): the host syncs it adds
    compiled                    the transformer blocks and the small decoder's memory blocks under torch.compile
                                (regional, static shapes)
    compiled, MLLM compiled     and the MLLM's static turn compiled (animegamer.models.mllm_static: the prefill with
                                a dynamic length, the state steps in CUDA graphs on a GPU)
    compiled, fp8 tensor large  the inference option ``fp8``: the transformer's large linears (attention q/k/v/out,
                                feed-forward) in FP8 with one scale per tensor, the AdaLN modulation linears in bf16
                                (animegamer.models.fp8), compiled
    eager, fp8 tensor large     the same eagerly (torchao's FP8 pays off only under torch.compile)
    compiled, fp8 row all       every block linear, one scale per row (torchao's finer scaling), compiled

FP8 rows need a CUDA GPU of capability >= 8.9 and torchao; compiled rows need ``compile``. Each row starts from a
fresh copy of the bf16 transformer.

Per row: the MLLM and its host synchronisations per turn (:class:`animegamer.bench.syncs.HostSyncCounter`; on a GPU
also ``torch.cuda.set_sync_debug_mode``'s count), the denoising, the decode with the small decoder and its first chunk,
the whole turn timed end to end (play_turn, small decoder), the time to the first frames (MLLM + denoising + the small
decoder's first chunk), the GPU peak during the turn, the denoising's MFU, and how far the row's latents are from the
eager row's (relative L2: compile is the same arithmetic, FP8 is not). The VAE's decode (the same in every row) and
writing the clip (mp4 + gif, which the game does off the turn's critical path) are timed once beside the rows.
"""

from __future__ import annotations

import copy
import dataclasses
import resource
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from animegamer.bench.options import distilled_timesteps, time_writing
from animegamer.bench.syncs import HostSyncCounter, cuda_sync_warnings
from animegamer.bench.timing import PeakMemory, count_flops, measure
from animegamer.bench.turn import INSTRUCTIONS, make_history, relative_difference
from animegamer.config import SamplingConfig
from animegamer.game.predictor import MLLMPredictor
from animegamer.game.renderer import DecoderRenderer
from animegamer.game.turn import AnimeGamer, Turn
from animegamer.io import atomic_write_text
from animegamer.models.fp8 import fp8_unavailable, quantize_transformer_fp8
from animegamer.models.mllm_static import compile_static_turn, uncompile_static_turn
from animegamer.sampling.fewstep import FewStepSampler
from animegamer.sampling.presets import PresetSampler, effective_sampling
from animegamer.states import CharacterState

MOTION_LEVEL = 3


@dataclass
class FastPathSettings:
    sampling: SamplingConfig
    history_turns: int = 3
    warmup: int = 2
    repeats: int = 5
    compile: bool = True  # the compiled rows
    compile_backend: str = "inductor"  # aot_eager: the compiled rows' structure on a CPU in seconds
    seed: int = 0
    rows: tuple[str, ...] = ()  # the rows to run by name; empty: all (each compiled row compiles for a minute or two)
    student_steps: int = 4  # the student's calls per clip (configs/stage_d.yaml: 4)


@dataclass(frozen=True)
class Row:
    name: str
    compiled: bool
    fp8: str = ""  # "" | "tensor large" | "row all"
    mllm: str = "static"  # the MLLM's turn: static | dynamic (its KV cache) | compiled (the static turn compiled)


ROWS = (
    Row("eager", False),
    Row("eager, dynamic MLLM cache", False, mllm="dynamic"),
    Row("compiled", True),
    Row("compiled, MLLM compiled", True, mllm="compiled"),
    Row("compiled, fp8 tensor large", True, "tensor large"),
    Row("eager, fp8 tensor large", False, "tensor large"),
    Row("compiled, fp8 row all", True, "row all"),
)


def rows_to_run(device, compile: bool, names: tuple[str, ...] = ()) -> tuple[list[Row], list[str]]:
    """The rows this device and these settings can run (only ``names``, when given), and why each other one is
    skipped. ValueError for a name that is not a row."""
    unknown = [n for n in names if n not in {row.name for row in ROWS}]
    if unknown:
        raise ValueError(f"no fast_path row {unknown}: the rows are {[row.name for row in ROWS]}")
    problem = fp8_unavailable(device)
    run, skipped = [], []
    for row in ROWS:
        if names and row.name not in names:
            skipped.append(f"{row.name}: not asked for")
        elif row.compiled and not compile:
            skipped.append(f"{row.name}: compile=false")
        elif row.fp8 and problem:
            skipped.append(f"{row.name}: {problem}")
        else:
            run.append(row)
    return run, skipped


def history_turns(num_turns: int, num_slots: int, shot_dim: int, seed: int) -> list[Turn]:
    """``num_turns`` earlier turns (random shots, fixed values) as the game keeps them."""
    return [
        Turn(index=i, instruction=h.instruction, values=h.values, state=CharacterState(), shot_embeds=h.shot_embeds,
             prompt_tokens=0)
        for i, h in enumerate(make_history(num_turns, num_slots, shot_dim, seed))
    ]


def _prepare(decoder, renderer: DecoderRenderer, pristine: tuple, row: Row, backend: str, mllm) -> int:
    """Put fresh copies of the bf16 transformer and the small decoder in place, convert the transformer to FP8 and
    compile what ``row`` asks for (the MLLM's turn too); returns the number of FP8 linears."""
    torch._dynamo.reset()  # the previous row's graphs hold its modules
    uncompile_static_turn(mllm)
    mllm.kv_cache = "dynamic" if row.mllm == "dynamic" else "static"
    if row.mllm == "compiled":  # CUDA graphs for the state steps where there is a GPU
        compile_static_turn(mllm, mode="reduce-overhead" if decoder.device.type == "cuda" else None, backend=backend)
    device = decoder.device
    decoder.transformer = None  # the previous row's copy goes before the next one arrives
    decoder.transformer = copy.deepcopy(pristine[0]).to(device)
    renderer.small_decoder = small = copy.deepcopy(pristine[1]).to(device)
    converted = 0
    if row.fp8:
        granularity, which = row.fp8.split()
        converted = quantize_transformer_fp8(decoder, granularity=granularity, large_only=which == "large")
    if row.compiled:
        decoder.compile_blocks(backend=backend, dynamic=False)
        small.compile_blocks(backend=backend, dynamic=False)
    return converted


def bench_fast_path(decoder, mllm, small, settings: FastPathSettings, device, peak_flops: float = 0.0,
                    profile_dir: Path | None = None, on_row: Callable[[dict], None] | None = None) -> dict:
    """Time every row (see the module docstring); returns the ``fast_path`` section of benchmark.json. With
    ``profile_dir``, a torch.profiler table of one turn of the compiled bf16 row (eager without compile) is written
    there (``profile_fast_turn.txt``). ``on_row(section)`` hears the section after each row (a run stopped later
    keeps them); a row that fails is recorded with its error and the others still run."""
    device = torch.device(device)
    s = settings
    decoder.eval()
    decoder.merge_lora()
    mllm.eval()
    mllm.merge_lora()
    sampling = effective_sampling(dataclasses.replace(s.sampling, preset="distilled", scheduler="ddim", cache="none"))
    student = FewStepSampler(distilled_timesteps(decoder, student_steps=s.student_steps))
    sampler = PresetSampler(decoder, sampling, student)
    predictor = MLLMPredictor(mllm, str(device))
    with_small = DecoderRenderer(decoder, sampling, str(device), sampler=sampler, small_decoder=small)
    with_vae = DecoderRenderer(decoder, sampling, str(device), sampler=sampler)
    game = AnimeGamer(predictor, with_small, history_turns=s.history_turns, seed=s.seed)
    history = history_turns(s.history_turns, mllm.num_slots, mllm.shot_dim, s.seed)
    instruction = INSTRUCTIONS[-1]
    window = game.window(history)
    shot = history[-1].shot_embeds

    def timed(fn):
        return measure(fn, device, s.warmup, s.repeats)

    # once, before any row changes the transformer: the work of the student's denoising, the VAE decode, the writing
    latents = with_small.latents(shot, MOTION_LEVEL, s.seed)
    call_flops = count_flops(lambda: with_small.latents(shot, MOTION_LEVEL, s.seed))  # the student's calls
    try:  # the VAE's decode is only the comparison: under a memory cap it may not fit beside the rest
        vae = timed(lambda: list(with_vae.decode(latents)))
        vae_first = timed(lambda: next(iter(with_vae.decode(latents))))
        vae_frames, vae_error = int(next(iter(with_vae.decode(latents))).shape[0]), None
    except torch.OutOfMemoryError as exc:
        vae = vae_first = vae_frames = None
        vae_error = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
        if device.type == "cuda":
            torch.cuda.empty_cache()
    frames = torch.cat([torch.from_numpy(c) for c in with_small.decode(latents)]).numpy()  # (T, H, W, 3)
    run, skipped = rows_to_run(device, s.compile, s.rows)
    section = {
        "rows": {},
        "skipped": skipped,
        "vae_decode_s": vae and vae.median,
        "vae_first_chunk_s": vae_first and vae_first.median,
        "vae_first_frames": vae_frames,
        "vae_error": vae_error,
        "writing": time_writing(frames, sampling.fps),
        "denoise_tflop": call_flops / 1e12,
        "parameters": {"vae_decoder": sum(p.numel() for p in decoder.vae.decoder.parameters()),
                       "small_decoder": sum(p.numel() for p in small.parameters())},
        "settings": {"student_timesteps": list(student.timesteps), "history_turns": s.history_turns,
                     "latents": list(latents.shape), "frames": list(frames.shape), "compile_backend":
                     s.compile_backend, "random_weights": True, "dtype": str(decoder.dtype).removeprefix("torch.")},
    }
    # each row starts from fresh copies of these, kept on the CPU so that they are not in a row's peak memory
    pristine = (copy.deepcopy(decoder.transformer).cpu(), copy.deepcopy(small).cpu())

    reference = None
    for row in run:
        try:
            fp8_layers = _prepare(decoder, with_small, pristine, row, s.compile_backend, mllm)
            mllm_t = timed(lambda: predictor.predict_turn(window, instruction))
            syncs = mllm_host_syncs(predictor, window, instruction, counted=row.mllm != "compiled")
            den = timed(lambda: with_small.latents(shot, MOTION_LEVEL, s.seed))  # compiles in the warm-up calls
            row_latents = with_small.latents(shot, MOTION_LEVEL, s.seed)
            dec = timed(lambda row_latents=row_latents: list(with_small.decode(row_latents)))
            first = timed(lambda row_latents=row_latents: next(iter(with_small.decode(row_latents))))
            with PeakMemory(device) as peak:
                turn = timed(lambda: game.play_turn(history, instruction, out_dir=None))
            if profile_dir is not None and row.name == ("compiled" if s.compile else "eager"):
                profile_turn(predictor, with_small, window, instruction, shot, s.seed, device, profile_dir)
        except Exception as exc:  # e.g. a compiler error in one row: the other rows' numbers still stand
            section["rows"][row.name] = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:500]}
        else:
            if row.name == "eager":
                reference = row_latents
            section["rows"][row.name] = {
                "compiled": row.compiled,
                "fp8": row.fp8 or None,
                "fp8_layers": fp8_layers,
                "mllm_s": mllm_t.median,
                "mllm_kv_cache": row.mllm,
                **syncs,
                "denoise_s": den.median,
                "small_decode_s": dec.median,
                "small_first_chunk_s": first.median,
                "first_frames": int(next(iter(with_small.decode(row_latents))).shape[0]),
                "turn_s": turn.median,
                "turn_parts_s": mllm_t.median + den.median + dec.median,
                "turn_with_vae_s": vae and mllm_t.median + den.median + vae.median,
                "time_to_first_frames_s": mllm_t.median + den.median + first.median,
                "time_to_first_frames_with_vae_s": vae_first and mllm_t.median + den.median + vae_first.median,
                "peak_memory_gb": peak.peak_gb if device.type == "cuda" else None,
                "host_peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1024**3,  # so far
                "denoise_mfu": call_flops / den.median / peak_flops if peak_flops else None,
                "latents_vs_eager": None if reference is None else relative_difference(row_latents, reference),
                "raw_turn_s": turn.seconds,
                "raw_mllm_s": mllm_t.seconds,
                "raw_denoise_s": den.seconds,
            }
        if on_row is not None:
            on_row(section)
    torch._dynamo.reset()
    uncompile_static_turn(mllm)
    mllm.kv_cache = "static"
    return section


def mllm_host_syncs(predictor: MLLMPredictor, window, instruction: str, counted: bool = True) -> dict:
    """Host synchronisations of one MLLM turn: ``mllm_host_syncs`` (:class:`HostSyncCounter`, by kind in
    ``mllm_host_sync_kinds``; None for a compiled turn, whose kernels it does not see) and, on a GPU,
    ``mllm_host_syncs_cuda`` (``torch.cuda.set_sync_debug_mode``'s warnings, file:line in ``..._where``)."""
    found: dict = {"mllm_host_syncs": None, "mllm_host_sync_kinds": None, "mllm_host_syncs_cuda": None}
    if counted:
        with HostSyncCounter(host=[h.shot_embeds for h in window], device=predictor.device) as syncs:
            predictor.predict_turn(window, instruction)
        found.update(mllm_host_syncs=syncs.count, mllm_host_sync_kinds=syncs.by_kind())
    if torch.device(predictor.device).type == "cuda":
        where = cuda_sync_warnings(lambda: predictor.predict_turn(window, instruction))
        found.update(mllm_host_syncs_cuda=len(where), mllm_host_syncs_cuda_where=where)
    return found


def profile_turn(predictor, renderer, window, instruction: str, shot: torch.Tensor, seed: int, device,
                 out_dir: Path) -> Path:
    """torch.profiler table of one fast turn, its parts labelled (mllm, denoise, decode), sorted by device time on a
    GPU: where the time goes."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with record_function("mllm"):
            predictor.predict_turn(window, instruction)
        with record_function("denoise"):
            latents = renderer.latents(shot, MOTION_LEVEL, seed)
        with record_function("decode"):
            list(renderer.decode(latents))
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "profile_fast_turn.txt"
    atomic_write_text(path, prof.key_averages().table(sort_by=sort, row_limit=50) + "\n")
    return path
