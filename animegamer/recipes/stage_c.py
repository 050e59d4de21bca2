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

from animegamer.config import StageCConfig
from animegamer.data import stage_c as data
from animegamer.data.manifest import read_manifest
from animegamer.data.stage_c import (
    check_prediction_settings,
    fill_predictions,
    prediction_settings,
    select_windows,
)
from animegamer.data.tensor_store import TensorStore
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.mllm_tokenizer import load_tokenizer
from animegamer.models.trained import DECODER_DIR, load_decoder
from animegamer.tokens import TurnLayout, get_vocabulary
from animegamer.training.loop import Recipe, train
from animegamer.training.losses import diffusion_loss


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


class StageC(Recipe):
    """Stage (c): the frozen MLLM's predictions made once, then only the decoder's LoRA + motion embedding train."""

    config_class = StageCConfig
    project = "stage_c"

    def check(self) -> None:
        if not self.cfg.predictions_cache:
            self.cfg.predictions_cache = str(Path(self.cfg.output_dir) / "predictions")

    def build(self, resume) -> None:
        cfg, accelerator = self.cfg, self.accelerator
        # data and the trained stage (a) decoder first: bad input fails before the MLLM loads
        manifest = read_manifest(cfg.data.manifest)
        tokenizer, _ = load_tokenizer(cfg.mllm.pretrained, cfg.mllm.vocabulary, cfg.mllm.num_slots)
        layout = TurnLayout(tokenizer, get_vocabulary(cfg.mllm.vocabulary), cfg.mllm.num_slots)
        windows, self.left_out = select_windows(cfg, manifest, layout)
        settings = prediction_settings(cfg)
        check_prediction_settings(cfg.predictions_cache, settings)
        set_seed(cfg.seed)
        self.model = decoder = build_decoder(cfg)
        tcfg = decoder.transformer.config
        want = (decoder.num_condition_tokens, tcfg.num_attention_heads * tcfg.attention_head_dim)
        if (cfg.mllm.num_slots, cfg.mllm.shot_dim) != want:
            raise ValueError(
                f"the MLLM predicts s_a of ({cfg.mllm.num_slots}, {cfg.mllm.shot_dim}) = (mllm.num_slots, "
                f"mllm.shot_dim) but the decoder takes {want}; the two configs must describe the stage (a) / (b) runs"
            )

        # the frozen MLLM's predictions, made once; every process predicts a share, the main one writes
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
            accelerator.print(summary)
            del mllm  # its memory goes to the decoder
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        accelerator.wait_for_everyone()  # the main process has written the last shard
        self.dataset = data.build_dataset(cfg, manifest, windows)
        first = self.dataset[0]
        if first["latents"].shape[1] != tcfg.in_channels:
            raise ValueError(f"latents in {cfg.data.features_dir} have {first['latents'].shape[1]} channels; the "
                             f"decoder's transformer takes {tcfg.in_channels} (decoder.pretrained)")
        train = cfg.train
        self.summary = (f"{len(self.dataset)} clips; {accelerator.num_processes} process(es); batch "
                        f"{train.batch_size} x {train.grad_accum}")

    def load_weights(self, checkpoint: Path) -> None:
        self.model.load_trained(checkpoint / DECODER_DIR)

    def loss(self, model, core, batch, step, micro):
        return {"loss": compute_loss(model, core, batch, self.cfg)}  # noise, timesteps, dropout differ per process

    def save_weights(self, core, state, checkpoint: Path) -> None:
        core.save_trained(checkpoint / DECODER_DIR, state)


def main(argv: list[str] | None = None) -> Path:
    """Train stage (c) from a command line (``--config FILE key=value ... [--resume latest|PATH]``)."""
    return train(StageC, __doc__, argv)
