"""Peak host RAM (process RSS) of loading each way to play and of the training stages' model setup, any size.

A GPU user's host holds every model the way the code loads it: ``from_pretrained`` into host memory, LoRA added
(and merged), then moved to the device, which reads every weight. So the host's floor is what that loading path
peaks at on the CPU once every weight has been read (:func:`read_every_page`: safetensors weights are mapped from
the file and only read pages are resident), measured with random weights written to disk in the real layouts (a
Mistral folder, a diffusers CogVideoX folder, a stage (d) checkpoint, a stage (e) small decoder):

    write_random_pretrained(FULL, root)        # root/{Mistral, CogVideoX, stage_d/decoder, stage_e/small_decoder}
    python -m animegamer.bench.memory ROW --root ROOT [--arch full]   # one row in this fresh process -> JSON

Each row runs in a process of its own (``ru_maxrss`` is a process's lifetime peak); ``research/memory_floor.py``
runs them one at a time under an address-space cap and writes the table. Rows (:data:`ROWS`):

    mllm              the game's MLLM (load_mllm_predictor: Mistral + LoRA merged + slots/resamplers)
    renderer          the standard / fast renderer (load_renderer: CogVideoX transformer + VAE, LoRA merged)
    distilled_small   the renderer with sampling.preset=distilled and sampling.vae=small (a stage (d) student
                      checkpoint and a stage (e) small decoder)
    offload           offload: sequential keeps both models on the host: the MLLM and the renderer in one process
    stage_a_setup     stage (a)'s models before prepare (encoder + transformer with LoRA, no VAE)
    stage_b_setup     stage (b)'s model before prepare (Mistral + LoRA + slots/resamplers, checkpointing)
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from animegamer.bench.models import (
    ARCHITECTURES,
    SMALL_SIZES,
    Architecture,
    build_tokenizer,
    building_on,
    randomize_trained,
)
from animegamer.bench.options import distilled_timesteps
from animegamer.config import InferenceConfig, load_config
from animegamer.io import atomic_write_json
from animegamer.models.weights import save_state_dict_file
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER

ROOT = Path(__file__).resolve().parents[2]
SHARD_BYTES = 2 << 30  # Mistral's weights are written in shards of about this size (host memory while writing)


def _status_bytes(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{key}:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"/proc/self/status has no {key} (not Linux?)")


def rss_bytes() -> int:
    """This process's resident set size now (Linux /proc), in bytes."""
    return _status_bytes("VmRSS")


def peak_rss_bytes() -> int:
    """This process's peak resident set size so far, in bytes: /proc's VmHWM, which also counts the current RSS
    (``ru_maxrss`` is the same high-water mark, but the kernel updates it lazily, so mid-run it can lag)."""
    return max(_status_bytes("VmHWM"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


# --------------------------------------------------------------------------------------------
# Random weights on disk, in the layouts the loaders read
# --------------------------------------------------------------------------------------------


def _random_tensors(module: torch.nn.Module, dtype: torch.dtype, seed: int, shard_bytes: int):
    """The state dict of ``module`` (built on the meta device) in shards of random ``dtype`` tensors: a 7B
    model is never whole in host memory."""
    generator = torch.Generator().manual_seed(seed)
    shard, size = {}, 0
    for name, meta in module.state_dict().items():
        tensor = torch.empty(meta.shape, dtype=dtype if meta.is_floating_point() else meta.dtype)
        if tensor.is_floating_point():
            tensor.uniform_(-0.02, 0.02, generator=generator)  # values do not change memory; uniform is cheap
        else:
            tensor.zero_()
        shard[name] = tensor
        size += tensor.numel() * tensor.element_size()
        if size >= shard_bytes:
            yield shard
            shard, size = {}, 0
    if shard:
        yield shard


def write_sharded(module: torch.nn.Module, out_dir: Path, stem: str, dtype: torch.dtype, seed: int,
                  shard_bytes: int = SHARD_BYTES) -> list[Path]:
    """``out_dir/<stem>-0000k-of-0000n.safetensors`` + ``<stem>.safetensors.index.json`` (the layout transformers
    and diffusers read for sharded checkpoints); one shard in memory at a time."""
    written, weight_map, total = [], {}, 0
    for index, shard in enumerate(_random_tensors(module, dtype, seed, shard_bytes)):
        path = out_dir / f"{stem}-{index + 1:05d}.safetensors"  # renamed below once the count is known
        save_state_dict_file(shard, path)
        written.append((path, list(shard)))
        total += sum(t.numel() * t.element_size() for t in shard.values())
    count, paths = len(written), []
    for index, (path, names) in enumerate(written):
        final = out_dir / f"{stem}-{index + 1:05d}-of-{count:05d}.safetensors"
        path.rename(final)
        paths.append(final)
        weight_map.update(dict.fromkeys(names, final.name))
    atomic_write_json(out_dir / f"{stem}.safetensors.index.json",
                      {"metadata": {"total_size": total}, "weight_map": weight_map})
    return paths


def write_random_pretrained(arch: Architecture, root: str | Path, seed: int = 0,
                            shard_bytes: int = SHARD_BYTES) -> dict[str, int]:
    """Random bf16 weights of ``arch`` under ``root``: ``Mistral/`` (config, tokenizer, sharded weights),
    ``CogVideoX/`` (transformer/, vae/, scheduler/), ``stage_d/decoder`` (random LoRA + motion embedding of the
    decoder's default layout and a 4-step ``sampler.json``) and ``stage_e/small_decoder``. Returns bytes per part."""
    from diffusers import AutoencoderKLCogVideoX, CogVideoXTransformer3DModel
    from transformers import MistralConfig, MistralForCausalLM

    from animegamer.config import DecoderConfig
    from animegamer.models.causal_decoder import CausalLatentDecoder, vae_layout
    from animegamer.models.decoder import AnimationShotDecoder
    from animegamer.sampling.fewstep import FewStepSampler

    root = Path(root)
    sizes = {}
    mistral_dir = root / "Mistral"
    mistral_dir.mkdir(parents=True, exist_ok=True)
    config = MistralConfig(**arch.mistral)
    config.save_pretrained(mistral_dir)
    build_tokenizer(mistral_dir, arch.tokenizer_vocab)
    with building_on("meta"):
        llm = MistralForCausalLM(config)
    sizes["Mistral"] = sum(p.stat().st_size for p in write_sharded(llm, mistral_dir, "model", torch.bfloat16, seed,
                                                                    shard_bytes))
    cog = root / "CogVideoX"
    with building_on("meta"):
        transformer = CogVideoXTransformer3DModel(**arch.transformer)
        vae = AutoencoderKLCogVideoX(**arch.vae)
    for sub, module in (("transformer", transformer), ("vae", vae)):
        (cog / sub).mkdir(parents=True, exist_ok=True)
        module.save_config(cog / sub)
        files = write_sharded(module, cog / sub, "diffusion_pytorch_model", torch.bfloat16, seed, shard_bytes)
        sizes[f"CogVideoX/{sub}"] = sum(p.stat().st_size for p in files)
    (cog / "scheduler").mkdir(parents=True, exist_ok=True)
    atomic_write_json(cog / "scheduler" / "scheduler_config.json",
                      {"_class_name": "CogVideoXDDIMScheduler", **COGVIDEOX_2B_SCHEDULER})

    # the trained parts of a stage (d) student: the decoder's default LoRA layout, loaded as the game loads it
    decoder = AnimationShotDecoder.from_config(DecoderConfig(pretrained=str(cog), dtype="bf16"), with_vae=False)
    randomize_trained(decoder.trainable_parameters(), seed)
    student = root / "stage_d" / "decoder"
    decoder.save_trained(student)
    FewStepSampler(distilled_timesteps(decoder)).save(student)  # configs/stage_d.yaml's 4 steps
    channels, blocks = SMALL_SIZES.get(arch.name, SMALL_SIZES["full"])
    torch.manual_seed(seed)
    small = CausalLatentDecoder(*vae_layout(dict(vae.config)), channels, blocks)
    small.save_pretrained(root / "stage_e" / "small_decoder")
    return sizes


# --------------------------------------------------------------------------------------------
# Rows: what each way to play / each stage loads, with the loaders the code uses
# --------------------------------------------------------------------------------------------


def inference_config(root: Path, *overrides: str) -> InferenceConfig:
    """configs/inference.yaml pointed at the random weights under ``root`` (no trained MLLM parts: the MLLM's
    shape is the config's default, the paper's)."""
    return load_config(ROOT / "configs" / "inference.yaml", [
        f"mllm.pretrained={root / 'Mistral'}", f"decoder.pretrained={root / 'CogVideoX'}", "mllm_checkpoint=",
        "decoder_checkpoint=", "device=cpu", *overrides])


def read_every_page(*modules: torch.nn.Module) -> None:
    """Read one element of every memory page of every parameter and buffer, as a device move (which reads them
    all) would: weights mapped from a safetensors file become resident only when read."""
    with torch.no_grad():
        for module in modules:
            for tensor in (*module.parameters(), *module.buffers()):
                if tensor.device.type == "cpu" and tensor.numel():
                    per_page = max(1, 4096 // tensor.element_size())
                    tensor.detach().reshape(-1)[::per_page].float().sum()


def _mllm(root: Path) -> list[torch.nn.Module]:
    from animegamer.game.build import load_mllm_predictor

    return [load_mllm_predictor(inference_config(root), "cpu", offload=False).model]


def _renderer(root: Path, *overrides: str) -> list[torch.nn.Module]:
    from animegamer.game.build import load_renderer

    renderer = load_renderer(inference_config(root, *overrides), "cpu", offload=False)
    return [m for m in (renderer.decoder, renderer.small_decoder) if m is not None]


def _distilled_small(root: Path) -> list[torch.nn.Module]:
    return _renderer(root, "sampling.preset=distilled", f"decoder_checkpoint={root / 'stage_d'}",
                     "sampling.vae=small", f"sampling.small_decoder={root / 'stage_e'}")


def _offload(root: Path) -> list[torch.nn.Module]:
    return _mllm(root) + _renderer(root)


def _stage_a(root: Path) -> list[torch.nn.Module]:
    from animegamer.models.decoder import AnimationShotDecoder
    from animegamer.models.shot_encoder import ActionAwareEncoder

    cfg = load_config(ROOT / "configs" / "stage_a.yaml", [f"decoder.pretrained={root / 'CogVideoX'}"])
    return [ActionAwareEncoder.from_config(cfg.encoder), AnimationShotDecoder.from_config(cfg.decoder, with_vae=False)]


def _stage_b(root: Path) -> list[torch.nn.Module]:
    from animegamer.models.mllm import AnimeGamerMLLM

    cfg = load_config(ROOT / "configs" / "stage_b.yaml", [f"mllm.pretrained={root / 'Mistral'}"])
    return [AnimeGamerMLLM.from_config(cfg.mllm)]


ROWS: dict[str, tuple[str, Callable[[Path], list[torch.nn.Module]]]] = {
    "mllm": ("the MLLM of every way to play (Mistral + LoRA merged, slots, resamplers)", _mllm),
    "renderer": ("standard / fast renderer (CogVideoX transformer + VAE, LoRA merged)", _renderer),
    "distilled_small": ("distilled + small decoder renderer (stage d student, stage e decoder)", _distilled_small),
    "offload": ("offload: sequential: MLLM and renderer both held on the host", _offload),
    "stage_a_setup": ("stage (a) models before prepare (encoder + transformer with LoRA, no VAE)", _stage_a),
    "stage_b_setup": ("stage (b) model before prepare (Mistral + LoRA + slots/resamplers)", _stage_b),
}


def measure_row(name: str, root: str | Path) -> dict:
    """Run row ``name`` in this process, every weight read once, and report its memory: call it in a fresh process
    (the peak is the process's lifetime peak, imports included; ``baseline`` is the RSS after the imports, before
    any model; ``loaded`` right after loading, before the weights are read)."""
    if name not in ROWS:
        raise ValueError(f"unknown row {name!r}; rows are {list(ROWS)}")
    what, load = ROWS[name]
    import animegamer.game.build  # noqa: F401  (the imports count in the baseline, not in the row)

    baseline = rss_bytes()
    started = time.perf_counter()
    modules = load(Path(root))
    loaded = rss_bytes()
    read_every_page(*modules)
    return {"row": name, "what": what, "baseline_rss_bytes": baseline, "loaded_rss_bytes": loaded,
            "peak_rss_bytes": peak_rss_bytes(), "rss_after_bytes": rss_bytes(),
            "seconds": round(time.perf_counter() - started, 1),
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> dict:
    """``python -m animegamer.bench.memory ROW --root DIR``: one row, its JSON on the last line of stdout;
    ``--write`` writes the random weights of ``--arch`` under ``--root`` first."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("row", nargs="?", help=f"one of {list(ROWS)}")
    parser.add_argument("--root", required=True, help="folder of the random weights (write_random_pretrained)")
    parser.add_argument("--arch", default="full", choices=sorted(ARCHITECTURES), help="sizes of the random weights")
    parser.add_argument("--write", action="store_true", help="write the random weights under --root (no row)")
    args = parser.parse_args(argv)
    if args.write:
        sizes = write_random_pretrained(ARCHITECTURES[args.arch], args.root)
        result = {"written": sizes, "peak_rss_bytes": peak_rss_bytes()}
    else:
        if args.row not in ROWS:
            print(f"error: row {args.row!r} is not one of {list(ROWS)}", file=sys.stderr)
            raise SystemExit(2)
        if not (Path(args.root) / "Mistral" / "config.json").is_file():
            print(f"error: no random weights under {args.root} (run with --write first)", file=sys.stderr)
            raise SystemExit(2)
        result = measure_row(args.row, args.root)
    print(json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
