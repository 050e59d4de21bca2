"""Training throughput of stage (a) and stage (b): one optimizer step timed as the stage scripts take it.

A step is forward (under the run config's mixed precision) + backward + gradient clipping + AdamW step (the
project's ``build_optimizer``) + zero_grad, on a batch already on the device (data loading is not timed: features
are precomputed and the loaders prefetch). The plain path is that step eager; ours compiles the transformer blocks
when ``compile`` is on (``train.compile`` of the stage scripts). Gradient checkpointing, batch size, LoRA and
precision are the run config's.

MFU conventions, against the matmul peak measured in the same run:

    stage (a): 3 x forward FLOPs per clip (FlopCounterMode on one batch-1 forward of encoder + decoder)
    stage (b): 6 N T + 12 L d sum(S^2) (N = weights of the linears every token passes, LoRA included; the loss
               reads logits at the value tokens only, so the LM head is left out)
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from animegamer.bench.models import Architecture, tokenwise_linear_params
from animegamer.bench.timing import PeakMemory, count_flops, measure, mllm_training_flops
from animegamer.bench.turn import INSTRUCTIONS
from animegamer.config import StageAConfig, StageBConfig, TrainConfig
from animegamer.data.stage_b import StageBCollator, move_batch
from animegamer.states import StateValues
from animegamer.tokens import TurnSpec
from animegamer.training.losses import stage_b_loss
from animegamer.training.optim import build_optimizer

PRECISION = {"bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class StepSettings:
    warmup: int = 3
    repeats: int = 10
    compile: bool = False


def autocast(device: torch.device, mixed_precision: str):
    """What ``accelerator.prepare`` wraps the forward in for ``train.mixed_precision`` (no | bf16 | fp16)."""
    if mixed_precision == "no":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=PRECISION[mixed_precision])


def make_step(loss_fn: Callable[[], torch.Tensor], optimizer, params, train: TrainConfig, device) -> Callable:
    """One optimizer step of ``loss_fn`` (forward under autocast, backward, clip, AdamW, zero_grad)."""

    def step():
        with autocast(device, train.mixed_precision):
            loss = loss_fn()
        loss.backward()
        if train.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(params, train.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _timed(step: Callable, device, settings: StepSettings) -> dict:
    with PeakMemory(device) as mem:
        timing = measure(step, device, settings.warmup, settings.repeats)
    return {"step_s": timing.median, "peak_memory_gb": mem.peak_gb, "raw_s": timing.seconds}


def stage_a_batch(arch: Architecture, cfg: StageAConfig, device, seed: int = 0) -> dict[str, torch.Tensor]:
    """A stage (a) batch of the config's size and clip shape, as the feature dataset yields it."""
    data, batch = cfg.data, cfg.train.batch_size
    temporal = arch.vae["temporal_compression_ratio"]
    if (data.num_frames - 1) % temporal:
        raise ValueError(f"data.num_frames={data.num_frames} is not {temporal}k + 1")
    latent = (
        (data.num_frames - 1) // temporal + 1,
        arch.vae["latent_channels"],
        data.height // arch.spatial_compression,
        data.width // arch.spatial_compression,
    )
    feature_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[data.feature_dtype]
    g = torch.Generator().manual_seed(seed)
    return {
        "latents": torch.randn(batch, *latent, generator=g).to(device),  # (B, F, C, h, w)
        "clip_tokens": torch.randn(batch, data.clip_frames, arch.clip_tokens, arch.clip_dim, generator=g)
        .to(feature_dtype)
        .to(device),  # (B, K, Nc, Dc)
        "text_tokens": torch.randn(batch, arch.text_tokens, arch.text_dim, generator=g).to(feature_dtype).to(device),
        "motion_level": torch.randint(1, 6, (batch,), generator=g).to(device),
    }


def bench_stage_a(model, cfg: StageAConfig, compute_loss: Callable, arch: Architecture, device, peak_flops: float,
                  settings: StepSettings) -> dict:
    """Clips/s and MFU of a stage (a) step (``model``: the recipe's EncoderDecoder; ``compute_loss`` its loss).

    Joint phase (encoder, LoRA and motion embedding all stepped); the warm-up phase differs only in a zero lr.
    """
    device = torch.device(device)
    train = cfg.train
    batch = stage_a_batch(arch, cfg, device, settings.warmup)
    encoder_params, decoder_params = list(model.encoder.parameters()), model.decoder.trainable_parameters()
    optimizer = build_optimizer([{"params": encoder_params}, {"params": decoder_params}], train)
    model.train()

    one = {k: v[:1] for k, v in batch.items()}
    with torch.no_grad():
        forward_flops = count_flops(lambda: compute_loss(model, model, one, cfg))
    step = make_step(lambda: compute_loss(model, model, batch, cfg), optimizer, encoder_params + decoder_params,
                     train, device)
    plain = _timed(step, device, settings)
    if settings.compile:
        model.decoder.compile_blocks()
    ours = _timed(step, device, settings)
    flops_per_clip = 3 * forward_flops
    for path in (plain, ours):
        path["clips_per_s"] = train.batch_size / path["step_s"]
        path["mfu"] = flops_per_clip * path["clips_per_s"] / peak_flops
    data = cfg.data
    return {
        "settings": {
            "config": "",
            "batch_size": train.batch_size,
            "clip": f"{data.num_frames}x{data.height}x{data.width}",
            "latent_shape": list(batch["latents"].shape[1:]),
            "gradient_checkpointing": cfg.decoder.gradient_checkpointing,
            "lora_rank": cfg.decoder.lora_rank,
            "mixed_precision": train.mixed_precision,
            "dtype": cfg.decoder.dtype,
            "compile": settings.compile,
        },
        "flops_per_clip": flops_per_clip,
        "plain": plain,
        "ours": ours,
        "speedup": plain["step_s"] / ours["step_s"],
    }


def stage_b_batch(model, cfg: StageBConfig, device, seed: int = 0) -> tuple[dict, list[int]]:
    """A collated stage (b) batch of ``train.batch_size`` windows of ``data.history_turns`` + 1 turns, and the
    real length of every row (the dataset's layout and the script's collator)."""

    layout, slots, dim = model.layout, model.num_slots, model.shot_dim
    g = torch.Generator().manual_seed(seed)
    values = StateValues(motion_level=3, social=1, entertainment=0, stamina=1)
    items = []
    for b in range(cfg.train.batch_size):
        turns = [TurnSpec(INSTRUCTIONS[(b + i) % len(INSTRUCTIONS)], values) for i in range(cfg.data.history_turns)]
        turns.append(TurnSpec(INSTRUCTIONS[b % len(INSTRUCTIONS)], values, is_current=True))
        seq = layout.build_sequence(turns)
        if len(seq) > cfg.max_seq_len:
            raise ValueError(f"a {len(turns)}-turn window is {len(seq)} tokens, over max_seq_len={cfg.max_seq_len}")
        history = len(turns) - 1
        items.append({
            "input_ids": torch.tensor(seq.input_ids),
            "labels": torch.tensor(seq.labels),
            "history_positions": torch.tensor(seq.slot_positions[:-1], dtype=torch.long).view(history, slots),
            "history_shots": torch.randn(history, slots, dim, generator=g),
            "query_positions": torch.tensor(seq.slot_positions[-1]),
            "target_shot": torch.randn(slots, dim, generator=g),
        })
    pad = layout.tokenizer.pad_token_id
    collator = StageBCollator(pad if pad is not None else layout.tokenizer.eos_token_id, cfg.max_seq_len,
                              cfg.pack_sequences)
    batch = collator(items)
    return move_batch(batch, device), [len(i["input_ids"]) for i in items]


def bench_stage_b(model, cfg: StageBConfig, device, peak_flops: float, settings: StepSettings) -> dict:
    """Tokens/s and MFU of a stage (b) step of ``model`` (an AnimeGamerMLLM built with the run's settings)."""
    device = torch.device(device)
    train = cfg.train
    batch, lengths = stage_b_batch(model, cfg, device, settings.warmup)
    params = model.trainable_parameters()
    optimizer = build_optimizer(params, train)
    model.train()
    step = make_step(lambda: stage_b_loss(model(batch), batch["target_shots"], cfg.mse_weight,
                                          cfg.cosine_weight)["loss"], optimizer, params, train, device)
    plain = _timed(step, device, settings)
    if settings.compile:
        model.compile_blocks()
    ours = _timed(step, device, settings)

    llm_config = model.llm.get_base_model().config
    tokenwise = tokenwise_linear_params(model.backbone.layers)
    attention_width = llm_config.num_attention_heads * getattr(
        llm_config, "head_dim", llm_config.hidden_size // llm_config.num_attention_heads
    )
    flops = mllm_training_flops(tokenwise, llm_config.num_hidden_layers, attention_width, lengths)
    tokens = sum(lengths)
    for path in (plain, ours):
        path["tokens_per_s"] = tokens / path["step_s"]
        path["mfu"] = flops / path["step_s"] / peak_flops
    return {
        "settings": {
            "config": "",
            "batch_size": train.batch_size,
            "history_turns": cfg.data.history_turns,
            "tokens_per_step": tokens,
            "padded_shape": list(batch["input_ids"].shape),
            "gradient_checkpointing": cfg.mllm.gradient_checkpointing,
            "lora_rank": cfg.mllm.lora_rank,
            "lora_targets": list(cfg.mllm.lora_targets),
            "mixed_precision": train.mixed_precision,
            "dtype": cfg.mllm.dtype,
            "pack_sequences": cfg.pack_sequences,
            "compile": settings.compile,
        },
        "flops_per_step": flops,
        "tokenwise_params": tokenwise,
        "plain": plain,
        "ours": ours,
        "speedup": plain["step_s"] / ours["step_s"],
    }
