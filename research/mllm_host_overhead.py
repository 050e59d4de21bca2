"""Where the MLLM's share of a turn goes: eager vs its decoder layers under torch.compile, the host syncs of one turn,
and a profiler table of each (random weights at the preset's size; a speed probe only).

    python research/mllm_host_overhead.py --out benchmarks/h200/fast_path --preset full --device cuda
    python research/mllm_host_overhead.py --out /tmp/mllm --preset tiny --device cpu     # the structure, in seconds

Writes ``mllm_turn.json`` (seconds of 10 timed turns after 2 untimed, eager and compiled; the first compiled call;
how far the compiled shot is from the eager one; the source lines of every host sync of one eager turn, on CUDA) and
``mllm_profile_{eager,compiled}.txt`` (torch.profiler, sorted by device time on a GPU). The turn is
:meth:`MLLMPredictor.predict_turn` with K=3 history turns, as the game plays it.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from animegamer.bench.fastpath import history_turns
from animegamer.bench.models import ARCHITECTURES, build_mllm, build_tokenizer
from animegamer.bench.timing import measure
from animegamer.bench.turn import INSTRUCTIONS
from animegamer.config import StageBConfig, load_config
from animegamer.inference.mllm_runner import MLLMPredictor
from animegamer.inference.turn import AnimeGamer
from animegamer.io import atomic_write_json, atomic_write_text

STAGE_B = {"full": "configs/stage_b.yaml", "tiny": "configs/tiny/stage_b.yaml"}


def host_syncs(fn) -> list[str]:
    """file:line of every synchronizing CUDA call ``fn`` makes (torch.cuda.set_sync_debug_mode)."""
    torch.cuda.set_sync_debug_mode("warn")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fn()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    return [f"{Path(w.filename).name}:{w.lineno}" for w in caught]


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
              "torch": torch.__version__, "build_s": time.perf_counter() - started}
    reference = turn()
    result["prompt_tokens"] = reference.prompt_tokens
    result["eager_s"] = measure(turn, args.device, 2, 10).seconds
    if args.device == "cuda":
        result["host_syncs"] = host_syncs(turn)
    atomic_write_text(out / "mllm_profile_eager.txt", profile_table(turn, args.device))
    t = time.perf_counter()
    mllm.compile_blocks(**({} if args.device == "cuda" else {"backend": "aot_eager"}))
    compiled = turn()
    result["compile_first_call_s"] = time.perf_counter() - t
    result["compiled_shot_rel_diff"] = float(
        (compiled.shot_embeds - reference.shot_embeds).norm() / reference.shot_embeds.norm())
    result["compiled_values_equal"] = compiled.values == reference.values
    t = time.perf_counter()
    turn(INSTRUCTIONS[0])  # another prompt length
    result["compiled_other_length_first_call_s"] = time.perf_counter() - t
    result["compiled_s"] = measure(turn, args.device, 2, 10).seconds
    atomic_write_text(out / "mllm_profile_compiled.txt", profile_table(turn, args.device))
    result["total_s"] = time.perf_counter() - started
    atomic_write_json(out / "mllm_turn.json", result)
    return result


if __name__ == "__main__":
    main()
