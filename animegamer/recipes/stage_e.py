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

from animegamer.config import StageEConfig
from animegamer.data import stage_e as data
from animegamer.data.stage_e import precompute_latents
from animegamer.models.causal_decoder import WEIGHTS_FILE, CausalLatentDecoder, read_vae_layout
from animegamer.models.trained import SMALL_DECODER_DIR
from animegamer.models.weights import load_state_dict_file
from animegamer.training.loop import Recipe, train


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


class StageE(Recipe):
    """Stage (e): the whole small decoder trains on random latent windows of whole clips."""

    config_class = StageEConfig
    project = "stage_e"

    def check(self) -> None:
        if self.cfg.crop_size < 0:
            raise ValueError(f"crop_size={self.cfg.crop_size} must be >= 0 (0: whole frames)")

    def build(self, resume) -> None:
        cfg, accelerator = self.cfg, self.accelerator
        layout = read_vae_layout(cfg.vae)
        if accelerator.num_processes == 1:
            written = precompute_latents(cfg.data, cfg.vae, accelerator.device)
            if written:
                accelerator.print(f"latents: {written} clips encoded into {cfg.data.features_dir}")
        self.dataset, self.left_out = data.build_dataset(cfg)
        set_seed(cfg.seed)
        self.model = build_model(cfg, layout)
        latent_channels, self.spatial, temporal = layout
        first = self.dataset[0]
        latents_shape, frame_count = tuple(first["latents"].shape), first["frames"].shape[0]  # (F, C, h, w), T
        pixels = (latents_shape[2] * self.spatial, latents_shape[3] * self.spatial)
        if latents_shape[1] != latent_channels or self.model.num_frames(latents_shape[0]) != frame_count or \
                tuple(first["frames"].shape[1:3]) != pixels:
            raise ValueError(f"latents {latents_shape} in {cfg.data.features_dir} and frames "
                             f"{tuple(first['frames'].shape)} do not fit the VAE of {cfg.vae} ({latent_channels} "
                             f"channels, {self.spatial}x spatial, {temporal}x temporal)")
        train = cfg.train
        self.summary = (f"{len(self.dataset)} clips; small decoder "
                        f"{sum(p.numel() for p in self.model.parameters()) / 1e6:.2f} M parameters; "
                        f"{accelerator.num_processes} process(es); batch {train.batch_size} x {train.grad_accum}")

    def compile(self) -> None:
        self.model.compile_blocks()

    def load_weights(self, checkpoint: Path) -> None:
        self.model.load_state_dict(load_state_dict_file(checkpoint / SMALL_DECODER_DIR / WEIGHTS_FILE))

    def parameters(self):
        return self.model.parameters()  # the whole small decoder

    def loss(self, model, core, batch, step, micro):
        return {"loss": compute_loss(model, batch, self.cfg, self.spatial)}  # crops differ per process

    def save_weights(self, core, state, checkpoint: Path) -> None:
        core.save_pretrained(checkpoint / SMALL_DECODER_DIR, state)


def main(argv: list[str] | None = None) -> Path:
    """Train stage (e) from a command line (``--config FILE key=value ... [--resume latest|PATH]``)."""
    return train(StageE, __doc__, argv)
