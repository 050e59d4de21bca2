"""Stage (e): a small causal decoder for the frozen CogVideoX VAE's latents (animegamer.models.causal_decoder).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_e.py \\
        --config configs/stage_e.yaml
    python scripts/train_stage_e.py --config configs/tiny/stage_e.yaml              # tiny models on a laptop CPU
    python scripts/train_stage_e.py --config configs/stage_e.yaml --resume latest   # exact resume

Reads the clips' VAE latents from ``data.features_dir`` (the stage (a) feature store, scripts/precompute_features.py)
and their videos from ``data.manifest``; ``vae`` names the CogVideoX folder whose ``vae/config.json`` gives the latent
layout (channels, spatial and temporal compression). Where ``data.features_dir`` holds no stage (a) store, a
single-process run first encodes the missing clips with that VAE into a latents-only store
(animegamer.data.stage_e.precompute_latents); otherwise the VAE is never loaded.

One step: a batch of whole clips (every latent frame: CogVideoX encodes the first one differently), one random
spatial window of ``crop_size`` x ``crop_size`` latent cells per clip and the matching pixels of its real frames;
the small decoder decodes the window and the loss is the MSE to the real frames in [-1, 1]. The crop keeps a
full-size step cheap; the decoder is convolutional, so it decodes whole frames at inference.

Writes output_dir/{config.yaml, run_info.json, left_out.txt, metrics.csv | logs/} and
output_dir/checkpoints/step_XXXXXXX/{small_decoder/ (config.json + model.safetensors), optimizer + scheduler + RNG
state, trainer_state.json}. Play it with ``sampling.vae=small sampling.small_decoder=<output_dir>`` (inference).
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate.utils import set_seed
from tqdm.auto import tqdm

from animegamer.cli import fail
from animegamer.config import StageEConfig
from animegamer.data.manifest import ManifestError
from animegamer.data.stage_e import build_stage_e_dataset, precompute_latents
from animegamer.io import atomic_write_text
from animegamer.models.causal_decoder import WEIGHTS_FILE, CausalLatentDecoder, read_vae_layout
from animegamer.models.trained import SMALL_DECODER_DIR
from animegamer.models.weights import load_state_dict_file
from animegamer.training.batches import resumable_batches
from animegamer.training.checkpoint import save_checkpoint, skip_model_weights_in_state
from animegamer.training.engines import (
    configure_deepspeed,
    gather_trained_state,
    load_resume_weights,
    optimizer_step,
    seed_process,
)
from animegamer.training.optim import build_optimizer, build_scheduler
from animegamer.training.program import releases_output_dir, run_program
from animegamer.training.recipe import resume_point
from animegamer.training.run import build_accelerator, end_run, parse_stage_config, restore, start_run


def build_model(cfg: StageEConfig, layout: tuple[int, int, int]) -> CausalLatentDecoder:
    channels, spatial, temporal = layout
    return CausalLatentDecoder(channels, spatial, temporal, tuple(cfg.small_decoder.channels),
                               cfg.small_decoder.blocks_per_level)


def random_crop(latents: torch.Tensor, frames: torch.Tensor, crop: int, spatial: int) -> tuple[torch.Tensor, ...]:
    """One random window per clip: latents (B, F, C, h, w) -> (B, F, C, crop, crop) and frames (B, T, 3, H, W) ->
    (B, T, 3, crop * spatial, crop * spatial) at the same place. ``crop`` 0 (or one as large as the latents) keeps
    everything. Draws from the global RNG, which checkpoints save and restore."""
    h, w = latents.shape[-2:]
    if crop <= 0 or (crop >= h and crop >= w):
        return latents, frames
    ch, cw = min(crop, h), min(crop, w)
    lat_out, frame_out = [], []
    for i in range(latents.shape[0]):
        top = int(torch.randint(0, h - ch + 1, ()))
        left = int(torch.randint(0, w - cw + 1, ()))
        lat_out.append(latents[i, :, :, top : top + ch, left : left + cw])
        frame_out.append(frames[i, :, :, top * spatial : (top + ch) * spatial, left * spatial : (left + cw) * spatial])
    return torch.stack(lat_out), torch.stack(frame_out)


def compute_loss(model, batch: dict, cfg: StageEConfig, spatial: int) -> torch.Tensor:
    """The stage (e) loss of one micro-batch. ``model`` may be wrapped (DDP ...)."""
    frames = batch["frames"].permute(0, 1, 4, 2, 3).float() / 127.5 - 1.0  # (B, T, H, W, 3) uint8 -> (B, T, 3, H, W)
    latents, target = random_crop(batch["latents"], frames, cfg.crop_size, spatial)  # (B, F, C, c, c), (B, T, 3, ..)
    prediction = model(latents)[0]  # (B, T, 3, c * s, c * s)
    return torch.nn.functional.mse_loss(prediction.float(), target)


@releases_output_dir
def main(argv: list[str] | None = None) -> Path:
    cfg = parse_stage_config(StageEConfig, __doc__, argv)
    train = cfg.train
    if cfg.crop_size < 0:
        fail(f"crop_size={cfg.crop_size} must be >= 0 (0: whole frames)")

    accelerator = build_accelerator(cfg.output_dir, train)
    skip_model_weights_in_state(accelerator)
    out = Path(cfg.output_dir)
    say = accelerator.print

    # ---- the resume checkpoint, the VAE layout and the data: bad input fails here, before anything of the run is
    # written (a failed retry leaves a finished run's files alone)
    try:
        resume = resume_point(cfg, accelerator)
        layout = read_vae_layout(cfg.vae)
        if accelerator.num_processes == 1:
            written = precompute_latents(cfg.data, cfg.vae, accelerator.device)
            if written:
                say(f"latents: {written} clips encoded into {cfg.data.features_dir}")
        dataset, left_out = build_stage_e_dataset(cfg.data)
        set_seed(cfg.seed)
        model = build_model(cfg, layout)
    except (ManifestError, FileNotFoundError, ValueError) as exc:  # CheckpointError is a ValueError
        fail(str(exc))
    latent_channels, spatial, temporal = layout
    first = dataset[0]
    latents_shape, frame_count = tuple(first["latents"].shape), first["frames"].shape[0]  # (F, C, h, w), T
    if latents_shape[1] != latent_channels or model.num_frames(latents_shape[0]) != frame_count or \
            tuple(first["frames"].shape[1:3]) != (latents_shape[2] * spatial, latents_shape[3] * spatial):
        fail(f"latents {latents_shape} in {cfg.data.features_dir} and frames {tuple(first['frames'].shape)} do not "
             f"fit the VAE of {cfg.vae} ({latent_channels} channels, {spatial}x spatial, {temporal}x temporal)")
    if left_out:
        say(f"left out {len(left_out)} clip(s):")
        for line in left_out[:20]:
            say(f"  {line}")
        if accelerator.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(out / "left_out.txt", "".join(f"{line}\n" for line in left_out))
    say(
        f"{len(dataset)} clips; small decoder {sum(p.numel() for p in model.parameters()) / 1e6:.2f} M parameters; "
        f"{accelerator.num_processes} process(es); batch {train.batch_size} x {train.grad_accum}"
    )

    # ---- the whole small decoder trains
    if train.compile:
        model.compile_blocks()
    # the resume point's weights before prepare: the engine then shards the restored values
    load_resume_weights(resume, lambda path: model.load_state_dict(
        load_state_dict_file(path / SMALL_DECODER_DIR / WEIGHTS_FILE)))
    model.to(accelerator.device).train()  # before the optimizer: AdamW is fused on CUDA
    optimizer = build_optimizer(model.parameters(), train)
    lr_scheduler = build_scheduler(optimizer, train)
    configure_deepspeed(accelerator, train)
    wrapped, optimizer, lr_scheduler = accelerator.prepare(model, optimizer, lr_scheduler)
    core = accelerator.unwrap_model(wrapped)
    trained = [p for p in wrapped.parameters() if p.requires_grad]  # after prepare: the engine's own parameters

    def checkpoint(at_step: int, logs: dict) -> Path:
        # every process takes part in gathering; the main one writes
        state = gather_trained_state(core, accelerator.is_main_process)

        def save_weights(path: Path) -> None:
            core.save_pretrained(path / SMALL_DECODER_DIR, state)

        return save_checkpoint(accelerator, cfg.output_dir, at_step, save_weights, logs, keep=train.keep_checkpoints)

    # ---- resume: optimizer, lr schedule and every process's RNG (the weights: loaded above); the data order is a
    # function of the step
    seed_process(cfg.seed, accelerator)  # crops differ per process
    step = restore(accelerator, resume, lambda _path: None, train.allow_rng_reset)
    start_run(accelerator, cfg, "stage_e", resume)
    batches = resumable_batches(dataset, accelerator, train, cfg.seed, step, cfg.data.num_workers)

    # ---- loop
    progress = tqdm(total=train.max_steps, initial=step, desc="stage e", disable=not accelerator.is_main_process)
    loss_value = float("nan")
    while step < train.max_steps:
        step_loss = torch.zeros((), device=accelerator.device)
        for _ in range(train.grad_accum):
            batch = {k: v.to(accelerator.device, non_blocking=True) for k, v in next(batches).items()}
            with accelerator.accumulate(wrapped):
                loss = compute_loss(wrapped, batch, cfg, spatial)
                accelerator.backward(loss)
            step_loss += loss.detach() / train.grad_accum
        lr = lr_scheduler.get_last_lr()[0]  # the rate this step applies
        grad_norm = optimizer_step(accelerator, wrapped, optimizer, lr_scheduler, trained, train.max_grad_norm)
        step += 1

        progress.update(1)
        if step % train.log_every == 0 or step == train.max_steps:
            loss_value = accelerator.reduce(step_loss, "mean").item()
            accelerator.log(
                {
                    "loss": loss_value,
                    "grad_norm": grad_norm,
                    "lr": lr,
                },
                step=step,
            )
            progress.set_postfix(loss=f"{loss_value:.4f}")
        if step % train.checkpoint_every == 0 or step == train.max_steps:
            checkpoint(step, {"loss": loss_value})
    progress.close()
    accelerator.wait_for_everyone()
    end_run(accelerator)
    say(f"done: {step} steps; checkpoints in {out / 'checkpoints'}")
    return out


if __name__ == "__main__":
    run_program(main)
