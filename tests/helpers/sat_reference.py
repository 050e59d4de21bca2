"""A float64 forward of SAT decoder checkpoints written from the facts of tests/data/official_ref/README.md
(independent of diffusers and of the converter), for generality tests. The random checkpoints themselves come from
the package (animegamer.official.release_files, which the benchmark's ``official`` part uses too)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from animegamer.official.release_files import write_random_checkpoint
from animegamer.official.sat_layout import SatDecoderSpec

__all__ = ["sat_forward", "write_random_checkpoint"]


def sat_forward(state, spec: SatDecoderSpec, x, timestep, flow, tokens) -> torch.Tensor:
    """The SAT DiT in float64: latents (B, T, C, h, w), timestep/flow (B,), the 226 conditioning tokens (B, N, H)
    -> v-prediction (B, T, C, h, w)."""
    p = lambda k: state[k].double()  # noqa: E731
    lin = lambda z, name: z @ p(f"{name}.weight").T + p(f"{name}.bias")  # noqa: E731
    h, heads, n_cond, patch = spec.hidden_size, spec.num_heads, spec.text_length, spec.patch_size
    scale = spec.lora_alpha / spec.lora_rank

    def sinusoid(values):  # [cos, sin], frequencies exp(-ln(1e4) k / (H/2))
        freqs = torch.exp(-math.log(10000) * torch.arange(h // 2, dtype=torch.float64) / (h // 2))
        args = values.double()[:, None] * freqs[None]
        return torch.cat([args.cos(), args.sin()], dim=1)

    def embed(values, name):
        return lin(F.silu(lin(sinusoid(values), f"{name}.0")), f"{name}.2")

    def norm(z, name, eps):
        return F.layer_norm(z, (z.shape[-1],), p(f"{name}.weight"), p(f"{name}.bias"), eps)

    emb = embed(timestep, "time_embed") + embed(flow, "flow_embed")  # (B, temb)
    b, t, c, hh, ww = x.shape
    patches = F.conv2d(x.reshape(b * t, c, hh, ww).double(), p("mixins.patch_embed.proj.weight"),
                       p("mixins.patch_embed.proj.bias"), stride=patch)  # (B*T, H, hh/p, ww/p)
    patches = patches.reshape(b, t, h, -1).transpose(2, 3).reshape(b, -1, h)  # (B, T*n, H), (t, i, j) order
    seq = torch.cat([tokens.double(), patches], dim=1) + p("mixins.pos_embed.pos_embedding")

    def modulate(z, shift, scl):
        return z * (1 + scl[:, None]) + shift[:, None]

    def both(z, mods, video, cond):  # video tokens with chunks video, conditioning tokens with chunks cond
        return torch.cat([modulate(z[:, :n_cond], mods[cond[0]], mods[cond[1]]),
                          modulate(z[:, n_cond:], mods[video[0]], mods[video[1]])], dim=1)

    def gated(z, mods, video, cond):
        return torch.cat([mods[cond][:, None] * z[:, :n_cond], mods[video][:, None] * z[:, n_cond:]], dim=1)

    def lora_linear(z, name, parts):
        out = lin(z, f"{name}.original")
        delta = [(z @ p(f"{name}.matrix_A.{j}").T) @ p(f"{name}.matrix_B.{j}").T * scale for j in range(parts)]
        return out + torch.cat(delta, dim=-1)

    for i in range(spec.num_layers):
        layer, ada = f"transformer.layers.{i}", "mixins.adaln_layer"
        mods = lin(F.silu(emb), f"{ada}.adaLN_modulations.{i}.1").chunk(12, dim=1)
        z = both(norm(seq, f"{layer}.input_layernorm", 1e-5), mods, (0, 1), (6, 7))
        q, k, v = lora_linear(z, f"{layer}.attention.query_key_value", 3).split(h, dim=-1)
        q, k, v = (m.reshape(b, -1, heads, h // heads).transpose(1, 2) for m in (q, k, v))  # (B, heads, L, d)
        q = norm(q, f"{ada}.query_layernorm_list.{i}", 1e-6)
        k = norm(k, f"{ada}.key_layernorm_list.{i}", 1e-6)
        att = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, -1, h)
        seq = seq + gated(lora_linear(att, f"{layer}.attention.dense", 1), mods, 2, 8)
        z = both(norm(seq, f"{layer}.post_attention_layernorm", 1e-5), mods, (3, 4), (9, 10))
        mlp = lin(F.gelu(lin(z, f"{layer}.mlp.dense_h_to_4h"), approximate="tanh"), f"{layer}.mlp.dense_4h_to_h")
        seq = seq + gated(mlp, mods, 5, 11)
    video = norm(norm(seq, "transformer.final_layernorm", 1e-5)[:, n_cond:], "mixins.final_layer.norm_final", 1e-6)
    shift, scl = lin(F.silu(emb), "mixins.final_layer.adaLN_modulation.1").chunk(2, dim=1)
    out = lin(modulate(video, shift, scl), "mixins.final_layer.linear")  # (B, T*n, p*p*C)
    out = out.reshape(b, t, hh // patch, ww // patch, -1, patch, patch)
    return out.permute(0, 1, 4, 2, 5, 3, 6).reshape(b, t, -1, hh, ww)  # channel-major unpatchify
