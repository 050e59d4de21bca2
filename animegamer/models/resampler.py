"""ShotResampler: maps shot representations into the LLM's width and back, one token at a time.

    input resampler   s_a (B, N, 1920)        -> LLM input embeddings of a history turn's slots (B, N, 4096)
    output resampler  hidden at slots (B, N, 4096) -> predicted s_a (B, N, 1920)

The token count N (226) is unchanged: slot i of a turn carries token i of its shot. Depth is a config value
(``MLLMConfig.resampler_layers``): 1 is a single Linear, L > 1 is Linear-GELU-...-Linear with the inner layers at
the output width. The GELU is a config value too (``MLLMConfig.resampler_gelu``): ``tanh`` (this project's own
checkpoints) or ``erf`` (exact GELU: the release's ``ProjectionLayer`` is Linear-GELU(erf)-Linear, so converted
official weights load with ``erf``).
"""

from __future__ import annotations

import torch
from torch import nn

GELU_APPROXIMATIONS = {"tanh": "tanh", "erf": "none"}  # our name -> torch's ``approximate``


class ShotResampler(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, num_layers: int = 2, gelu: str = "tanh"):
        super().__init__()
        if num_layers < 1:
            raise ValueError(f"a resampler needs at least one layer, got num_layers={num_layers}")
        if gelu not in GELU_APPROXIMATIONS:
            raise ValueError(f"resampler gelu must be one of {sorted(GELU_APPROXIMATIONS)}, got {gelu!r}")
        self.in_dim, self.out_dim = in_dim, out_dim
        layers: list[nn.Module] = [nn.Linear(in_dim, out_dim)]
        for _ in range(num_layers - 1):
            layers += [nn.GELU(approximate=GELU_APPROXIMATIONS[gelu]), nn.Linear(out_dim, out_dim)]
        self.mlp = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(..., N, in_dim) -> (..., N, out_dim); runs in the resampler's own dtype."""
        if x.shape[-1] != self.in_dim:
            raise ValueError(f"expected width {self.in_dim}, got a tensor of shape {tuple(x.shape)}")
        return self.mlp(x.to(self.mlp[0].weight.dtype))
