"""Where the MLLM's share of a turn goes: its turn with transformers' dynamic KV cache, with the static cache
(animegamer.models.mllm_static) and with the static turn compiled; the host syncs of each and a profiler table (random
weights at the preset's size; a speed probe only).

    python research/mllm_host_overhead.py --out benchmarks/h100/fast_path --preset full --device cuda
    python research/mllm_host_overhead.py --out /tmp/mllm --preset tiny --device cpu     # the structure, in minutes

Writes ``mllm_turn.json``: per mode (``dynamic``, ``static``, ``static compiled``) the seconds of 10 timed turns after
2 untimed, the host syncs of one turn (``HostSyncCounter``, by kind and source line; on CUDA also
``torch.cuda.set_sync_debug_mode``'s), how far its shot is from the dynamic turn's and whether its values are the
same; for the compiled mode the first call and a call at another prompt length. Then the dynamic and static turns 20
times each, turn about (``alternating_median_s``, ``alternating_min_s``: the same load for both).
``mllm_profile_{mode}.txt``: torch.profiler, sorted by device time on a GPU. The turn is
:meth:`MLLMPredictor.predict_turn` with K=3 history turns, as the game plays it; the compiled mode's state steps run
in CUDA graphs on a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from animegamer.bench.fastpath import history_turns
from animegamer.bench.models import ARCHITECTURES, build_mllm, build_tokenizer
from animegamer.bench.syncs import HostSyncCounter, cuda_sync_warnings
from animegamer.bench.timing import measure
from animegamer.bench.turn import INSTRUCTIONS
from animegamer.config import StageBConfig, load_config
from animegamer.game.predictor import MLLMPredictor
from animegamer.game.turn import AnimeGamer
from animegamer.io import atomic_write_json, atomic_write_text
from animegamer.models.mllm_static import compile_static_turn, uncompile_static_turn

STAGE_B = {"full": "configs/stage_b.yaml", "tiny": "configs/tiny/stage_b.yaml"}


def profile_table(fn, device: str) -> str:
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
    return prof.key_averages().table(sort_by="cuda_time_total" if device == "cuda" else "cpu_time_total",
                                     row_limit=30)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for mllm_turn.json and the profiler tables")
    parser.add_argument("--preset", choices=sorted(STAGE_B), default="full", help="model sizes")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda", help="where the MLLM runs")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible; use --device cpu --preset tiny", file=sys.stderr)
        raise SystemExit(2)
    out = Path(args.out)
    started = time.perf_counter()
    arch = ARCHITECTURES[args.preset]
    cfg = load_config(STAGE_B[args.preset], schema=StageBConfig).mllm
    cfg.dtype, cfg.gradient_checkpointing = ("bf16" if args.device == "cuda" else "fp32"), False
    with tempfile.TemporaryDirectory() as tmp:
        mllm = build_mllm(arch, cfg, args.device, build_tokenizer(Path(tmp) / "tokenizer", arch.tokenizer_vocab))
    mllm.eval()
    mllm.merge_lora()
    predictor = MLLMPredictor(mllm, args.device)
    window = AnimeGamer(predictor, None, history_turns=3).window(history_turns(3, mllm.num_slots, mllm.shot_dim, 0))

    def turn(text: str = INSTRUCTIONS[-1]):
        return predictor.predict_turn(window, text)

    result = {"preset": args.preset, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
              "torch": torch.__version__, "build_s": time.perf_counter() - started, "modes": {}}
    reference = None
    for mode in ("dynamic", "static", "static compiled"):
        mllm.kv_cache = "dynamic" if mode == "dynamic" else "static"
        row: dict = {}
        if mode == "static compiled":
            compile_static_turn(mllm, mode="reduce-overhead" if args.device == "cuda" else None,
                                **({} if args.device == "cuda" else {"backend": "aot_eager"}))
            t = time.perf_counter()
            turn()
            row["compile_first_call_s"] = time.perf_counter() - t
            t = time.perf_counter()
            turn(INSTRUCTIONS[0])  # another prompt length
            row["other_length_first_call_s"] = time.perf_counter() - t
        else:  # the counter sees operators, not a compiled graph's kernels
            turn()  # first: the id tables and KV buffers are copied / allocated once per model
            with HostSyncCounter(host=[h.shot_embeds for h in window], device=args.device) as syncs:
                turn()
            row.update(host_syncs=syncs.count, host_sync_kinds=syncs.by_kind(),
                       host_sync_events=[list(e) for e in syncs.events])
        prediction = turn()
        reference = reference or prediction
        row["prompt_tokens"] = prediction.prompt_tokens
        row["values_equal_dynamic"] = prediction.values == reference.values
        row["shot_rel_diff_dynamic"] = float(
            (prediction.shot_embeds - reference.shot_embeds).norm() / reference.shot_embeds.norm())
        timing = measure(turn, args.device, 2, 10)
        row["seconds"], row["median_s"] = timing.seconds, timing.median
        if args.device == "cuda":
            where = cuda_sync_warnings(turn)
            row.update(cuda_syncs=len(where), cuda_sync_where=where)
        atomic_write_text(out / f"mllm_profile_{mode.replace(' ', '_')}.txt", profile_table(turn, args.device))
        result["modes"][mode] = row
        atomic_write_json(out / "mllm_turn.json", result)  # each mode saved as it ends
        print(f"{mode}: {row['median_s']:.4f} s, host syncs {row.get('host_syncs', '-')}"
              f"{' / CUDA ' + str(row['cuda_syncs']) if 'cuda_syncs' in row else ''}", flush=True)
    uncompile_static_turn(mllm)
    # the two eager caches once more, turn about (the same load on a shared machine for both): 20 turns each
    paired: dict[str, list[float]] = {"dynamic": [], "static": []}
    for _ in range(20):
        for mode, seconds in paired.items():
            mllm.kv_cache = mode
            seconds.append(measure(turn, args.device, 0, 1).seconds[0])
    result["alternating_median_s"] = {mode: statistics.median(v) for mode, v in paired.items()}
    result["alternating_min_s"] = {mode: min(v) for mode, v in paired.items()}
    mllm.kv_cache = "static"
    result["total_s"] = time.perf_counter() - started
    atomic_write_json(out / "mllm_turn.json", result)
    return result


if __name__ == "__main__":
    main()
