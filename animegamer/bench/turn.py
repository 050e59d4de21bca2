"""One game turn timed part by part, on our path and on the plain-library path, in the same run.

    results = bench_turn(decoder, mllm, TurnSettings(sampling, history_turns=3, ...), device, peak_flops)

Parts of a turn (K history turns in the prompt, the paper's sampling settings):

    MLLM prefill + slots   ours: :func:`prefill_turn` (one forward, KV cache kept, output resampler at the slots)
                           plain: transformers ``generate`` of 1 token with hidden states (same one forward)
    state decoding         ours: :func:`decode_states`: 3 cached forwards of 3 tokens, argmax over value tokens
                           plain: ``generate`` of the 10 state tokens one by one, minus its prefill
    denoising              ours: :func:`animegamer.sampling.denoise.sample` (CFG branches in one batch; LoRA merged and
                           blocks compiled when enabled)
                           plain: the diffusers transformer called once per CFG branch, eager, LoRA unmerged
    VAE decode             the same diffusers call on both paths

The plain parts run first, then the fast-path switches are applied in place and our parts run; a final check
compares the two paths' outputs (shot representation, final latents) from the same seed. Then one whole turn as
the game plays it (:meth:`animegamer.game.turn.AnimeGamer.play_turn`: the parts above end to end, no file
written), the ``fast`` preset's denoising and, optionally, a whole turn with offload + VAE tiling (the 24 GB option)
with its peak.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from animegamer.bench.timing import PeakMemory, Timing, count_flops, measure
from animegamer.config import SamplingConfig
from animegamer.game.predictor import MLLMPredictor
from animegamer.game.renderer import DecoderRenderer
from animegamer.game.turn import AnimeGamer, Turn
from animegamer.io import atomic_write_text
from animegamer.models.mllm_static import is_fixed
from animegamer.models.mllm_turn import HistoryTurn, decode_states, predict_turn, prefill_turn
from animegamer.sampling.denoise import sample, start_sampling
from animegamer.sampling.presets import fast_sampling
from animegamer.sampling.schedule import guidance_scales, scheduler_step
from animegamer.states import CharacterState, StateValues
from animegamer.tokens import STATE_FIELDS, TurnSpec

INSTRUCTIONS = (
    "Character: Qiqi; Motion: walk to school; Background: street in the morning.",
    "Character: Qiqi; Motion: read a book; Background: garden at noon.",
    "Character: Qiqi; Motion: run along the river; Background: park at sunset.",
    "Character: Qiqi; Motion: gently lie down; Background: night bedroom.",
)
MOTION_LEVEL = 3
# Tokens after "<MS>" up to the last value: value, close, next open for every field but the last; its value.
STATE_TOKENS = 3 * len(STATE_FIELDS) - 2


@dataclass
class TurnSettings:
    sampling: SamplingConfig
    history_turns: int = 3
    warmup: int = 2
    repeats: int = 5
    compile: bool = False  # ours: torch.compile the decoder's transformer blocks
    compile_vae: bool = False  # ours: torch.compile the VAE decoder
    merge_lora: bool = True  # ours: LoRA folded into the base weights (decoder and MLLM)
    low_memory: bool = True  # also time a turn with offload=sequential and VAE tiling
    seed: int = 0


def make_history(num_turns: int, num_slots: int, shot_dim: int, seed: int = 0) -> list[HistoryTurn]:
    """``num_turns`` earlier turns with random shot representations and fixed values."""
    g = torch.Generator().manual_seed(seed)
    values = StateValues(motion_level=2, social=0, entertainment=1, stamina=-1)
    return [
        HistoryTurn(INSTRUCTIONS[i % (len(INSTRUCTIONS) - 1)], torch.randn(num_slots, shot_dim, generator=g), values)
        for i in range(num_turns)
    ]


def _prompt_embeds(model, history: list[HistoryTurn], instruction: str):
    """(layout of the prompt, its input embeddings (1, T, hidden)) as :func:`prefill_turn` builds them."""
    turns = [TurnSpec(h.instruction, h.values) for h in history] + [TurnSpec(instruction, None, is_current=True)]
    seq = model.layout.build_sequence(turns)
    device = model.device
    input_ids = torch.tensor([seq.input_ids], device=device)  # (1, T)
    if not history:
        return seq, model.embed(input_ids)
    positions = torch.tensor(seq.slot_positions[:-1], device=device)  # (M, N)
    shots = torch.stack([h.shot_embeds.to(device) for h in history])  # (M, N, D)
    return seq, model.embed(input_ids, positions, shots)


@torch.no_grad()
def plain_generate(model, history: list[HistoryTurn], instruction: str, new_tokens: int) -> torch.Tensor:
    """The plain MLLM path: transformers ``generate`` (greedy, ``new_tokens`` tokens) on the same prompt; the
    prompt step's last hidden states at the slots give the shot. Returns s_a (N, shot_dim).

    Timing only for the state tokens: the base model's head cannot emit the added value tokens, so it generates
    ``new_tokens`` ordinary tokens, which costs the same.
    """
    seq, embeds = _prompt_embeds(model, history, instruction)
    out = model.llm.generate(
        inputs_embeds=embeds,
        attention_mask=torch.ones(embeds.shape[:2], dtype=torch.long, device=embeds.device),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        use_cache=True,
        output_hidden_states=True,
        return_dict_in_generate=True,
        pad_token_id=model.tokenizer.eos_token_id,
    )
    prompt_hidden = out.hidden_states[0][-1]  # (1, T, hidden), after the final norm
    previous = history[-1].shot_embeds if history else None
    return model.predict_shots(prompt_hidden[0, seq.slot_positions[-1]], previous)


@torch.no_grad()
def plain_denoise(decoder, shot_embeds, motion_level, sampling: SamplingConfig, generator) -> torch.Tensor:
    """The plain denoising loop: diffusers' CogVideoX transformer called once per CFG branch (batch B each).

    Same scheduler, seeds, guidance scales and latents as :func:`animegamer.sampling.denoise.sample`; only the batching
    of the two branches differs, so the final latents (B, F, C, h, w) agree up to rounding.
    """
    transformer, device, dtype = decoder.transformer, decoder.device, decoder.dtype
    batch = shot_embeds.shape[0]
    scheduler, scales, latents = start_sampling(decoder, batch, sampling, generator)  # latents (B, F, C, h, w)
    timesteps = scheduler.timesteps
    cond = shot_embeds.to(device, dtype)
    null = decoder.null_shot_embeds(batch, device, dtype)
    levels = motion_level.to(device) if decoder.motion_scope else None
    null_levels = decoder.unconditional_levels(levels)

    def branch(x, t, shots, ofs):
        out = transformer(
            hidden_states=x.to(dtype), encoder_hidden_states=shots, timestep=t.expand(batch), ofs=ofs,
            return_dict=False,
        )[0]
        return out.float()

    old_x0 = None
    for i, t in enumerate(timesteps):
        model_in = scheduler.scale_model_input(latents, t)
        out = branch(model_in, t, cond, levels)
        if scales[i] > 1.0:
            uncond = branch(model_in, t, null, null_levels)
            out = uncond + scales[i] * (out - uncond)
        latents, old_x0 = scheduler_step(scheduler, out, i, latents, old_x0, generator)
    return latents


@contextmanager
def float32_weights(module: torch.nn.Module) -> Iterator[None]:
    """``module``'s parameters and buffers in float32 inside the block, each back in its own dtype after (bf16 ->
    fp32 -> bf16 is exact, so the module leaves the block bit-identical)."""
    tensors = list(module.named_parameters()) + list(module.named_buffers())
    dtypes = {name: t.dtype for name, t in tensors}
    module.float()
    try:
        yield
    finally:  # listed again by name: .float() keeps the parameter objects but replaces the buffers
        for name, t in list(module.named_parameters()) + list(module.named_buffers()):
            t.data = t.data.to(dtypes[name])


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| in float32."""
    a, b = a.float().cpu(), b.float().cpu()
    return float((a - b).norm() / b.norm().clamp_min(1e-12))


def _part(fn: Callable[[], object], device, warmup: int, repeats: int) -> tuple[Timing, float]:
    with PeakMemory(device) as mem:
        timing = measure(fn, device, warmup, repeats)
    return timing, mem.peak_gb


def _denoise_flops(decoder, sampling: SamplingConfig, batch_flops: int) -> int:
    """Model FLOPs of a whole denoising loop: batch-1 forward FLOPs x (2 per guided step, 1 per other step)."""
    return batch_flops * sum(2 if s > 1.0 else 1 for s in guidance_scales(sampling))


def bench_turn(
    decoder, mllm, settings: TurnSettings, device, peak_flops: float, profile_dir: str | Path | None = None
) -> dict:
    """Time a turn on both paths (see module docstring); returns the ``turn`` section of benchmark.json."""
    device = torch.device(device)
    sampling, warmup, repeats = settings.sampling, settings.warmup, settings.repeats
    mllm.eval()
    decoder.eval()
    history = make_history(settings.history_turns, mllm.num_slots, mllm.shot_dim, settings.seed)
    instruction = INSTRUCTIONS[-1]
    levels = torch.tensor([MOTION_LEVEL])
    shot = predict_turn(mllm, history, instruction).shot_embeds[None].to(decoder.dtype)  # (1, N, H)
    prompt_tokens = len(_prompt_embeds(mllm, history, instruction)[0])

    def generator():
        return torch.Generator().manual_seed(settings.seed)

    def part(fn):
        return _part(fn, device, warmup, repeats)

    # ---- plain library path (eager, LoRA unmerged, CFG branches one at a time)
    plain_pre, plain_pre_mem = part(lambda: plain_generate(mllm, history, instruction, 1))
    plain_mllm, plain_mllm_mem = part(lambda: plain_generate(mllm, history, instruction, STATE_TOKENS))
    plain_shot = plain_generate(mllm, history, instruction, 1)
    plain_den, plain_den_mem = part(lambda: plain_denoise(decoder, shot, levels, sampling, generator()))
    plain_latents = plain_denoise(decoder, shot, levels, sampling, generator())
    plain_vae, plain_vae_mem = part(lambda: decoder.decode_latents(plain_latents))
    plain_frames = decoder.decode_latents(plain_latents)
    # How far bf16 alone moves the shot: the plain path with the MLLM's weights in float32 as the reference.
    with float32_weights(mllm.llm):
        reference_shot = plain_generate(mllm, history, instruction, 1)
    backends = sdpa_backend_steps(decoder, shot, levels, sampling, device, warmup, repeats)

    # ---- our path: the same modules with the fast-path switches applied in place
    if settings.merge_lora:
        decoder.merge_lora()
        mllm.merge_lora()
    latent_shape = decoder.latent_shape(sampling.num_frames, sampling.height, sampling.width)
    x = torch.randn(1, *latent_shape, device=decoder.device)
    step_flops = count_flops(  # one branch, one step; before compiling (the counter traces eagerly)
        lambda: decoder(x, torch.tensor([500], device=decoder.device), shot.to(decoder.device), levels)
    )
    if settings.compile:
        decoder.compile_blocks()

    prefilled = prefill_turn(mllm, history, instruction)
    prompt_length = None if is_fixed(prefilled.cache) else prefilled.cache.get_seq_length()

    def states_from_cache():
        decode_states(mllm, prefilled)
        # back to the prompt, so every call decodes from the same cache (crop takes minus the tokens to drop); the
        # static cache's steps always write after the prompt, over the previous call's
        if prompt_length is not None:
            prefilled.cache.crop(prompt_length - prefilled.cache.get_seq_length())

    ours_pre, ours_pre_mem = part(lambda: prefill_turn(mllm, history, instruction))
    ours_states, ours_states_mem = part(states_from_cache)
    ours_mllm, ours_mllm_mem = part(lambda: predict_turn(mllm, history, instruction))
    ours_shot = predict_turn(mllm, history, instruction).shot_embeds

    def ours_denoise(s: SamplingConfig):
        return sample(decoder, shot, levels, s, generator=generator(), decode=False)

    ours_den, ours_den_mem = part(lambda: ours_denoise(sampling))
    ours_latents = ours_denoise(sampling)
    if settings.compile_vae:
        decoder.compile_vae()
    ours_vae, ours_vae_mem = part(lambda: decoder.decode_latents(ours_latents))
    frames_diff = (decoder.decode_latents(plain_latents).float() - plain_frames.float()).abs()  # same latents

    # one whole turn as the game plays it, on the same modules: parse, window, MLLM, denoise, streamed decode
    earlier = [Turn(i, h.instruction, h.values, CharacterState(), h.shot_embeds, 0) for i, h in enumerate(history)]
    game = AnimeGamer(MLLMPredictor(mllm, str(device)), DecoderRenderer(decoder, sampling, str(device)),
                      history_turns=settings.history_turns, seed=settings.seed)
    whole, whole_mem = part(lambda: game.play_turn(earlier, instruction))

    fast = fast_sampling(sampling)
    fast_den, fast_den_mem = part(lambda: ours_denoise(fast))

    denoise_flops = _denoise_flops(decoder, sampling, step_flops)
    plain = {
        "path": "transformers generate (1 / 10 tokens) + diffusers transformer per CFG branch, eager, LoRA unmerged",
        "mllm_prefill_s": plain_pre.median,
        "mllm_states_s": max(plain_mllm.median - plain_pre.median, 0.0),
        "mllm_s": plain_mllm.median,
        "denoise_s": plain_den.median,
        "denoise_step_s": plain_den.median / sampling.steps,
        "denoise_mfu": denoise_flops / plain_den.median / peak_flops,
        "vae_decode_s": plain_vae.median,
        "peak_memory_gb": {"mllm": max(plain_pre_mem, plain_mllm_mem), "denoise": plain_den_mem,
                           "vae_decode": plain_vae_mem},
    }
    plain["turn_s"] = plain["mllm_s"] + plain["denoise_s"] + plain["vae_decode_s"]
    ours = {
        "path": "prefill_turn + decode_states (KV cache) + sampling.denoise.sample (CFG batched)"
        + (", LoRA merged" if settings.merge_lora else "")
        + (", blocks compiled" if settings.compile else "")
        + (", VAE decoder compiled" if settings.compile_vae else ""),
        "mllm_prefill_s": ours_pre.median,
        "mllm_states_s": ours_states.median,
        "mllm_s": ours_mllm.median,
        "denoise_s": ours_den.median,
        "denoise_step_s": ours_den.median / sampling.steps,
        "denoise_mfu": denoise_flops / ours_den.median / peak_flops,
        "vae_decode_s": ours_vae.median,
        "peak_memory_gb": {"mllm": max(ours_pre_mem, ours_states_mem, ours_mllm_mem), "denoise": ours_den_mem,
                           "vae_decode": ours_vae_mem},
    }
    ours["turn_s"] = ours["mllm_s"] + ours["denoise_s"] + ours["vae_decode_s"]
    speedup = {k: plain[f"{k}_s"] / max(ours[f"{k}_s"], 1e-12) for k in
               ("mllm_prefill", "mllm_states", "mllm", "denoise", "vae_decode", "turn")}
    fast_turn = ours["mllm_s"] + fast_den.median + ours["vae_decode_s"]
    result = {
        "settings": {
            "height": sampling.height,
            "width": sampling.width,
            "num_frames": sampling.num_frames,
            "latent_frames": latent_shape[0],
            "steps": sampling.steps,
            "guided_steps": sum(s > 1.0 for s in guidance_scales(sampling)),
            "guidance_scale": sampling.guidance_scale,
            "scheduler": sampling.scheduler,
            "history_turns": settings.history_turns,
            "prompt_tokens": prompt_tokens,
            "state_tokens": STATE_TOKENS,
            "video_tokens": latent_shape[0] * (latent_shape[2] // 2) * (latent_shape[3] // 2),
            "condition_tokens": decoder.num_condition_tokens,
            "decoder_dtype": str(decoder.dtype).removeprefix("torch."),
        },
        "plain": plain,
        "ours": ours,
        "speedup": speedup,
        "outputs": {
            "shot_embeds_rel_diff": relative_difference(ours_shot, plain_shot),
            "latents_rel_diff": relative_difference(ours_latents, plain_latents),
            # bf16 noise floor: each path against the plain path with float32 MLLM weights
            "shot_embeds_rel_diff_plain_vs_fp32": relative_difference(plain_shot, reference_shot),
            "shot_embeds_rel_diff_ours_vs_fp32": relative_difference(ours_shot, reference_shot),
            # our VAE decode vs the plain one, from the same latents (uint8 frames)
            "frames_mean_abs_diff": float(frames_diff.mean()),
            "frames_max_abs_diff": float(frames_diff.max()),
        },
        "flops": {"denoise_step_branch": step_flops, "denoise": denoise_flops},
        "play_turn": {
            "path": "AnimeGamer.play_turn on our path's modules: MLLM + denoising + streamed VAE decode, no file "
                    "written",
            "turn_s": whole.median,
            "peak_memory_gb": whole_mem,
            "raw_s": whole.seconds,
        },
        "fast": {
            "steps": fast.steps,
            "guided_steps": sum(s > 1.0 for s in guidance_scales(fast)),
            "denoise_s": fast_den.median,
            "turn_s": fast_turn,
            "speedup_vs_plain": plain["turn_s"] / fast_turn,
            "speedup_vs_ours": ours["turn_s"] / fast_turn,
            "peak_memory_gb": fast_den_mem,
        },
        "sdpa_backends": backends,
        "raw_s": {
            "plain": {"mllm_prefill": plain_pre.seconds, "mllm": plain_mllm.seconds, "denoise": plain_den.seconds,
                      "vae_decode": plain_vae.seconds},
            "ours": {"mllm_prefill": ours_pre.seconds, "mllm_states": ours_states.seconds, "mllm": ours_mllm.seconds,
                     "denoise": ours_den.seconds, "vae_decode": ours_vae.seconds},
            "fast": {"denoise": fast_den.seconds},
        },
    }

    if profile_dir is not None:
        result["profile"] = str(profile_turn(decoder, mllm, history, instruction, shot, levels, sampling, device,
                                             Path(profile_dir)))

    if settings.low_memory:
        # The 24 GB option: each model on the GPU only while it runs, the VAE decoded in tiles.
        game = AnimeGamer(MLLMPredictor(mllm, str(device), offload=True),
                          DecoderRenderer(decoder, sampling, str(device), offload=True),
                          history_turns=settings.history_turns, seed=settings.seed)
        mllm.to("cpu")
        decoder.to("cpu")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        decoder.vae.enable_tiling()

        def offloaded_turn():
            game.play_turn(earlier, instruction)

        # Tiles are new shapes to a compiled VAE decoder (minutes of compiling again): it runs eagerly here.
        with torch.compiler.set_stance("force_eager") if settings.compile_vae else nullcontext():
            timing, peak = part(offloaded_turn)
        decoder.vae.disable_tiling()
        result["low_memory"] = {
            "offload": "sequential",
            "vae_tiling": True,
            "compiled": settings.compile and not settings.compile_vae,  # force_eager covers the blocks too
            "turn_s": timing.median,
            "peak_memory_gb": peak,
            "raw_s": timing.seconds,
        }
    return result


def sdpa_backend_steps(decoder, shot, levels, sampling: SamplingConfig, device, warmup: int, repeats: int) -> dict:
    """Seconds of one eager CFG-batched denoising step under each fused SDPA kernel (CUDA only; {} on a CPU).

    A kernel that cannot run these shapes is reported as null. Which one PyTorch picks by default decides a large
    part of the step time at 7k-token attention.
    """
    if torch.device(device).type != "cuda":
        return {}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    shape = decoder.latent_shape(sampling.num_frames, sampling.height, sampling.width)
    x = torch.randn(2, *shape, device=decoder.device)
    t = torch.tensor([500, 500], device=decoder.device)
    shots = torch.cat([decoder.null_shot_embeds(1, decoder.device, shot.dtype), shot.to(decoder.device)])
    level_pair = torch.cat([levels, levels])
    out = {}
    for name in ("default", "flash", "efficient", "cudnn"):
        backend = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                   "cudnn": SDPBackend.CUDNN_ATTENTION}.get(name)

        def step(backend=backend):
            with torch.no_grad():
                if backend is None:
                    return decoder(x, t, shots, level_pair)
                with sdpa_kernel(backend):
                    return decoder(x, t, shots, level_pair)

        try:
            out[name] = measure(step, device, warmup, repeats).median
        except RuntimeError:  # this kernel does not support the shapes/dtype on this device
            out[name] = None
    return out


def profile_turn(decoder, mllm, history, instruction, shot, levels, sampling, device, out_dir: Path) -> Path:
    """torch.profiler table of one turn on our path (sorted by device time on a GPU): where the time goes."""
    from torch.profiler import ProfilerActivity, profile, record_function

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        with record_function("mllm"):
            predict_turn(mllm, history, instruction)
        with record_function("denoise"):
            latents = sample(decoder, shot, levels, sampling, generator=torch.Generator().manual_seed(0), decode=False)
        with record_function("vae_decode"):
            decoder.decode_latents(latents)
    sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "profile_turn.txt"
    atomic_write_text(path, prof.key_averages().table(sort_by=sort, row_limit=40) + "\n")
    return path
