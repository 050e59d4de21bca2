"""benchmark.json -> the markdown tables printed by scripts/benchmark.py and pasted into the README."""

from __future__ import annotations

from typing import Any


def _s(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}×"


def _rate(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}"


def _mfu(x: float | None) -> str:
    """An MFU as a percentage; one above 100% is marked (see :func:`mfus_above_peak`)."""
    return "—" if x is None else f"{100 * x:.1f}%" + (" †" if x > 1 else "")


def mfus_above_peak(result: dict[str, Any]) -> list[str]:
    """The MFUs of a run that exceed 1. The peak is a matmul timed in the same run; on a busy device (shared CPU
    cores) it can be timed slower than the model's own matmuls ran, and such an MFU says nothing."""
    found = []
    turn = result.get("turn") or {}
    for path in ("plain", "ours"):
        if (turn.get(path) or {}).get("denoise_mfu", 0) > 1:
            found.append(f"turn.{path}.denoise_mfu")
    for stage, parts in (result.get("training") or {}).items():
        for path in ("plain", "ours"):
            if (parts.get(path) or {}).get("mfu", 0) > 1:
                found.append(f"training.{stage}.{path}.mfu")
    return found


def _rel(x: float | None) -> str:
    return "—" if x is None else f"{x:.1e}"


def _gb(x: float | None) -> str:
    return "—" if x is None else f"{x:.2f}"


def _precision(settings: dict) -> str:
    autocast = settings["mixed_precision"]
    return f"{settings['dtype']} weights" + ("" if autocast == "no" else f", {autocast} autocast")


def options_table(result: dict[str, Any]) -> list[str]:
    """The ``options`` part: each real-time option's denoising, calls per clip and time to the first frames."""
    options = result.get("options")
    if not options:
        return []
    mllm = (result.get("turn") or {}).get("ours", {}).get("mllm_s")
    first = next(iter(options["rows"].values()))["first_frames"]
    lines = [
        f"**Real-time options** (our path, LoRA merged, eager; against the paper's {options['settings']['steps']} "
        f"steps; the distilled row samples at t={options['settings']['student_timesteps']} with random weights):",
        "",
        "| option | transformer calls per clip | attention work | denoising (s) | vs standard | "
        f"first {first} frames after (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in options["rows"].items():
        work = "—" if row["attention_work"] is None else f"{100 * row['attention_work']:.0f}%"
        lines.append(
            f"| {name} | {row['transformer_calls']:g} | {work} | {_s(row['denoise_s'])} | "
            f"{_ratio(row['speedup_vs_standard'])} | {_s(row['time_to_first_frame_s'])} |"
        )
    mllm_note = f"the MLLM adds {_s(mllm)} s (turn part)" if mllm is not None else "the MLLM's time is the turn part's"
    lines += ["", f"First frames: denoising + the first chunk of the streamed VAE decode; {mllm_note}."]
    lines += [f"Not measured: {why}" for why in options.get("skipped", [])]
    return lines + [""] + turn_profile_table(options, mllm)


def turn_profile_table(options: dict[str, Any], mllm: float | None) -> list[str]:
    """Where a turn's time goes per option: MLLM (the turn part's, when it ran), denoising, the whole VAE decode and
    writing the clip (mp4 + gif; the last two the same work for every option, timed once)."""
    profile = options.get("profile")
    if not profile:
        return []
    extra = mllm or 0.0
    lines = [
        f"**Where a turn's time goes** ({profile['frames']} frames; MLLM from the turn part"
        f"{'' if mllm is not None else ': not run, counted as 0'}):",
        "",
        "| option | MLLM (s) | transformer calls | denoising (s) | VAE decode (s) | writing mp4 + gif (s) | "
        "turn (s) | first frames after the instruction (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in options["rows"].items():
        lines.append(
            f"| {name} | {_s(mllm)} | {row['transformer_calls']:g} | "
            f"{_s(row['denoise_s'])} | {_s(profile['vae_decode_s'])} | {_s(profile['write_s'])} | "
            f"{_s(extra + row['render_s'])} | {_s(extra + row['time_to_first_frame_s'])} |"
        )
    if profile["write_s"] is None:
        lines += ["", f"Writing not measured ({profile.get('write_error', 'failed')}): the turn column leaves it out."]
    return lines + [""]


def decode_table(result: dict[str, Any]) -> list[str]:
    """The ``decode`` part: the full VAE against the small causal decoder on the same 4-step latents."""
    decode = result.get("decode")
    if not decode:
        return []
    params = decode["parameters"]
    lines = [
        f"**Decode: full VAE vs the small causal decoder** (4-step latents {decode['settings']['latents']}, random "
        f"weights; VAE decoder {params['vae_decoder'] / 1e6:.2f} M parameters, small "
        f"{params['small_decoder'] / 1e6:.2f} M; 4-step denoising {_s(decode['denoise_s'])} s):",
        "",
        "| decoder | decode (s) | vs full | first chunk (s) | first frames | 4-step turn to first frames (s) | "
        "4-step render (s) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in decode["rows"].items():
        lines.append(
            f"| {name} | {_s(row['decode_s'])} | {_ratio(row['decode_speedup'])} | {_s(row['first_chunk_s'])} | "
            f"{row['first_frames']} of {row['frames']} | {_s(row['time_to_first_frames_s'])} | {_s(row['render_s'])} |"
        )
    return lines + ["", "Turn times leave out the MLLM (the turn part's) and writing the clip.", ""]


def _syncs(row: dict[str, Any]) -> str:
    """A row's MLLM host syncs: the counter's / CUDA's, whichever were measured."""
    counts = [row.get("mllm_host_syncs"), row.get("mllm_host_syncs_cuda")]
    if counts[1] is None:
        return "" if counts[0] is None else str(counts[0])
    return " / ".join("–" if c is None else str(c) for c in counts)


def fast_path_table(result: dict[str, Any]) -> list[str]:
    """The ``fast_path`` part: the game's whole turn on the fast path, eager/compiled, bf16/FP8, small decoder."""
    fast = result.get("fast_path")
    if not fast:
        return []
    st, params, writing = fast["settings"], fast["parameters"], fast["writing"]
    steps = len(st["student_timesteps"])
    lines = [
        f"**The fast turn** (play_turn end to end: the MLLM with K={st['history_turns']}, the {steps}-step student, "
        f"the small decoder's streamed decode; {st['dtype']}, latents {st['latents']}, random weights; small decoder "
        f"{params['small_decoder'] / 1e6:.2f} M parameters against the VAE decoder's "
        f"{params['vae_decoder'] / 1e6:.1f} M; {steps}-step denoising {fast['denoise_tflop']:.3g} TFLOP):",
        "",
        "| row | MLLM (s) | MLLM host syncs | denoising (s) | MFU | small decode (s) | turn (s) | "
        "first frames after (s) | turn with the VAE (s) | peak (GB) | latents vs eager |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in fast["rows"].items():
        if "error" in row:
            lines.append(f"| {name} | failed: {row['error']} ||||||||||")
            continue
        lines.append(
            f"| {name} | {_s(row['mllm_s'])} | {_syncs(row)} | {_s(row['denoise_s'])} | {_mfu(row['denoise_mfu'])} | "
            f"{_s(row['small_decode_s'])} | {_s(row['turn_s'])} | {_s(row['time_to_first_frames_s'])} | "
            f"{_s(row['turn_with_vae_s'])} | {_gb(row['peak_memory_gb'])} | {_rel(row['latents_vs_eager'])} |"
        )
    write = (f"writing the clip (gif + mp4, {st['frames'][0]} frames of {st['frames'][2]}x{st['frames'][1]}) "
             f"{_s(writing['write_s'])} s on this machine's CPU, off the turn's critical path"
             if writing.get("write_s") is not None else f"writing not measured ({writing.get('error', 'failed')})")
    vae = (f"{_s(fast['vae_decode_s'])} s; its first chunk of {fast['vae_first_frames']} frames "
           f"{_s(fast['vae_first_chunk_s'])} s" if fast.get("vae_decode_s") is not None
           else f"not measured: {fast.get('vae_error')}")
    lines += [
        "",
        f"Turn: timed whole, no file written. First frames: MLLM + denoising + the small decoder's first chunk. "
        f"Turn with the VAE: MLLM + denoising + the VAE's decode ({vae}). MLLM host syncs: per turn, counted "
        f"by operator (HostSyncCounter) / by CUDA's sync debug mode on a GPU. Latents vs eager: relative L2 "
        f"distance of the row's latents from the eager row's. {write[0].upper() + write[1:]}.",
    ]
    if fast["skipped"]:
        lines.append("Not run: " + "; ".join(fast["skipped"]) + ".")
    return lines + [""]


def official_table(result: dict[str, Any]) -> list[str]:
    """The ``official`` part: release-layout weights converted, then one turn ``released`` vs ``fixed`` + fast."""
    off = result.get("official")
    if not off:
        return []
    st, conv, files = off["settings"], off["conversion"], off["release_files"]
    rel, fix, speed = off["released"], off["fixed"], off["speedup"]
    mem = "GPU memory allocated" if result["device"]["type"] == "cuda" else "process RSS"
    dec, llm = st["decoder"], st["mllm"]
    lines = [
        f"**Official release weights** (random, release layout: SAT DiT H {dec['hidden_size']} × {dec['num_layers']} "
        f"layers, LoRA r={dec['lora_rank']}, {dec['sat_dtype']}; Mistral H {llm['hidden_size']} × "
        f"{llm['num_hidden_layers']} layers, LoRA r={llm['lora_rank']}): agent .bin {files['agent_bin_mb']:,.1f} MB + "
        f"decoder checkpoint {files['decoder_checkpoint_mb']:,.1f} MB converted in {_s(conv['seconds'])} s, peak RSS "
        f"{conv['rss_mb']:,.0f} MB ({conv['anon_mb']:,.0f} MB anonymous, {conv['file_mb']:,.0f} MB file-backed), "
        f"{conv['converted_mb']:,.1f} MB written.",
        "",
        f"One turn on the converted weights, no history, {st['steps']} steps at {st['height']}×{st['width']}, "
        f"{st['num_frames']} frames; {st['dtype']} weights (released decoder: {st['released_decoder_dtype']}):",
        "",
        "| part | released (s) | fixed + fast path (s) | speedup | released / fixed calls |",
        "| --- | ---: | ---: | ---: | ---: |",
        f"| MLLM turn | {_s(rel['mllm_s'])} | {_s(fix['mllm_s'])} | {_ratio(speed['mllm'])} | "
        f"{rel['llm_forward_passes']} / {fix['llm_forward_passes']} LLM forward passes |",
        f"| denoising | {_s(rel['denoise_s'])} | {_s(fix['denoise_s'])} | {_ratio(speed['denoise'])} | "
        f"{rel['transformer_calls']} / {fix['transformer_calls']} transformer calls "
        f"({rel['transformer_rows']} / {fix['transformer_rows']} rows) |",
        f"| VAE decode (the same call in both modes, timed once) | {_s(rel['vae_decode_s'])} | "
        f"{_s(fix['vae_decode_s'])} | | |",
        f"| **turn** | **{_s(rel['turn_s'])}** | **{_s(fix['turn_s'])}** | **{_ratio(speed['turn'])}** | |",
        f"| peak {mem} (GB) | {_gb(rel['peak_memory_gb'])} | {_gb(fix['peak_memory_gb'])} | | |",
        "",
        off["note"],
        "",
    ]
    return lines


def markdown(result: dict[str, Any]) -> str:
    """The tables of one benchmark run, headed by device, date and versions."""
    dev = result["device"]
    mem = "peak GPU memory allocated" if dev["type"] == "cuda" else "peak process RSS"
    lines = [
        f"### Benchmark: preset `{result['preset']}` on {dev['name']} ({dev['type']}), {result['date'][:10]}",
        "",
        f"torch {dev['torch']}, diffusers {dev['diffusers']}, transformers {dev['transformers']}, peft {dev['peft']}"
        + (f", CPU threads: {dev['threads']}" if dev["type"] == "cpu" else "")
        + f". Peak matmul ({result['peak']['dtype']} {result['peak']['size']}³): "
        f"{result['peak']['tflops']:.3g} TFLOP/s. Turn parts: medians of {result['settings']['repeats']} timed calls "
        f"after {result['settings']['warmup']} untimed; training: {result['settings']['train_repeats']} after "
        f"{result['settings']['train_warmup']}.",
        "",
    ]
    if result.get("merged_from"):
        earlier = ", ".join(f"{part} on {date[:10]}" for part, date in result["merged_from"].items())
        lines += [f"Parts kept from earlier runs on this device: {earlier}.", ""]
    turn = result.get("turn")
    if turn:
        s, plain, ours = turn["settings"], turn["plain"], turn["ours"]
        speed = turn["speedup"]
        lines += [
            f"**One turn**: {s['height']}×{s['width']}, {s['num_frames']} frames ({s['latent_frames']} latent), "
            f"{s['steps']} {s['scheduler']} steps ({s['guided_steps']} with CFG {s['guidance_scale']:g}), "
            f"K={s['history_turns']} history turns ({s['prompt_tokens']} prompt tokens), {s['decoder_dtype']}.",
            "",
            f"| part | plain (s) | ours (s) | speedup | ours: {mem} (GB) |",
            "| --- | ---: | ---: | ---: | ---: |",
            f"| MLLM prefill + slots | {_s(plain['mllm_prefill_s'])} | {_s(ours['mllm_prefill_s'])} | "
            f"{_ratio(speed['mllm_prefill'])} | {_gb(ours['peak_memory_gb']['mllm'])} |",
            f"| state decoding | {_s(plain['mllm_states_s'])} | {_s(ours['mllm_states_s'])} | "
            f"{_ratio(speed['mllm_states'])} | |",
            f"| denoising ({s['steps']} steps; MFU plain / ours {_mfu(plain['denoise_mfu'])} / "
            f"{_mfu(ours['denoise_mfu'])}) | {_s(plain['denoise_s'])} | {_s(ours['denoise_s'])} | "
            f"{_ratio(speed['denoise'])} | {_gb(ours['peak_memory_gb']['denoise'])} |",
            f"| VAE decode | {_s(plain['vae_decode_s'])} | {_s(ours['vae_decode_s'])} | {_ratio(speed['vae_decode'])} "
            f"| {_gb(ours['peak_memory_gb']['vae_decode'])} |",
            f"| **turn** | **{_s(plain['turn_s'])}** | **{_s(ours['turn_s'])}** | **{_ratio(speed['turn'])}** | |",
        ]
        whole = turn.get("play_turn")
        if whole:
            lines.append(f"| whole turn by `AnimeGamer.play_turn` (no file written) | | {_s(whole['turn_s'])} | "
                         f"{_ratio(plain['turn_s'] / whole['turn_s'])} | {_gb(whole['peak_memory_gb'])} |")
        fast = turn["fast"]
        lines.append(
            f"| `fast` preset turn ({fast['steps']} steps, {fast['guided_steps']} with CFG) | | {_s(fast['turn_s'])} "
            f"| {_ratio(fast['speedup_vs_plain'])} | {_gb(fast['peak_memory_gb'])} |"
        )
        low = turn.get("low_memory")
        if low:
            lines.append(
                f"| turn with offload + VAE tiling{'' if low.get('compiled', True) else ', eager'} | | "
                f"{_s(low['turn_s'])} | "
                f"{_ratio(plain['turn_s'] / low['turn_s'])} | {_gb(low['peak_memory_gb'])} (whole turn) |"
            )
        out = turn["outputs"]
        lines += [
            "",
            f"Outputs, ours vs plain from the same seed: shot representation relative difference "
            f"{out['shot_embeds_rel_diff']:.1e}, final latents {out['latents_rel_diff']:.1e}; bf16 noise floor: shot "
            f"against float32 MLLM weights {out['shot_embeds_rel_diff_plain_vs_fp32']:.1e} (plain), "
            f"{out['shot_embeds_rel_diff_ours_vs_fp32']:.1e} (ours); VAE frames from the same latents differ by "
            f"{out['frames_mean_abs_diff']:.2f} / 255 on average (at most {out['frames_max_abs_diff']:.0f}).",
        ]
        if turn.get("sdpa_backends"):
            backends = ", ".join(f"{k} {_s(v)} s" for k, v in turn["sdpa_backends"].items())
            lines.append(f"One eager CFG-batched denoising step by SDPA kernel: {backends}.")
        lines.append("")
    lines += options_table(result)
    lines += decode_table(result)
    lines += fast_path_table(result)
    lines += official_table(result)
    train = result.get("training", {})
    if train:
        lines += [
            f"**Training steps** (one device; {mem}):",
            "",
            "| stage | settings | plain | ours | speedup | MFU plain / ours | memory plain / ours (GB) |",
            "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
        ]
        a = train.get("stage_a")
        if a:
            st = a["settings"]
            lines.append(
                f"| (a) clips/s | batch {st['batch_size']}, {st['clip']}, LoRA r={st['lora_rank']}, "
                f"{'checkpointing' if st['gradient_checkpointing'] else 'no checkpointing'}, {_precision(st)}"
                f"{', compiled' if st['compile'] else ''} | {_rate(a['plain']['clips_per_s'])} | "
                f"{_rate(a['ours']['clips_per_s'])} | {_ratio(a['speedup'])} | {_mfu(a['plain']['mfu'])} / "
                f"{_mfu(a['ours']['mfu'])} | {_gb(a['plain']['peak_memory_gb'])} / "
                f"{_gb(a['ours']['peak_memory_gb'])} |"
            )
        b = train.get("stage_b")
        if b:
            st = b["settings"]
            lines.append(
                f"| (b) tokens/s | batch {st['batch_size']} × K={st['history_turns']}+1 turns "
                f"({st['tokens_per_step']} tokens), LoRA r={st['lora_rank']}, "
                f"{'checkpointing' if st['gradient_checkpointing'] else 'no checkpointing'}, {_precision(st)}"
                f"{', compiled' if st['compile'] else ''} | {_rate(b['plain']['tokens_per_s'])} | "
                f"{_rate(b['ours']['tokens_per_s'])} | {_ratio(b['speedup'])} | {_mfu(b['plain']['mfu'])} / "
                f"{_mfu(b['ours']['mfu'])} | {_gb(b['plain']['peak_memory_gb'])} / "
                f"{_gb(b['ours']['peak_memory_gb'])} |"
            )
        if not result["settings"]["compile"]:
            lines += ["", "With compile off, plain and ours run the same training code: the ratio is noise."]
        lines.append("")
    above = mfus_above_peak(result)
    if above:
        lines += [
            f"† MFU above 100% ({', '.join(above)}): the matmul peak of this run was measured slower than the model "
            "ran, so the device was busy while it was timed; these MFUs are not a measurement.",
            "",
        ]
    lines += ["Conventions: " + " ".join(result["conventions"].values()), ""]
    return "\n".join(lines)
