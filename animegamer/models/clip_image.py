"""Frozen CLIP image tokens of a frame (open_clip), from the second-to-last residual block.

    features = CLIPImageFeatures.from_config(CLIPConfig(...))
    tokens = features(frames)  # (B, 3, H, W) uint8 or float in [0, 1] -> (B, 256, 1280) for ViT-H-14 at 224 px
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from animegamer.config import CLIPConfig
from animegamer.models.weights import load_state_dict_file

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def register_open_clip_config(arch: str, model_config: str | Path | None) -> None:
    """Register a custom open_clip model config (a JSON file named ``<arch>.json``) if given."""
    import open_clip

    if model_config:
        path = Path(model_config)
        if not path.is_file():
            raise FileNotFoundError(f"open_clip model config {path} not found")
        open_clip.add_model_config(path)
    if open_clip.get_model_config(arch) is None:
        raise ValueError(f"open_clip has no model config {arch!r}; set clip.model_config to its JSON file")


def load_open_clip(cfg: CLIPConfig) -> nn.Module:
    """Build the open_clip model named by ``cfg.arch`` and load ``cfg.checkpoint`` (safetensors or a torch file)."""
    import open_clip

    checkpoint = Path(cfg.checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(
            f"CLIP weights not found at {checkpoint}. Put the open_clip {cfg.arch} checkpoint there "
            f"(see checkpoints/README.md) or set clip.checkpoint=PATH."
        )
    register_open_clip_config(cfg.arch, cfg.model_config)
    # open_clip logs a warning when built without its own `pretrained` tag; we load the weights ourselves.
    logger = logging.getLogger()
    level, logger.level = logger.level, logging.ERROR
    try:
        model = open_clip.create_model(cfg.arch, pretrained=None)
    finally:
        logger.setLevel(level)
    state = load_state_dict_file(checkpoint)
    state = state.get("state_dict", state)
    state = {k.removeprefix("module."): v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    visual_missing = [k for k in missing if k.startswith("visual.")]
    if visual_missing or unexpected:
        raise ValueError(
            f"{checkpoint} does not match open_clip {cfg.arch}: "
            f"missing {visual_missing[:3]}, unexpected {list(unexpected)[:3]}"
        )
    return model.eval().requires_grad_(False)


class CLIPImageFeatures(nn.Module):
    """Patch tokens of a frozen open_clip vision tower at one residual block."""

    def __init__(self, visual: nn.Module, image_size: int, layer: int = -2, drop_cls: bool = True):
        super().__init__()
        self.visual = visual.eval().requires_grad_(False)
        self.image_size = image_size
        num_blocks = len(visual.transformer.resblocks)
        self.block_index = layer % num_blocks
        self.drop_cls = drop_cls
        self.register_buffer("mean", torch.tensor(CLIP_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(CLIP_STD).view(1, 3, 1, 1), persistent=False)

    @classmethod
    def from_config(cls, cfg: CLIPConfig) -> CLIPImageFeatures:
        model = load_open_clip(cfg)
        return cls(model.visual, cfg.image_size, cfg.layer, cfg.drop_cls)

    @property
    def width(self) -> int:
        return self.visual.transformer.width

    @property
    def num_tokens(self) -> int:
        grid = self.image_size // self.visual.patch_size[0]
        return grid * grid + (0 if self.drop_cls else 1)

    def preprocess(self, frames: torch.Tensor) -> torch.Tensor:
        """(B, 3, H, W) uint8 or float in [0, 1] -> normalised (B, 3, S, S): resize short side, centre crop."""
        if frames.ndim != 4 or frames.shape[1] != 3:
            raise ValueError(f"expected frames of shape (B, 3, H, W), got {tuple(frames.shape)}")
        x = frames.float() / 255.0 if frames.dtype == torch.uint8 else frames.float()
        h, w = x.shape[-2:]
        scale = self.image_size / min(h, w)
        new_h, new_w = max(self.image_size, round(h * scale)), max(self.image_size, round(w * scale))
        x = F.interpolate(x, size=(new_h, new_w), mode="bicubic", align_corners=False, antialias=True)
        top, left = (new_h - self.image_size) // 2, (new_w - self.image_size) // 2
        x = x[..., top : top + self.image_size, left : left + self.image_size].clamp(0, 1)
        return (x - self.mean) / self.std

    @torch.no_grad()
    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        x = self.preprocess(frames).to(next(self.visual.parameters()).dtype)
        out = self.visual.forward_intermediates(
            x,
            indices=[self.block_index],
            stop_early=True,
            intermediates_only=True,
            output_fmt="NLC",
            output_extra_tokens=not self.drop_cls,
        )
        tokens = out["image_intermediates"][0]  # (B, grid*grid, C)
        if not self.drop_cls:
            tokens = torch.cat([out["image_intermediates_prefix"][0], tokens], dim=1)  # (B, 1 + grid*grid, C)
        return tokens
