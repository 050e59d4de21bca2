"""The trained parts a stage (a) / (c) checkpoint holds, and how to load them back.

<output_dir>/checkpoints/step_XXXXXXX/
    encoder/model.safetensors     ActionAwareEncoder weights
    encoder/config.json           its EncoderConfig
    decoder/                      AnimationShotDecoder.save_trained: adapter_config.json,
                                  adapter_model.safetensors (LoRA), motion_embedding.safetensors, decoder_config.json

encoder = load_encoder("outputs/stage_a")              # a run dir, checkpoints/latest, or a step dir
decoder = load_decoder("outputs/stage_a", cfg.decoder)  # pretrained CogVideoX + the trained LoRA/motion parts
small = load_small_decoder("outputs/stage_e")           # stage (e): small_decoder/{config.json, model.safetensors}
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from animegamer.config import DecoderConfig, EncoderConfig
from animegamer.config.recorded import adopt, decoder_record
from animegamer.io import DECODER_DIR, atomic_write_json, read_json_bounded, resolve_checkpoint
from animegamer.models.causal_decoder import CONFIG_FILE as SMALL_DECODER_CONFIG
from animegamer.models.causal_decoder import CausalLatentDecoder
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.weights import load_state_dict_file, save_state_dict_file

ENCODER_DIR = "encoder"
SMALL_DECODER_DIR = "small_decoder"  # stage (e): CausalLatentDecoder.save_pretrained


def save_encoder(encoder: ActionAwareEncoder, cfg: EncoderConfig, out_dir: str | Path,
                 state_dict: dict[str, torch.Tensor] | None = None) -> None:
    """``out_dir/model.safetensors`` + ``out_dir/config.json`` (the EncoderConfig that rebuilds it). ``state_dict``:
    the full tensors gathered where the module holds only shards (ZeRO-3, FSDP2); by default the module's own."""
    out = Path(out_dir)
    save_state_dict_file(encoder.state_dict() if state_dict is None else state_dict, out / "model.safetensors")
    atomic_write_json(out / "config.json", dataclasses.asdict(cfg))


def load_encoder(checkpoint: str | Path, device: str | torch.device = "cpu") -> ActionAwareEncoder:
    """The trained ActionAwareEncoder of a checkpoint (any form :func:`resolve_checkpoint` accepts), in eval mode."""
    path = resolve_checkpoint(checkpoint)
    enc_dir = path / ENCODER_DIR if (path / ENCODER_DIR).is_dir() else path
    config_file = enc_dir / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"no trained encoder in {path} (expected {ENCODER_DIR}/config.json)")
    cfg = EncoderConfig(**read_json_bounded(config_file))
    encoder = ActionAwareEncoder.from_config(cfg)
    encoder.load_state_dict(load_state_dict_file(enc_dir / "model.safetensors"))
    return encoder.to(device).eval()


def load_decoder(
    checkpoint: str | Path, cfg: DecoderConfig, device: str | torch.device | None = None, with_vae: bool = True
) -> AnimationShotDecoder:
    """The pretrained decoder of ``cfg`` with the trained LoRA + motion embedding of a checkpoint, in eval mode. Its
    shape (LoRA, motion-level input) is the one the checkpoint records (config.recorded.adopt: a ``cfg`` field set
    to another value is a ValueError)."""
    path = resolve_checkpoint(checkpoint)
    dec_dir = path / DECODER_DIR if (path / DECODER_DIR).is_dir() else path
    cfg = adopt(cfg, decoder_record(dec_dir), "decoder")
    decoder = AnimationShotDecoder.from_config(cfg, with_vae=with_vae)
    decoder.load_trained(dec_dir)
    return (decoder.to(device) if device is not None else decoder).eval()


def small_decoder_dir(checkpoint: str | Path) -> Path:
    """The ``small_decoder/`` directory of a stage (e) run, checkpoint, or that directory itself."""
    path = Path(checkpoint)
    if (path / SMALL_DECODER_CONFIG).is_file():
        return path
    if (path / SMALL_DECODER_DIR / SMALL_DECODER_CONFIG).is_file():
        return path / SMALL_DECODER_DIR
    return resolve_checkpoint(path) / SMALL_DECODER_DIR


def load_small_decoder(checkpoint: str | Path, device: str | torch.device = "cpu") -> CausalLatentDecoder:
    """The stage (e) small decoder of a run, checkpoint or ``small_decoder/`` directory, in eval mode."""
    return CausalLatentDecoder.from_pretrained(small_decoder_dir(checkpoint), device)
