"""ActionAwareEncoder: first frame (CLIP tokens) + motion text (T5 tokens) -> action-aware shot representation s_a.

    CLIP tokens (B, Nc, Dc) -> projector (MLP or Linear) -> LayerNorm -> (B, Nc, H)
    T5 tokens   (B, Nt, Dt) -> text projection (Linear, from CogVideoX) -> LayerNorm -> (B, Nt, H)
    fusion: concat on tokens (B, Nt + Nc, H) | add (CLIP resampled to Nt tokens) | cross_attn (text attends CLIP)
    token mixing: Linear over the token axis (-> N) -> LayerNorm -> s_a (B, N, H)
"""

from __future__ import annotations

import torch
from torch import nn

from animegamer.config import EncoderConfig

PROJECTORS = ("mlp", "linear")
FUSIONS = ("concat", "add", "cross_attn")


class ActionAwareEncoder(nn.Module):
    def __init__(
        self,
        clip_dim: int = 1280,
        clip_tokens: int = 256,
        text_dim: int = 4096,
        text_tokens: int = 226,
        hidden_dim: int = 1920,
        num_tokens: int = 226,
        projector: str = "mlp",
        fusion: str = "concat",
        token_mixing: bool = True,
        cross_attn_heads: int = 8,
    ):
        super().__init__()
        if projector not in PROJECTORS:
            raise ValueError(f"projector={projector!r} is not one of {PROJECTORS}")
        if fusion not in FUSIONS:
            raise ValueError(f"fusion={fusion!r} is not one of {FUSIONS}")
        self.fusion = fusion
        self.clip_tokens, self.text_tokens, self.num_tokens = clip_tokens, text_tokens, num_tokens
        if projector == "mlp":
            self.clip_proj = nn.Sequential(
                nn.Linear(clip_dim, hidden_dim), nn.GELU(approximate="tanh"), nn.Linear(hidden_dim, hidden_dim)
            )
        else:
            self.clip_proj = nn.Linear(clip_dim, hidden_dim)
        self.clip_norm = nn.LayerNorm(hidden_dim)
        self.text_proj = nn.Linear(text_dim, hidden_dim)  # initialised from the decoder's text projection
        self.text_norm = nn.LayerNorm(hidden_dim)

        fused_tokens = text_tokens + clip_tokens if fusion == "concat" else text_tokens
        if fusion == "add":
            self.clip_resample = nn.Linear(clip_tokens, text_tokens)  # over the token axis
        elif fusion == "cross_attn":
            self.cross_attn = nn.MultiheadAttention(hidden_dim, cross_attn_heads, batch_first=True)
        if token_mixing:
            self.token_mix = nn.Linear(fused_tokens, num_tokens)
            # Start near "output token i = text token i": at step 0 the decoder sees (normalised) text
            # conditioning, as in pretraining. The CLIP columns keep a small random init (not zero) so the
            # frame gets gradient from the first step.
            with torch.no_grad():
                self.token_mix.weight.mul_(0.1)
                k = min(num_tokens, text_tokens)
                self.token_mix.weight[:k, :k] = torch.eye(k)
                self.token_mix.weight[:, :text_tokens].masked_fill_(torch.eye(num_tokens, text_tokens) == 0, 0.0)
                self.token_mix.bias.zero_()
            self.out_norm = nn.LayerNorm(hidden_dim)
        else:
            if fused_tokens != num_tokens:
                raise ValueError(
                    f"without token mixing the encoder emits {fused_tokens} tokens; set num_tokens={fused_tokens}"
                )
            self.token_mix = None
            self.out_norm = nn.Identity()

    @classmethod
    def from_config(cls, cfg: EncoderConfig) -> ActionAwareEncoder:
        return cls(
            clip_dim=cfg.clip_dim,
            clip_tokens=cfg.clip_tokens,
            text_dim=cfg.text_dim,
            text_tokens=cfg.text_tokens,
            hidden_dim=cfg.hidden_dim,
            num_tokens=cfg.num_tokens,
            projector=cfg.projector,
            fusion=cfg.fusion,
            token_mixing=cfg.token_mixing,
            cross_attn_heads=cfg.cross_attn_heads,
        )

    def forward(self, clip_tokens: torch.Tensor, text_tokens: torch.Tensor) -> torch.Tensor:
        if clip_tokens.shape[1] != self.clip_tokens or text_tokens.shape[1] != self.text_tokens:
            raise ValueError(
                f"expected {self.clip_tokens} CLIP and {self.text_tokens} text tokens, "
                f"got {clip_tokens.shape[1]} and {text_tokens.shape[1]}"
            )
        dtype = self.text_proj.weight.dtype
        image = self.clip_norm(self.clip_proj(clip_tokens.to(dtype)))  # (B, Nc, H)
        text = self.text_norm(self.text_proj(text_tokens.to(dtype)))  # (B, Nt, H)
        if self.fusion == "concat":
            fused = torch.cat([text, image], dim=1)  # (B, Nt + Nc, H)
        elif self.fusion == "add":
            fused = text + self.clip_resample(image.transpose(1, 2)).transpose(1, 2)  # (B, Nt, H)
        else:
            attended, _ = self.cross_attn(text, image, image, need_weights=False)
            fused = text + attended  # (B, Nt, H)
        if self.token_mix is None:
            return fused
        mixed = self.token_mix(fused.transpose(1, 2)).transpose(1, 2)  # (B, N, H)
        return self.out_norm(mixed)
