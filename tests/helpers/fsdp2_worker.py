"""One process of the FSDP2 test (tests/test_engines.py), started twice by torch's launcher on a gloo group:

    python -m torch.distributed.run --nproc_per_node 2 tests/helpers/fsdp2_worker.py DECODER_DIR OUT_DIR

The tiny decoder, its CogVideoX blocks and the root wrapped by torch's ``fully_shard`` as accelerate's FSDP2 plugin
wraps them (configs/accelerate/fsdp_decoder.yaml), trains 2 steps on a global batch of 2 (one sample per process);
a plain copy trains on the whole batch beside it. The saves go through the stages' own code: the trained parts
gathered by ``gather_trained_state`` and written by ``save_trained``; the resume loads the step 1 checkpoint into
the bare model before it is sharded (as every stage does before ``accelerator.prepare``) and the optimizer state
into the sharded one. Writes OUT_DIR/{fsdp_step_1, fsdp_step_2, plain_step_2, resumed_step_2}/decoder.
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

from animegamer.models.decoder import AnimationShotDecoder
from animegamer.training.engines import gather_trained_state
from tests.helpers.stage_scripts import tiny_decoder_config

LATENTS = (2, 4, 4, 6)  # (F, C, h, w): 2 latent frames of 4x6, the smallest the tiny decoder takes
FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def build(pretrained: str) -> AnimationShotDecoder:
    """The tiny decoder with its trained parts moved off their initial values (LoRA B is 0 when fresh)."""
    torch.manual_seed(0)
    decoder = AnimationShotDecoder.from_config(tiny_decoder_config(pretrained), with_vae=False)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in decoder.trainable_parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=generator))
    return decoder.train()


def shard(decoder: AnimationShotDecoder) -> AnimationShotDecoder:
    for block in decoder.transformer.transformer_blocks:
        fully_shard(block)
    fully_shard(decoder)
    return decoder


def global_batch(step: int, decoder: AnimationShotDecoder) -> dict[str, torch.Tensor]:
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


def train_step(model, optimizer, batch: dict, rows: slice) -> None:
    prediction = model(batch["noisy"][rows], batch["timesteps"][rows], batch["shots"][rows], batch["levels"][rows])
    torch.nn.functional.mse_loss(prediction, batch["target"][rows]).backward()
    torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def save(model, path: Path, main: bool) -> None:
    state = gather_trained_state(model, main)  # a collective: every process
    if main:
        model.save_trained(path / "decoder", state)
    dist.barrier()


def main(pretrained: str, out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    main_process, mine = rank == 0, slice(rank, rank + 1)

    plain = build(pretrained)
    sharded = shard(copy.deepcopy(plain))
    plain_opt = torch.optim.AdamW(plain.trainable_parameters(), lr=1e-3)
    sharded_opt = torch.optim.AdamW([p for p in sharded.parameters() if p.requires_grad], lr=1e-3)

    for step in (1, 2):
        batch = global_batch(step, plain)
        train_step(plain, plain_opt, batch, slice(0, 2))
        train_step(sharded, sharded_opt, batch, mine)  # FSDP2 averages the two processes' gradients
        save(sharded, out / f"fsdp_step_{step}", main_process)
        if step == 1:
            # a copy, as a checkpoint on disk is: the state dict shares tensors (AdamW's step count) with the live one
            optimizer_state = copy.deepcopy(get_optimizer_state_dict(sharded, sharded_opt, options=FULL))
    if main_process:
        plain.save_trained(out / "plain_step_2" / "decoder")

    # resume from step 1: weights into the bare model, then shard, then the optimizer state
    resumed = build(pretrained)
    resumed.load_trained(out / "fsdp_step_1" / "decoder")
    resumed = shard(resumed)
    resumed_opt = torch.optim.AdamW([p for p in resumed.parameters() if p.requires_grad], lr=1e-3)
    # the full state sits on the main process only (cpu_offload), as a checkpoint read there would
    set_optimizer_state_dict(resumed, resumed_opt, optimizer_state,
                             options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
    train_step(resumed, resumed_opt, global_batch(2, plain), mine)
    save(resumed, out / "resumed_step_2", main_process)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
