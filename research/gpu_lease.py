"""Every GPU measurement of the third-of-a-second turn, in chunks of under 10 minutes each (``--list`` says how many
leases of ``--lease-s`` seconds of GPU time, 15 minutes by default, all of them take).

    python research/gpu_lease.py --list                                              # the chunks and their budgets
    python research/gpu_lease.py --chunk fast_eager --out benchmarks/h100            # one chunk: one command
    python research/gpu_lease.py --chunk all --preset tiny --device cpu --out /tmp/lease   # every chunk, CPU-sized

A chunk runs one existing measurement in a child process under its own time limit (at the limit it is stopped with
every process it started: :func:`run_in_group`) and writes its rows into
``--out/<chunk>/`` as that measurement saves them (the benchmark rewrites benchmark.json after each part and each
fast_path row; the MLLM probe after each mode), so a chunk cut off by its limit keeps what it finished. Every chunk
run appends one line to ``--out/lease.jsonl``: chunk, command, exit status, seconds, date, device and versions.

Chunks (full size, random weights, one GPU):

    mllm           the MLLM's turn: dynamic cache, static cache, static turn compiled (seconds, host syncs counted
                   and by CUDA's sync debug mode)                          research/mllm_host_overhead.py
    fast_eager     the game's fast turn, eager: static and dynamic MLLM cache (turn, first frames, MLLM host syncs)
    fast_compiled  the same compiled: blocks compiled, and the MLLM's static turn compiled too (CUDA graphs)
    fast_24gb      the compiled fast turn under a 24 GB cap (torch.cuda.set_per_process_memory_fraction)
    fast_2step     the compiled fast turn with a 2-step student (the shipped SpriteWorld one; the others time 4)
    paper_turn     the paper's settings (50 steps, CFG), plain against ours, lossless; the fast preset; offload
    training       stage (a) and (b) optimizer steps, one process: steps/s, MFU, peak memory
    engines_a      stage (a) trained by its script under DDP, FSDP2 and ZeRO-3 (accelerate launch on every GPU
                   here, 20 steps each): steps/s, MFU, peak GPU memory per process, peak host RAM
                                                                           research/train_engines.py
    engines_b      the same for stage (b)

The engine chunks write their random full-size weights (about 20 GB) once, under the temp dir's
animegamer_engines/full, and both use them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parents[1]
LEASE_S = 900  # one device lease, by default (--lease-s)
CHUNK_LIMIT_S = 600  # one command on a lent device
FAST_EAGER_ROWS = "[eager, 'eager, dynamic MLLM cache']"
FAST_COMPILED_ROWS = "[compiled, 'compiled, MLLM compiled']"
FAST_FULL = ("warmup=1", "repeats=3")  # the fast-turn chunks at full size: medians of 3 after 1 warm-up
COMPILED_TINY = ("warmup=0", "repeats=1", "compile=true", "compile_backend=aot_eager")  # their structure on a CPU
# the stage scripts under accelerate, 20 steps each on every GPU; a launch past 150 s is stopped (its row says so) so
# that the chunk's three launches and the weights it writes first stay inside its limit
ENGINES_FULL = ("--engines", "ddp,fsdp2,zero3", "--timeout", "150")
ENGINES_TINY = ("--engines", "ddp,zero3", "--steps", "4", "--log-every", "2")  # FSDP2 does not start on CPU


class Chunk(NamedTuple):
    name: str
    budget_s: int  # what it is expected to take at full size on one H100/H200 (its time limit)
    script: str
    args: tuple[str, ...]  # {out}: the chunk's folder
    full: tuple[str, ...] = ()  # added at full size
    tiny: tuple[str, ...] = ()  # added at CPU size
    memory_cap_gb: float = 0.0


def bench(*args: str) -> tuple[str, ...]:
    return ("output_dir={out}", *args)


CHUNKS = (
    Chunk("mllm", 240, "research/mllm_host_overhead.py", ("--out", "{out}")),
    Chunk("fast_eager", 210, "scripts/benchmark.py",
          bench("parts=[fast_path]", f"fast_path_rows={FAST_EAGER_ROWS}"),
          full=FAST_FULL, tiny=("warmup=0", "repeats=1")),
    Chunk("fast_compiled", 450, "scripts/benchmark.py",
          bench("parts=[fast_path]", f"fast_path_rows={FAST_COMPILED_ROWS}", "profile=true"),
          full=FAST_FULL, tiny=COMPILED_TINY),
    Chunk("fast_24gb", 270, "scripts/benchmark.py", bench("parts=[fast_path]", "fast_path_rows=[compiled]"),
          full=FAST_FULL, tiny=COMPILED_TINY,
          memory_cap_gb=24.0),
    Chunk("fast_2step", 240, "scripts/benchmark.py",
          bench("parts=[fast_path]", f"fast_path_rows={FAST_COMPILED_ROWS}", "student_steps=2"),
          full=FAST_FULL, tiny=COMPILED_TINY),
    Chunk("paper_turn", 330, "scripts/benchmark.py", bench("parts=[turn]"),
          full=("warmup=1", "repeats=2"), tiny=("warmup=0", "repeats=1", "compile=false")),
    Chunk("training", 270, "scripts/benchmark.py", bench("parts=[stage_a,stage_b]"),
          full=("train_warmup=2", "train_repeats=5"), tiny=("train_warmup=0", "train_repeats=1", "compile=false")),
    Chunk("engines_a", 570, "research/train_engines.py", ("--out", "{out}", "--stages", "a"),
          full=ENGINES_FULL, tiny=ENGINES_TINY),
    Chunk("engines_b", 480, "research/train_engines.py", ("--out", "{out}", "--stages", "b"),
          full=ENGINES_FULL, tiny=ENGINES_TINY),
)
BY_NAME = {c.name: c for c in CHUNKS}


# ---------------------------------------------------------------- a command under a time limit, with its children
# ``subprocess.run(..., timeout=...)`` kills only the direct child: a launcher's workers (``accelerate launch`` and
# the processes torch's launcher starts under it, or a measurement's own children) would go on holding the GPU while
# the next chunk starts. Here the command leads a new session; past its limit the whole group gets SIGTERM, then
# SIGKILL after a grace period.

TIMED_OUT = 124  # the exit status reported for a command stopped at its limit (as coreutils' timeout)


def signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # every process of the group has ended
        pass


def run_in_group(argv: list[str], timeout_s: float, grace_s: float = 15.0, **popen) -> int:
    """Run ``argv`` (``popen``: Popen's keyword arguments) for at most ``timeout_s`` seconds; its exit status, or
    :data:`TIMED_OUT` when the limit stopped it and every process of its group."""
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        signal_group(proc.pid, signal.SIGKILL)  # whatever of the group is left, the leader included
        proc.wait()
        return TIMED_OUT
    except BaseException:  # Ctrl-C while waiting: nothing of the group outlives the driver
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
        raise


def command(chunk: Chunk, out: Path, preset: str, device: str) -> list[str]:
    """The chunk's command line (run from the repository root)."""
    extra = chunk.full if preset == "full" else chunk.tiny
    argv = [sys.executable, chunk.script, "--preset", preset, "--device", device, *chunk.args, *extra]
    if chunk.memory_cap_gb:
        argv += ["--memory-cap-gb", str(chunk.memory_cap_gb)]
    return [a.replace("{out}", str(out / chunk.name)) for a in argv]


def versions(device: str) -> dict:
    """Device name and library versions, as the rows were made with (imported here, after the argument check)."""
    import torch

    found = {"python": platform.python_version(), "torch": torch.__version__}
    for name in ("transformers", "diffusers", "peft"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    found["device"] = torch.cuda.get_device_name() if device == "cuda" else f"cpu ({os.cpu_count()} cores)"
    return found


def run_chunk(chunk: Chunk, out: Path, preset: str, device: str, limit_s: int) -> dict:
    """Run one chunk under ``limit_s`` seconds; its record (also appended to ``out/lease.jsonl``)."""
    argv = command(chunk, out, preset, device)
    (out / chunk.name).mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    rc = run_in_group(argv, limit_s, cwd=ROOT, env=env)  # at the limit every process it started is stopped; its
    # rows so far are on disk
    record = {"chunk": chunk.name, "command": " ".join(argv[1:]), "rc": rc,
              "seconds": round(time.perf_counter() - started, 1), "limit_s": limit_s,
              "date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "preset": preset,
              **versions(device)}
    with open(out / "lease.jsonl", "a") as log:  # one line per chunk run, appended: earlier chunks' lines stay
        log.write(json.dumps(record) + "\n")
    return record


def plan_leases(lease_s: int) -> int:
    """How many leases of ``lease_s`` seconds the chunks take, each chunk whole inside one (first fit, in order)."""
    leases: list[int] = []  # seconds used in each
    for chunk in CHUNKS:
        fit = next((i for i, used in enumerate(leases) if used + chunk.budget_s <= lease_s), None)
        if fit is None:
            leases.append(chunk.budget_s)
        else:
            leases[fit] += chunk.budget_s
    return len(leases)


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--chunk", help=f"a chunk ({', '.join(BY_NAME)}) or 'all'")
    parser.add_argument("--list", action="store_true", help="print the chunks, their budgets and commands")
    parser.add_argument("--out", default="benchmarks/h100", help="folder for the chunks' rows and lease.jsonl")
    parser.add_argument("--preset", choices=["full", "tiny"], default="full", help="model sizes")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where the measurements run")
    parser.add_argument("--lease-s", type=int, default=LEASE_S,
                        help="seconds of GPU time one lease gives (--list plans the chunks into leases of it)")
    args = parser.parse_args(argv)
    out = Path(args.out)
    longest = max(c.budget_s for c in CHUNKS)
    if args.lease_s < longest:
        print(f"error: --lease-s {args.lease_s} is shorter than the longest chunk ({longest} s)", file=sys.stderr)
        raise SystemExit(2)
    if args.list:
        for chunk in CHUNKS:
            line = " ".join(command(chunk, out, args.preset, args.device)[1:])
            print(f"{chunk.name:14s} {chunk.budget_s:4d} s  {line}")
        total = sum(c.budget_s for c in CHUNKS)
        print(f"total {total} s: {plan_leases(args.lease_s)} lease(s) of {args.lease_s} s")
        return []
    if args.chunk != "all" and args.chunk not in BY_NAME:
        print(f"error: --chunk must be one of {list(BY_NAME)} or all (got {args.chunk!r})", file=sys.stderr)
        raise SystemExit(2)
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            print("error: --device cuda but no CUDA device is visible; use --preset tiny --device cpu",
                  file=sys.stderr)
            raise SystemExit(2)
    chunks = CHUNKS if args.chunk == "all" else (BY_NAME[args.chunk],)
    records = []
    for chunk in chunks:
        print(f"[gpu_lease] {chunk.name} (limit {chunk.budget_s} s) ...", file=sys.stderr, flush=True)
        limit = chunk.budget_s if args.preset == "full" else CHUNK_LIMIT_S
        records.append(run_chunk(chunk, out, args.preset, args.device, limit))
        print(f"[gpu_lease] {chunk.name}: rc {records[-1]['rc']} in {records[-1]['seconds']} s", file=sys.stderr)
    return records


if __name__ == "__main__":
    main()
