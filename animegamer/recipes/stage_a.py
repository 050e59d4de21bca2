"""Stage (a): train the action-aware encoder together with the CogVideoX decoder (LoRA + motion-level embedding).

    accelerate launch --config_file configs/accelerate/multi_gpu.yaml scripts/train_stage_a.py \\
        --config configs/stage_a.yaml
    accelerate launch --config_file configs/accelerate/deepspeed_zero3.yaml scripts/train_stage_a.py \\
        --config configs/stage_a.yaml                                                # or fsdp_decoder.yaml, ...
    python scripts/train_stage_a.py --config configs/tiny/stage_a.yaml              # tiny models on a laptop CPU
    python scripts/train_stage_a.py --config configs/stage_a.yaml --resume latest   # exact resume

For the first ``warmup_steps`` optimizer steps only the encoder learns: the decoder's LoRA and motion embedding sit
in an optimizer group whose learning rate is 0, so they stay bit-identical while the same DDP / DeepSpeed / FSDP
wrapping serves both phases. After that encoder, LoRA and motion embedding train jointly. The gradient norm is
clipped over all trained parameters in both phases, as DeepSpeed clips inside its own step: every engine trains the
same numbers.

Engines (DDP, DeepSpeed ZeRO-2/3 with or without offload, FSDP2) and multi-node launches: docs/training_at_scale.md.

One step: s_a = encoder(CLIP tokens of the first frame, T5 tokens of the motion text) (``shot_noise`` > 0: the
decoder reads it with Gaussian noise of that fraction of its std added, to be robust to the MLLM's errors); with
probability ``condition_dropout`` s_a becomes the decoder's unconditional (zero) representation, so CFG works at
sampling time (with ``decoder.motion_guidance`` the motion level becomes the null level 0 there too);
the clip's latents are noised at a uniform random timestep and the decoder regresses the scheduler's target
(v-prediction for CogVideoX-2B) with an MSE loss; ``motion_loss_weight`` > 0 weighs the latent cells that change
between latent frames extra (animegamer.training.losses; 0, the paper's plain MSE, by default).

Features (VAE latents, CLIP and T5 tokens) come from ``data.features_dir``; a single-process run precomputes the
clips that are missing there first (scripts/precompute_features.py does the same ahead of time). Clips without
features (corrupt/missing video, no tags) are reported by path and left out.

Writes output_dir/{config.yaml, run_info.json, metrics.csv | logs/}, output_dir/checkpoints/step_XXXXXXX/
{encoder/, decoder/, optimizer + scheduler + RNG state, trainer_state.json} and, at the end, output_dir/shot_targets
(s_a of every clip from the final encoder: the regression targets of stage b).
"""

from __future__ import annotations

from pathlib import Path

import torch
from accelerate.utils import set_seed
from torch import nn
from torch.optim.lr_scheduler import LambdaLR

from animegamer.config import StageAConfig
from animegamer.data import stage_a as data
from animegamer.data.features import count_pending_clips, precompute_features, write_shot_targets
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.trained import DECODER_DIR, ENCODER_DIR, save_encoder
from animegamer.models.weights import load_state_dict_file
from animegamer.training.engines import gather_trained_state, sub_state
from animegamer.training.loop import Recipe, train
from animegamer.training.losses import diffusion_loss
from animegamer.training.optim import lr_factor


def load_weights(model: EncoderDecoder, path: Path) -> None:
    """A checkpoint's trained encoder and decoder parts into the bare model (before ``prepare``)."""
    model.encoder.load_state_dict(load_state_dict_file(path / ENCODER_DIR / "model.safetensors"))
    model.decoder.load_trained(path / DECODER_DIR)


class EncoderDecoder(nn.Module):
    """Encoder and decoder under one root module, so DDP / DeepSpeed / FSDP wrap (and sync) them together."""

    def __init__(self, encoder: ActionAwareEncoder, decoder: AnimationShotDecoder):
        super().__init__()
        self.encoder = encoder
        self.decoder = decoder

    def forward(self, clip_tokens, text_tokens, dropped, noisy_latents, timesteps, motion_level,
                shot_noise: float = 0.0) -> torch.Tensor:
        shot_embeds = self.encoder(clip_tokens, text_tokens)  # (B, N, H)
        if shot_noise > 0:  # the decoder reads a perturbed s_a, as the MLLM's predictions will be
            shot_embeds = shot_embeds + shot_noise * shot_embeds.detach().std() * torch.randn_like(shot_embeds)
        shot_embeds, motion_level = self.decoder.drop_conditions(shot_embeds, motion_level, dropped)  # for CFG
        return self.decoder(noisy_latents, timesteps, shot_embeds, motion_level)  # (B, F, C, h, w)


def compute_loss(model, core: EncoderDecoder, batch: dict, cfg: StageAConfig) -> torch.Tensor:
    """The stage (a) loss of one micro-batch. ``model`` may be wrapped (DDP ...); ``core`` is the bare module."""
    latents = batch["latents"]  # (B, F, C, h, w)
    batch_size = latents.shape[0]
    clip_tokens = data.select_frame(batch["clip_tokens"], cfg.encoder.frame)  # (B, K, Nc, Dc) -> (B, Nc, Dc)
    dropped = torch.rand(batch_size, device=latents.device) < cfg.condition_dropout
    noise = torch.randn_like(latents)
    scheduler = core.decoder.noise_scheduler
    timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (batch_size,), device=latents.device)
    noisy = scheduler.add_noise(latents, noise, timesteps)
    prediction = model(clip_tokens, batch["text_tokens"], dropped, noisy, timesteps, batch["motion_level"],
                       cfg.shot_noise)
    target = core.decoder.training_target(latents, noise, timesteps)
    return diffusion_loss(prediction, target, latents, cfg.motion_loss_weight, cfg.motion_threshold)


class StageA(Recipe):
    """Stage (a): encoder and decoder (LoRA + motion embedding) under one root module; the decoder's group learns
    nothing during the encoder warm-up."""

    config_class = StageAConfig
    project = "stage_a"
    lr_names = ("lr_encoder", "lr_decoder")

    def build(self, resume) -> None:
        cfg, accelerator = self.cfg, self.accelerator
        # precomputed features, bad clips reported and left out
        if accelerator.num_processes == 1:
            summary = precompute_features(cfg, accelerator.device)
            if summary.written:
                accelerator.print(summary)
        else:
            pending = count_pending_clips(cfg.data)
            if pending:
                raise ValueError(
                    f"{pending} clips of {cfg.data.manifest} have no features in {cfg.data.features_dir}; "
                    f"run `python scripts/precompute_features.py --config ...` first (multi-process runs do not)"
                )
        self.dataset, self.left_out = data.build_dataset(cfg)
        first = self.dataset[0]
        clip_shape, text_shape = tuple(first["clip_tokens"].shape[1:]), tuple(first["text_tokens"].shape)
        want_clip, want_text = (
            (cfg.encoder.clip_tokens, cfg.encoder.clip_dim),
            (cfg.encoder.text_tokens, cfg.encoder.text_dim),
        )
        if clip_shape != want_clip or text_shape != want_text:
            raise ValueError(
                f"features have CLIP tokens {clip_shape} and T5 tokens {text_shape}, but the encoder config "
                f"expects {want_clip} and {want_text}; fix encoder.* or recompute the features"
            )
        train = cfg.train
        self.summary = (f"{len(self.dataset)} clips; {accelerator.num_processes} process(es); batch "
                        f"{train.batch_size} x {train.grad_accum}")

        set_seed(cfg.seed)  # the same initialisation on every process
        encoder = ActionAwareEncoder.from_config(cfg.encoder)
        decoder = AnimationShotDecoder.from_config(cfg.decoder, with_vae=False)
        decoder.copy_text_projection_to(encoder.text_proj)
        self.model = EncoderDecoder(encoder, decoder)

    def compile(self) -> None:
        self.model.decoder.compile_blocks()

    def load_weights(self, checkpoint: Path) -> None:
        load_weights(self.model, checkpoint)

    def parameters(self):
        encoder, decoder = self.model.encoder, self.model.decoder
        return [{"params": list(encoder.parameters())}, {"params": decoder.trainable_parameters()}]

    def scheduler(self, optimizer):
        # the decoder group learns nothing during the encoder warm-up (lr factor 0), then follows the shared schedule
        train, warmup = self.cfg.train, self.cfg.warmup_steps
        return LambdaLR(optimizer, [lambda s: lr_factor(s, train),
                                    lambda s: 0.0 if s < warmup else lr_factor(s, train)])

    def loss(self, model, core, batch, step, micro):
        return {"loss": compute_loss(model, core, batch, self.cfg)}

    def step_logs(self, step: int) -> dict:
        return {"joint": int(step >= self.cfg.warmup_steps)}

    def postfix(self, step: int) -> dict[str, str]:
        return {"phase": "joint" if step >= self.cfg.warmup_steps else "warm-up"}

    def save_weights(self, core, state, checkpoint: Path) -> None:
        save_encoder(core.encoder, self.cfg.encoder, checkpoint / ENCODER_DIR, sub_state(state, "encoder."))
        core.decoder.save_trained(checkpoint / DECODER_DIR, sub_state(state, "decoder."))

    def finish(self, core, step, last_saved, resume) -> None:
        """The shot targets of stage (b), from the final encoder: gathered into a plain copy, since under ZeRO-3 /
        FSDP2 the prepared one holds shards and would wait for the other processes at every call."""
        cfg, accelerator = self.cfg, self.accelerator
        final = sub_state(gather_trained_state(core, accelerator.is_main_process), "encoder.")
        if accelerator.is_main_process:
            final_encoder = ActionAwareEncoder.from_config(cfg.encoder)
            final_encoder.load_state_dict(final)
            source = {"checkpoint": str(last_saved or (resume and resume.path)), "step": step}
            targets = write_shot_targets(
                final_encoder.to(accelerator.device).eval(),
                cfg.data.features_dir,
                Path(cfg.output_dir) / "shot_targets",
                source=source,
                device=accelerator.device,
            )
            accelerator.print(f"shot targets: {targets}")
        accelerator.wait_for_everyone()


def main(argv: list[str] | None = None) -> Path:
    """Train stage (a) from a command line (``--config FILE key=value ... [--resume latest|PATH]``)."""
    return train(StageA, __doc__, argv)
