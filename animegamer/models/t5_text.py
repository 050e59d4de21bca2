"""Frozen T5 text tokens of a motion description, padded/truncated to 226 tokens like CogVideoX.

    t5 = T5TextFeatures.from_config(T5Config(path="checkpoints/CogVideoX-2b"))
    tokens = t5(["Character: Qiqi; Motion: gently lie down; Background: night bedroom."])  # (1, 226, 4096)
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from animegamer.config import T5Config


def _subdir(root: Path, sub: str, what: str) -> Path:
    path = root / sub if sub else root
    if not (path / "config.json").is_file() and what == "text encoder":
        raise FileNotFoundError(
            f"T5 {what} not found at {path} (no config.json). Put the CogVideoX-2b diffusers folder "
            f"(text_encoder/, tokenizer/) under {root} (see checkpoints/README.md) or set t5.path=DIR."
        )
    if not path.is_dir():
        raise FileNotFoundError(f"T5 {what} not found at {path}; see checkpoints/README.md")
    return path


class T5TextFeatures(nn.Module):
    """A frozen T5 encoder and its tokenizer; text in, (B, max_length, d_model) tokens out."""

    def __init__(self, encoder: nn.Module, tokenizer, max_length: int = 226):
        super().__init__()
        self.encoder = encoder.eval().requires_grad_(False)
        self.tokenizer = tokenizer
        self.max_length = max_length

    @classmethod
    def from_config(cls, cfg: T5Config, dtype: torch.dtype = torch.float32) -> T5TextFeatures:
        from transformers import AutoTokenizer, T5EncoderModel

        root = Path(cfg.path)
        encoder_dir = _subdir(root, cfg.text_encoder_subfolder, "text encoder")
        tokenizer_dir = _subdir(root, cfg.tokenizer_subfolder, "tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        encoder = T5EncoderModel.from_pretrained(str(encoder_dir), dtype=dtype)
        return cls(encoder, tokenizer, cfg.max_length)

    @property
    def width(self) -> int:
        return self.encoder.config.d_model

    def tokenize(self, texts: list[str]) -> torch.Tensor:
        if isinstance(texts, str):
            texts = [texts]
        batch = self.tokenizer(
            list(texts),
            padding="max_length",
            max_length=self.max_length,
            truncation=True,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return batch.input_ids  # (B, max_length)

    @torch.no_grad()
    def forward(self, texts: list[str]) -> torch.Tensor:
        # CogVideoX encodes prompts without an attention mask; doing the same keeps the pretrained
        # decoder's conditioning statistics for padded positions.
        ids = self.tokenize(texts).to(self.encoder.device)
        return self.encoder(input_ids=ids).last_hidden_state  # (B, max_length, d_model)
