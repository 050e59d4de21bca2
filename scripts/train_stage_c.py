"""Stage (c): decoder adaptation. The frozen MLLM's predicted s_a of each training clip -> the real clip.

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_c.py \\
        --config configs/stage_c.yaml
    python scripts/train_stage_c.py --config configs/tiny/stage_c.yaml              # tiny models on a laptop CPU
    python scripts/train_stage_c.py --config configs/stage_c.yaml --resume latest   # exact resume

Needs the stage (a) run (``stage_a_checkpoint``: the decoder's LoRA + motion embedding to start from;
``shot_targets``: s_a of every clip; ``data.features_dir``: the clips' VAE latents) and the stage (b) run
(``stage_b_checkpoint``: the MLLM).

1. Predictions, once: for every stage (b) window of ``data.split`` the frozen MLLM (eval mode, no gradients, never
   handed to the optimizer or to ``accelerator.prepare``) predicts the current clip's s_a from its instruction and
   the teacher-forced history (earlier clips' stage (a) targets and true state values), exactly as at inference;
   ``history=own``: from its own predictions of the earlier clips, played from the film's start as a game does.
   They are cached in ``predictions_cache`` (default ``output_dir/predictions``; animegamer.data.stage_c); a rerun
   or resume reuses them and never loads the MLLM. With several processes each predicts a share and the main
   process writes.
2. Adaptation: only the decoder's LoRA and motion embedding train (paper: lr 5e-5, 10k steps). One step is the
   stage (a) step with the MLLM's prediction in place of the encoder's s_a: with probability
   ``condition_dropout`` it becomes the unconditional (zero) representation; the clip's real latents are noised
   at a uniform random timestep and the decoder, told the clip's motion level, regresses the scheduler's target
   (v-prediction for CogVideoX-2B) with an MSE loss, weighted towards changing latent cells as in stage (a) when
   ``motion_loss_weight`` > 0.

Writes output_dir/{config.yaml, run_info.json, left_out.txt, metrics.csv | logs/} and
output_dir/checkpoints/step_XXXXXXX/{decoder/, optimizer + scheduler + RNG state, trainer_state.json}; ``decoder/``
has stage (a)'s layout, so ``load_decoder(checkpoint, cfg.decoder)`` and inference's ``decoder_checkpoint`` take it.
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate.utils import gather_object, set_seed
from tqdm.auto import tqdm

from animegamer.cli import fail
from animegamer.config import StageCConfig
from animegamer.data.manifest import ManifestError, read_manifest
from animegamer.data.stage_c import (
    build_stage_c_dataset,
    check_prediction_settings,
    fill_predictions,
    prediction_settings,
    select_windows,
)
from animegamer.data.tensor_store import TensorStore
from animegamer.io import atomic_write_text
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.mllm import AnimeGamerMLLM, load_tokenizer
from animegamer.models.trained import DECODER_DIR, load_decoder
from animegamer.tokens import TurnLayout, get_vocabulary
from animegamer.training.batches import resumable_batches
from animegamer.training.checkpoint import save_checkpoint, skip_model_weights_in_state
from animegamer.training.engines import (
    configure_deepspeed,
    gather_trained_state,
    load_resume_weights,
    optimizer_step,
    seed_process,
)
from animegamer.training.losses import diffusion_loss
from animegamer.training.optim import build_optimizer, build_scheduler
from animegamer.training.program import releases_output_dir, run_program
from animegamer.training.recipe import resume_point
from animegamer.training.run import build_accelerator, end_run, parse_stage_config, restore, start_run


def load_frozen_mllm(cfg: StageCConfig, device: torch.device) -> AnimeGamerMLLM:
    """The stage (b) MLLM in eval mode with every parameter frozen: it only predicts."""
    model = AnimeGamerMLLM.from_config(cfg.mllm)
    model.load_trained(cfg.stage_b_checkpoint)
    return model.requires_grad_(False).to(device).eval()


def build_decoder(cfg: StageCConfig) -> AnimationShotDecoder:
    """The pretrained decoder with stage (a)'s LoRA + motion embedding (no VAE: latents are precomputed)."""
    return load_decoder(cfg.stage_a_checkpoint, cfg.decoder, with_vae=False).train()


def compute_loss(model, decoder: AnimationShotDecoder, batch: dict, cfg: StageCConfig) -> torch.Tensor:
    """The stage (c) loss of one micro-batch. ``model`` may be wrapped (DDP ...); ``decoder`` is the bare module."""
    latents = batch["latents"]  # (B, F, C, h, w)
    batch_size = latents.shape[0]
    shot_embeds = batch["shot_embeds"]  # (B, N, H), the MLLM's predictions
    dropped = torch.rand(batch_size, device=latents.device) < cfg.condition_dropout
    shot_embeds, levels = decoder.drop_conditions(shot_embeds, batch["motion_level"], dropped)  # for CFG
    noise = torch.randn_like(latents)
    scheduler = decoder.noise_scheduler
    timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (batch_size,), device=latents.device)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    prediction = model(noisy, timesteps, shot_embeds, levels)  # (B, F, C, h, w)
    target = decoder.training_target(latents, noise, timesteps)
    return diffusion_loss(prediction, target, latents, cfg.motion_loss_weight, cfg.motion_threshold)


@releases_output_dir
def main(argv: list[str] | None = None) -> Path:
    cfg = parse_stage_config(StageCConfig, __doc__, argv)
    if not cfg.predictions_cache:
        cfg.predictions_cache = str(Path(cfg.output_dir) / "predictions")
    train = cfg.train

    accelerator = build_accelerator(cfg.output_dir, train)
    skip_model_weights_in_state(accelerator)
    out = Path(cfg.output_dir)
    say = accelerator.print

    # ---- data, the resume checkpoint and the trained stage (a) decoder: bad input fails here, before the MLLM
    # loads and before anything of the run is written (a failed retry leaves a finished run's files alone)
    try:
        resume = resume_point(cfg, accelerator)
        manifest = read_manifest(cfg.data.manifest)
        tokenizer, _ = load_tokenizer(cfg.mllm.pretrained, cfg.mllm.vocabulary, cfg.mllm.num_slots)
        layout = TurnLayout(tokenizer, get_vocabulary(cfg.mllm.vocabulary), cfg.mllm.num_slots)
        windows, left_out = select_windows(cfg, manifest, layout)
        settings = prediction_settings(cfg)
        check_prediction_settings(cfg.predictions_cache, settings)
        set_seed(cfg.seed)
        decoder = build_decoder(cfg)
    except (ManifestError, FileNotFoundError, ValueError) as exc:  # CheckpointError is a ValueError
        fail(str(exc))
    tcfg = decoder.transformer.config
    want = (decoder.num_condition_tokens, tcfg.num_attention_heads * tcfg.attention_head_dim)
    if (cfg.mllm.num_slots, cfg.mllm.shot_dim) != want:
        fail(
            f"the MLLM predicts s_a of ({cfg.mllm.num_slots}, {cfg.mllm.shot_dim}) = (mllm.num_slots, mllm.shot_dim) "
            f"but the decoder takes {want}; the two configs must describe the stage (a) / (b) runs"
        )
    if left_out:
        say(f"left out {len(left_out)} clip(s):")
        for line in left_out[:20]:
            say(f"  {line}")
        if len(left_out) > 20:
            say(f"  ... and {len(left_out) - 20} more (see {out / 'left_out.txt'})")
        if accelerator.is_main_process:
            atomic_write_text(out / "left_out.txt", "".join(f"{line}\n" for line in left_out))

    # ---- the frozen MLLM's predictions, made once; every process predicts a share, the main one writes
    cache = TensorStore(cfg.predictions_cache)
    if any(w.current not in cache for w in windows):
        mllm = load_frozen_mllm(cfg, accelerator.device)
        summary = fill_predictions(
            mllm,
            windows,
            manifest,
            TensorStore(cfg.shot_targets),
            cfg.predictions_cache,
            settings,
            rank=accelerator.process_index,
            world_size=accelerator.num_processes,
            gather=gather_object,
            progress=accelerator.is_main_process,
            history=cfg.history,
        )
        say(summary)
        del mllm  # its memory goes to the decoder
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    accelerator.wait_for_everyone()  # the main process has written the last shard
    dataset = build_stage_c_dataset(cfg, manifest, windows)
    first = dataset[0]
    if first["latents"].shape[1] != tcfg.in_channels:
        fail(
            f"latents in {cfg.data.features_dir} have {first['latents'].shape[1]} channels; the decoder's "
            f"transformer takes {tcfg.in_channels} (decoder.pretrained)"
        )
    say(
        f"{len(dataset)} clips; {accelerator.num_processes} process(es); batch {train.batch_size} x {train.grad_accum}"
    )

    # ---- only the decoder's LoRA + motion embedding are optimised
    # the resume point's weights before prepare: the engine then shards the restored values
    load_resume_weights(resume, lambda path: decoder.load_trained(path / DECODER_DIR))
    decoder.to(accelerator.device)  # before the optimizer: AdamW is fused on CUDA
    optimizer = build_optimizer(decoder.trainable_parameters(), train)
    lr_scheduler = build_scheduler(optimizer, train)
    configure_deepspeed(accelerator, train)
    model, optimizer, lr_scheduler = accelerator.prepare(decoder, optimizer, lr_scheduler)
    core = accelerator.unwrap_model(model)
    trained = [p for p in model.parameters() if p.requires_grad]  # after prepare: the engine's own parameters

    def checkpoint(at_step: int, logs: dict) -> Path:
        # every process takes part in gathering; the main one writes
        state = gather_trained_state(core, accelerator.is_main_process)

        def save_weights(path: Path) -> None:
            core.save_trained(path / DECODER_DIR, state)

        return save_checkpoint(accelerator, cfg.output_dir, at_step, save_weights, logs, keep=train.keep_checkpoints)

    # ---- resume: optimizer, lr schedule and every process's RNG (the weights: loaded above); the data order is a
    # function of the step
    seed_process(cfg.seed, accelerator)  # noise, timesteps, dropout differ per process
    step = restore(accelerator, resume, lambda _path: None, train.allow_rng_reset)  # the weights: loaded above
    start_run(accelerator, cfg, "stage_c", resume)
    batches = resumable_batches(dataset, accelerator, train, cfg.seed, step, cfg.data.num_workers)

    # ---- loop
    progress = tqdm(total=train.max_steps, initial=step, desc="stage c", disable=not accelerator.is_main_process)
    loss_value = float("nan")
    while step < train.max_steps:
        step_loss = torch.zeros((), device=accelerator.device)
        for _ in range(train.grad_accum):
            batch = {k: v.to(accelerator.device, non_blocking=True) for k, v in next(batches).items()}
            with accelerator.accumulate(model):
                loss = compute_loss(model, core, batch, cfg)
                accelerator.backward(loss)
            step_loss += loss.detach() / train.grad_accum
        lr = lr_scheduler.get_last_lr()[0]  # the rate this step applies
        grad_norm = optimizer_step(accelerator, model, optimizer, lr_scheduler, trained, train.max_grad_norm)
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
