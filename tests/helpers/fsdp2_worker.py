"""One process of the FSDP2 tests (tests/test_engines.py), started twice by torch's launcher on a gloo group:

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/fsdp2_worker.py decoder DECODER_DIR OUT_DIR
    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/fsdp2_worker.py mllm MISTRAL_DIR OUT_DIR

The model (``decoder``: the tiny stage (a)/(c)/(d) decoder, its CogVideoX blocks and the root; ``mllm``: the tiny
stage (b) MLLM, its Mistral decoder layers and the root) wrapped by torch's ``fully_shard`` as accelerate's FSDP2
plugin wraps them (configs/accelerate/fsdp_decoder.yaml, fsdp.yaml), trains 2 steps on a global batch of 2 (one
sample per process); a plain copy trains on the whole batch beside it. The saves go through the stages' own code:
the trained parts gathered by ``gather_trained_state`` and written by ``save_trained``; the resume loads the step 1
checkpoint into the bare model before it is sharded (as every stage does before ``accelerator.prepare``) and the
optimizer state into the sharded one. Writes OUT_DIR/{fsdp_step_1, fsdp_step_2, plain_step_2, resumed_step_2}/model.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import fully_shard

from animegamer.config import MLLMConfig
from animegamer.data.manifest import read_manifest
from animegamer.data.sequences import build_windows
from animegamer.data.stage_b import StageBCollator, StageBDataset
from animegamer.data.tensor_store import TensorStore
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.training.engines import gather_trained_state
from animegamer.training.losses import stage_b_loss
from tests.helpers.stage_b_data import write_stage_b_data
from tests.helpers.stage_scripts import tiny_decoder_config

LATENTS = (2, 4, 4, 6)  # (F, C, h, w): 2 latent frames of 4x6, the smallest the tiny decoder takes
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def moved_off_init(model):
    """``model`` in train mode with its trained parts moved off their initial values (LoRA B is 0 when fresh), the
    same draws for every model of one kind."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return model.train()


def build_decoder(pretrained: str) -> AnimationShotDecoder:
    """The tiny decoder with its trained parts moved off their initial values (LoRA B is 0 when fresh)."""
    torch.manual_seed(0)
    return moved_off_init(AnimationShotDecoder.from_config(tiny_decoder_config(pretrained), with_vae=False))


def shard_decoder(decoder: AnimationShotDecoder) -> AnimationShotDecoder:
    for block in decoder.transformer.transformer_blocks:
        fully_shard(block)
    fully_shard(decoder)
    return decoder


def decoder_batch(step: int, decoder: AnimationShotDecoder) -> dict[str, torch.Tensor]:
    """Step ``step``'s batch of 2, the same on every process."""
    g = torch.Generator().manual_seed(100 + step)
    width = decoder.transformer.config.num_attention_heads * decoder.transformer.config.attention_head_dim
    return {
        "noisy": torch.randn(2, *LATENTS, generator=g),
        "target": torch.randn(2, *LATENTS, generator=g),
        "timesteps": torch.randint(0, 1000, (2,), generator=g),
        "shots": torch.randn(2, decoder.num_condition_tokens, width, generator=g),
        "levels": torch.randint(1, 6, (2,), generator=g),
    }


def decoder_loss(model, batch: dict, rows: slice) -> torch.Tensor:
    prediction = model(batch["noisy"][rows], batch["timesteps"][rows], batch["shots"][rows], batch["levels"][rows])
    return torch.nn.functional.mse_loss(prediction, batch["target"][rows])


MLLM_SLOTS, MLLM_SHOT_DIM = 8, 16


def build_mllm(pretrained: str) -> AnimeGamerMLLM:
    """The tiny MLLM (no LoRA dropout: the plain copy must draw nothing the sharded one does not) with its trained
    parts moved off their initial values."""
    cfg = MLLMConfig(pretrained=pretrained, num_slots=MLLM_SLOTS, shot_dim=MLLM_SHOT_DIM, lora_rank=4, lora_alpha=8,
                     lora_dropout=0.0, gradient_checkpointing=False, dtype="fp32")
    torch.manual_seed(0)
    return moved_off_init(AnimeGamerMLLM.from_config(cfg))


def shard_mllm(model: AnimeGamerMLLM) -> AnimeGamerMLLM:
    for layer in model.backbone.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def mllm_batches(data: Path, model: AnimeGamerMLLM):
    """``batch(step)``: step ``step``'s two windows, collated one per row (each process trains one), with history."""
    manifest = read_manifest(data / "clips.jsonl")
    windows = build_windows(manifest, history_turns=1, split="all")
    dataset = StageBDataset(windows, manifest, TensorStore(data / "shot_targets"), model.layout, 512, MLLM_SHOT_DIM)
    pad_id = model.layout.tokenizer.pad_token_id
    collate = StageBCollator(pad_id=pad_id if pad_id is not None else model.layout.tokenizer.eos_token_id,
                             max_seq_len=512, pack=False)

    def batch(step: int) -> list[dict]:
        return [collate([dataset[(2 * step + row) % len(dataset)]]) for row in (0, 1)]

    return batch


def mllm_loss(model, rows_batch: list[dict], rows: slice) -> torch.Tensor:
    # the mean of the rows' losses: what the two processes' averaged gradients are the gradient of
    chosen = rows_batch[rows]
    return sum(stage_b_loss(model(b), b["target_shots"], 0.5, 0.0)["loss"] for b in chosen) / len(chosen)


MODELS = {
    "decoder": (build_decoder, shard_decoder, decoder_loss),
    "mllm": (build_mllm, shard_mllm, mllm_loss),
}


def train_step(model, optimizer, loss_fn, batch, rows: slice) -> None:
    loss_fn(model, batch, rows).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def save(model, path: Path, main: bool) -> None:
    state = gather_trained_state(model, main)  # a collective: every process
    if main:
        model.save_trained(path / "model", state)
    dist.barrier()


def main(kind: str, pretrained: str, out: Path) -> None:
    build, shard, loss_fn = MODELS[kind]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    main_process, mine = rank == 0, slice(rank, rank + 1)

    plain = build(pretrained)
    if kind == "mllm":
        if main_process:
            write_stage_b_data(out / "data", films=2, clips_per_film=4, num_slots=MLLM_SLOTS, shot_dim=MLLM_SHOT_DIM)
        dist.barrier()
        global_batch = mllm_batches(out / "data", plain)
    else:
        def global_batch(step: int) -> dict:
            return decoder_batch(step, plain)
    sharded = shard(copy.deepcopy(plain))
    plain_opt = torch.optim.AdamW(plain.trainable_parameters(), lr=1e-3)
    sharded_opt = torch.optim.AdamW([p for p in sharded.parameters() if p.requires_grad], lr=1e-3)

    for step in (1, 2):
        batch = global_batch(step)
        train_step(plain, plain_opt, loss_fn, batch, slice(0, 2))
        train_step(sharded, sharded_opt, loss_fn, batch, mine)  # FSDP2 averages the two processes' gradients
        save(sharded, out / f"fsdp_step_{step}", main_process)
        if step == 1:
            # a copy, as a checkpoint on disk is: the state dict shares tensors (AdamW's step count) with the live one
            optimizer_state = copy.deepcopy(get_optimizer_state_dict(sharded, sharded_opt, options=FULL))
    if main_process:
        plain.save_trained(out / "plain_step_2" / "model")

    # resume from step 1: weights into the bare model, then shard, then the optimizer state
    resumed = build(pretrained)
    resumed.load_trained(out / "fsdp_step_1" / "model")
    resumed = shard(resumed)
    resumed_opt = torch.optim.AdamW([p for p in resumed.parameters() if p.requires_grad], lr=1e-3)
    # the full state sits on the main process only (cpu_offload), as a checkpoint read there would
    set_optimizer_state_dict(resumed, resumed_opt, optimizer_state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    train_step(resumed, resumed_opt, loss_fn, global_batch(2), mine)
    save(resumed, out / "resumed_step_2", main_process)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], Path(sys.argv[3]))
