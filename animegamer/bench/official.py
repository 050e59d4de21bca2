"""The benchmark's ``official`` part: random weights in the release's on-disk layout, converted, then one turn played
the release's way and ours, in the same run.

    python scripts/benchmark.py --preset tiny --device cpu parts=[official]
    python scripts/benchmark.py --preset full --device cuda parts=[official]   # CogVideoX-2B (H 1920, 30 layers) +
                                                                                # Mistral-7B: needs a GPU

1. release files (:func:`write_release`): a SAT decoder checkpoint directory (``latest`` + ``<iter>/
   mp_rank_00_model_states.pt`` + its model YAML), a peft agent ``pytorch_model.bin`` + LLM YAML + base
   ``config.json``, the stand-in tokenizer at the release's ids, and a diffusers CogVideoX base folder (random VAE,
   scheduler) — at the reference set's tiny sizes or the release's (:func:`release_sizes`);
2. the real converter (:func:`animegamer.official.convert.convert_release`) in a child process: seconds and peak
   RSS (anonymous and file-backed) of the conversion alone;
3. one turn on the converted weights (MLLM turn, denoising, VAE decode), no history (the release plays with
   ``max_window`` 1); the VAE decode is the same call in both modes and is timed once:

   ``released`` — the release's numerics and call pattern: agent LoRA unmerged, a shot pass then up to 200 greedy
   tokens over the whole vocabulary (its logits processor), the release's stochastic DPM-Solver++(2M) with the
   whole transformer in fp16 and LoRA unmerged;
   ``fixed`` + our fast path — LoRA merged (both models), one prefill + 3 cached steps of constrained state
   decoding + the frame-block shot pass, our DPM sampler with both CFG rows in one batch, transformer blocks
   compiled when ``compile`` is on.

The official code itself (SwissArmyTransformer + transformers 4.44) cannot be installed beside this project's pins,
so ``released`` is the stand-in for the official speed: it runs the release's algorithm (tests/test_official_*.py
pin its numerics to the official outputs) on our modules, not the official code.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import torch
import yaml

from animegamer.bench.models import ARCHITECTURES
from animegamer.bench.timing import PeakMemory, measure, synchronize
from animegamer.config import InferenceConfig, load_config
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.mllm_turn import predict_turn
from animegamer.models.trained import load_decoder
from animegamer.models.vae import DTYPES
from animegamer.official.agent import predict_released, release_render_level
from animegamer.official.convert import INFERENCE_FILE
from animegamer.official.game import ReleasedSampler, cast_transformer, release_sampler_settings
from animegamer.official.release_files import (
    build_release_tokenizer,
    random_agent_state,
    sat_model_yaml,
    write_random_checkpoint,
)
from animegamer.official.sat_layout import SatDecoderSpec
from animegamer.sampling.denoise import sample
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER

INSTRUCTION = "Character: Qiqi; Motion: gently lie down; Background: night bedroom."
MODES = ("released", "fixed")
NOTE = (
    "released stands in for the official code, which cannot run here (SwissArmyTransformer + transformers 4.44 do "
    "not install beside this project's pins): it is the release's algorithm on our modules, its numerics pinned to "
    "the official outputs by tests/test_official_*.py."
)


@dataclasses.dataclass(frozen=True)
class ReleaseSizes:
    """The sizes of the random release files."""

    decoder: SatDecoderSpec
    mistral: dict  # config.json of the base Mistral
    lora_rank: int
    lora_alpha: int
    sat_dtype: torch.dtype  # what the SAT checkpoint stores


def _mistral(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int) -> dict:
    return {
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "vocab_size": vocab,
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
    }


def release_sizes(preset: str, steps: int) -> ReleaseSizes:
    """``tiny``: the official reference set's sizes (tests/data/official_ref/README.md: DiT H 64, 3 layers; Mistral
    hidden 32, 3 layers) with a 512-token base vocabulary; ``full``: the release's (CogVideoX-2B SAT DiT H 1920, 30
    layers, LoRA r 64; Mistral-7B-Instruct-v0.1, LoRA r 32 alpha 32). ``steps``: the sampler's step count."""
    if preset == "full":
        vocab = ARCHITECTURES["full"].mistral["vocab_size"]
        # SAT saves the model in the dtype it runs (the release's fp16: True)
        return ReleaseSizes(SatDecoderSpec(sample_steps=steps), _mistral(4096, 14336, 32, 32, 8, vocab), 32, 32,
                            torch.float16)
    if preset != "tiny":
        raise ValueError(f"preset must be tiny or full, got {preset!r}")
    spec = SatDecoderSpec(hidden_size=64, num_layers=3, num_heads=2, time_embed_dim=32, num_frames=9,
                          latent_height=6, latent_width=4, text_hidden_size=24, lora_rank=8, sample_steps=steps)
    return ReleaseSizes(spec, _mistral(32, 96, 3, 4, 2, ARCHITECTURES["tiny"].mistral["vocab_size"]), 8, 16,
                        torch.float32)


def _size_mb(path: Path) -> float:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    return sum(p.stat().st_size for p in files) / 1024**2


def write_release(root: Path, preset: str, sizes: ReleaseSizes, seed: int) -> dict:
    """The release's files under ``root`` with random weights; returns their paths (the converter's arguments),
    sizes on disk and the seconds it took."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler

    began = time.perf_counter()
    spec = sizes.decoder
    (root / "VDM_Decoder").mkdir(parents=True)
    (root / "VDM_Decoder" / "cogvideox_2b.yaml").write_text(yaml.safe_dump(sat_model_yaml(spec)))
    write_random_checkpoint(root / "VDM_Decoder" / "ckpt", spec, seed, iteration=1000, dtype=sizes.sat_dtype)

    base = root / "CogVideoX-2b"
    torch.manual_seed(seed)
    vae = AutoencoderKLCogVideoX(**{**ARCHITECTURES[preset].vae, "latent_channels": spec.in_channels})
    vae.save_pretrained(str(base / "vae"))
    del vae
    CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER).save_pretrained(str(base / "scheduler"))

    mllm = root / "MLLM"
    mllm.mkdir()
    tokenizer = build_release_tokenizer(root / "animegamer_tokenizer", sizes.mistral["vocab_size"])
    from transformers import AutoTokenizer

    vocab_total = len(AutoTokenizer.from_pretrained(str(tokenizer)))
    state = random_agent_state(sizes.mistral, sizes.lora_rank, spec.hidden_size, vocab_total, seed)
    torch.save(state, mllm / "pytorch_model.bin")
    del state
    (mllm / "config.json").write_text(json.dumps(sizes.mistral))
    (mllm / "llm.yaml").write_text(yaml.safe_dump({"peft_config": {"r": sizes.lora_rank,
                                                                   "lora_alpha": sizes.lora_alpha}}))
    paths = {
        "agent_bin": str(mllm / "pytorch_model.bin"),
        "tokenizer_dir": str(tokenizer),
        "mistral_config": str(mllm / "config.json"),
        "llm_yaml": str(mllm / "llm.yaml"),
        "decoder_dir": str(root / "VDM_Decoder" / "ckpt"),
        "decoder_yaml": str(root / "VDM_Decoder" / "cogvideox_2b.yaml"),
        "cogvideox_dir": str(base),
    }
    return {
        "paths": paths,
        "agent_bin_mb": _size_mb(mllm / "pytorch_model.bin"),
        "decoder_checkpoint_mb": _size_mb(root / "VDM_Decoder" / "ckpt"),
        "build_s": time.perf_counter() - began,
    }


_CHILD = """
import importlib, json, sys, threading, time
peak = {"rss": 0, "anon": 0, "file": 0}
def poll():
    while True:
        fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith("Rss"))
        kb = {k: int(v.split()[0]) for k, v in fields.items()}
        peak["rss"] = max(peak["rss"], kb["RssAnon"] + kb["RssFile"] + kb.get("RssShmem", 0))
        peak["anon"], peak["file"] = max(peak["anon"], kb["RssAnon"]), max(peak["file"], kb["RssFile"])
        time.sleep(0.02)
args = json.loads(sys.argv[1])
module, name = args["function"].split(":")
function = getattr(importlib.import_module(module), name)
threading.Thread(target=poll, daemon=True).start()
start = time.perf_counter()
function(**args["kwargs"])
seconds = time.perf_counter() - start
time.sleep(0.1)
print(json.dumps({"seconds": seconds, **{k + "_mb": v / 1024 for k, v in peak.items()}}))
"""


def measure_conversion(function: str, kwargs: dict) -> dict[str, float]:
    """Run ``function`` ("module:name", e.g. "animegamer.official.convert:convert_release") with JSON ``kwargs`` in
    a child process, so that its peak memory is its own and not the caller's: returns seconds and the child's peak
    RSS (``rss_mb``), anonymous (``anon_mb``, what the conversion holds) and file-backed (``file_mb``: libraries and
    the memory-mapped input, page cache the kernel can drop). Raises RuntimeError with the child's last error line."""
    payload = json.dumps({"function": function, "kwargs": kwargs})
    result = subprocess.run([sys.executable, "-c", _CHILD, payload], capture_output=True, text=True)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines() or ["(no output)"]
        raise RuntimeError(f"the conversion failed: {lines[-1]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


class CallCounter:
    """Forward calls of a module and the batch rows they ran (a pre-hook; ``hidden_states`` or the first input)."""

    def __init__(self, module: torch.nn.Module):
        self.calls = self.rows = 0
        self._handle = module.register_forward_pre_hook(self._hook, with_kwargs=True)

    def _hook(self, module, args, kwargs):
        first = kwargs.get("hidden_states", kwargs.get("inputs_embeds", args[0] if args else None))
        self.calls += 1
        self.rows += int(first.shape[0]) if isinstance(first, torch.Tensor) else 1

    def reset(self) -> None:
        self.calls = self.rows = 0

    def remove(self) -> None:
        self._handle.remove()


def _turn(mllm, decoder, predict, sample, released: bool, device, warmup: int, repeats: int, seed: int) -> dict:
    """Time the MLLM turn ``predict`` and the denoising ``sample(shot, levels, generator) -> latents`` of one mode,
    with the LLM forward passes and transformer calls of one untimed turn; ``latents`` (not JSON) is what the VAE
    decodes. ``released``: the level renders as the release parsed it."""

    llm_calls, dit_calls = CallCounter(mllm.backbone), CallCounter(decoder.transformer)
    try:
        with PeakMemory(device) as memory:
            prediction = predict(mllm, [], INSTRUCTION)
            llm = {"llm_forward_passes": llm_calls.calls}
            if released:
                level = release_render_level(prediction.release_values, decoder.num_motion_levels)
            else:
                level = prediction.values.motion_level
            shot = prediction.shot_embeds[None].to(device)  # (1, N, shot_dim)
            levels = torch.tensor([level], device=device)

            def denoise():
                return sample(shot, levels, torch.Generator().manual_seed(seed))

            latents = denoise()
            calls = {"transformer_calls": dit_calls.calls, "transformer_rows": dit_calls.rows}
            mllm_t = measure(lambda: predict(mllm, [], INSTRUCTION), device, warmup, repeats)
            denoise_t = measure(denoise, device, warmup, repeats)
            synchronize(device)
    finally:
        llm_calls.remove()
        dit_calls.remove()
    return {
        **llm,
        **calls,
        "motion_level": int(level),
        "release_values": prediction.release_values,
        "mllm_s": mllm_t.median,
        "denoise_s": denoise_t.median,
        "peak_memory_gb": memory.peak_gb,
        "raw_s": {"mllm": mllm_t.seconds, "denoise": denoise_t.seconds},
        "latents": latents,
    }


def bench_official(preset: str, device, work: Path, steps: int, dtype: str, warmup: int, repeats: int,
                   compile_blocks: bool, seed: int = 0) -> dict:
    """Build, convert and time (see the module docstring); ``work`` holds the release files and the conversion.
    ``dtype``: the frozen weights of both models in ``fixed`` and of the agent in ``released`` (whose decoder runs
    in the release's fp16). Returns the ``official`` section of benchmark.json."""

    device = torch.device(device)
    sizes = release_sizes(preset, steps)
    release = write_release(work / "release", preset, sizes, seed)
    out = work / "converted"
    conversion = measure_conversion(
        "animegamer.official.convert:convert_release", {"out": str(out), **release["paths"], "compat": "fixed"}
    )
    conversion["converted_mb"] = _size_mb(out)

    cfg = load_config(out / INFERENCE_FILE, [f"mllm.dtype={dtype}", f"decoder.dtype={dtype}"], schema=InferenceConfig)
    torch.manual_seed(seed)
    mllm = AnimeGamerMLLM.from_config(cfg.mllm, device=device)
    mllm.load_trained(cfg.mllm_checkpoint)
    mllm.eval()
    sampling = cfg.sampling
    settings = release_sampler_settings(cfg.decoder_checkpoint)
    modes = {}
    # released first: the release runs both LoRAs unmerged, nothing compiled, its whole transformer in fp16
    decoder = load_decoder(cfg.decoder_checkpoint, cfg.decoder, device=device)
    cast_transformer(decoder, DTYPES[settings.get("dtype", "fp32")])
    modes["released"] = _turn(mllm, decoder, predict_released, ReleasedSampler(decoder, sampling, settings).latents,
                              True, device, warmup, repeats, seed)
    del decoder
    decoder = load_decoder(cfg.decoder_checkpoint, cfg.decoder, device=device)
    mllm.merge_lora()
    decoder.merge_lora()
    if compile_blocks:
        decoder.compile_blocks()

    def sample_fixed(shot, levels, generator):
        return sample(decoder, shot, levels, sampling, generator, decode=False)

    modes["fixed"] = _turn(mllm, decoder, predict_turn, sample_fixed, False, device, warmup, repeats, seed)
    # the VAE decode is the same call in both modes (the release's dtype is the transformer's only): timed once, so
    # that the ratio holds only what differs
    latents = modes["fixed"].pop("latents")
    modes["released"].pop("latents")
    vae = measure(lambda: decoder.decode_latents(latents), device, warmup, repeats)
    for mode in modes.values():
        mode["vae_decode_s"] = vae.median
        mode["turn_s"] = mode["mllm_s"] + mode["denoise_s"] + vae.median
    released, fixed = modes["released"], modes["fixed"]
    spec = sizes.decoder
    return {
        **modes,
        "speedup": {k: released[f"{k}_s"] / max(fixed[f"{k}_s"], 1e-12) for k in ("mllm", "denoise", "turn")},
        "vae_decode_raw_s": vae.seconds,
        "release_files": {k: v for k, v in release.items() if k != "paths"},
        "conversion": conversion,
        "settings": {
            "decoder": {"hidden_size": spec.hidden_size, "num_layers": spec.num_layers, "num_heads": spec.num_heads,
                        "lora_rank": spec.lora_rank, "sat_dtype": str(sizes.sat_dtype).removeprefix("torch.")},
            "mllm": {k: sizes.mistral[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                                                     "vocab_size")} | {"lora_rank": sizes.lora_rank},
            "steps": sampling.steps,
            "height": sampling.height,
            "width": sampling.width,
            "num_frames": sampling.num_frames,
            "guidance_scale": sampling.guidance_scale,
            "dtype": dtype,
            "released_decoder_dtype": settings.get("dtype", "fp32"),
            "history_turns": 0,
            "compile": compile_blocks,
        },
        "note": NOTE,
    }
