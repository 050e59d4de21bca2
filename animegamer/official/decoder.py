"""The release's SwissArmyTransformer (SAT) decoder checkpoint -> a diffusers CogVideoX transformer + trained parts.

    ckpt_dir/latest                          "<iter>"
    ckpt_dir/<iter>/mp_rank_00_model_states.pt {"module": {"model.diffusion_model.<name>": tensor, ...}, ...}
        │  sizes from the SAT model YAML (VDM_Decoder/configs/cogvideox_2b.yaml) and the tensors' shapes
        ▼
    out_dir/CogVideoX/transformer/   CogVideoXTransformer3DModel: the SAT base weights (qkv split into to_q/k/v,
                                     the 12H adaLN rows regrouped into norm1/norm2, time/patch/final layers)
    out_dir/CogVideoX/{vae,scheduler}/  copied from a diffusers CogVideoX-2b dir (``base_dir``)
    out_dir/decoder/                 AnimationShotDecoder.save_trained layout: the SAT LoRA as a peft adapter
                                     (scale lora_alpha / r), the flow embedding as the motion embedding, the
                                     level -> flow table, the unconditional shot tokens, the eps diffusers'
                                     config cannot express, the release sampler's settings

Facts of the SAT layout (tests/data/official_ref/README.md): the 12H adaLN rows of layer i are, in chunks of H,
[shift, scale, gate] x [attention, MLP] for the video tokens, then the same six for the 226 conditioning tokens;
diffusers' CogVideoXLayerNormZero holds [shift, scale, gate, enc_shift, enc_scale, enc_gate] per branch. The
release's unconditional CFG row is the fusion of zero T5 and zero CLIP inputs: every text token is
LN_txt(text_proj(0)) and every image token LN_ip(ip_proj(0)), one constant (226, H) tensor computed here.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from animegamer.io import atomic_write_json, read_json_bounded
from animegamer.models.decoder_parts import ADAPTER_WEIGHTS, DECODER_CONFIG, MOTION_WEIGHTS, NULL_SHOT_WEIGHTS
from animegamer.models.weights import save_state_dict_file
from animegamer.official.release_io import ReleaseFileError
from animegamer.official.sat_layout import (
    LORA_TARGETS,
    RELEASE_FLOW_VALUES,
    SAT_EPS,
    SAT_FINAL_NORM_EPS,
    SatDecoderSpec,
    read_model_yaml,
    read_sat_checkpoint,
)


def transformer_kwargs(spec: SatDecoderSpec) -> dict:
    """CogVideoXTransformer3DModel arguments equivalent to the SAT DiT of ``spec``."""
    if spec.height_interpolation != spec.width_interpolation:
        raise ReleaseFileError("height_interpolation != width_interpolation: diffusers has one spatial scale")
    return dict(
        num_attention_heads=spec.num_heads,
        attention_head_dim=spec.hidden_size // spec.num_heads,
        in_channels=spec.in_channels,
        out_channels=spec.out_channels,
        flip_sin_to_cos=True,  # SAT's timestep sinusoid is [cos, sin], frequencies exp(-ln(1e4) k / (H/2))
        freq_shift=0,
        time_embed_dim=spec.time_embed_dim,
        text_embed_dim=spec.text_hidden_size,
        num_layers=spec.num_layers,
        attention_bias=True,
        sample_width=spec.latent_width,
        sample_height=spec.latent_height,
        sample_frames=spec.num_frames,
        patch_size=spec.patch_size,
        temporal_compression_ratio=spec.time_compressed_rate,
        max_text_seq_length=spec.text_length,
        activation_fn="gelu-approximate",
        timestep_activation_fn="silu",
        norm_elementwise_affine=spec.elementwise_affine,
        norm_eps=SAT_EPS,
        spatial_interpolation_scale=spec.height_interpolation,
        temporal_interpolation_scale=1.0,
        use_rotary_positional_embeddings=False,
        use_learned_positional_embeddings=False,
    )


def diffusers_state(state: dict[str, torch.Tensor], spec: SatDecoderSpec) -> dict[str, torch.Tensor]:
    """The base (non-LoRA) weights under diffusers' CogVideoXTransformer3DModel names."""
    h = spec.hidden_size
    out = {
        "patch_embed.proj.weight": state["mixins.patch_embed.proj.weight"],
        "patch_embed.proj.bias": state["mixins.patch_embed.proj.bias"],
        # SAT's T5 projection is Linear-GELU-Linear, diffusers' one Linear: its first layer is kept so the file is a
        # complete diffusers model; our decoder bypasses text_proj (s_a and the stored null tokens are H wide)
        "patch_embed.text_proj.weight": state["mixins.patch_embed.text_proj.0.weight"],
        "patch_embed.text_proj.bias": state["mixins.patch_embed.text_proj.0.bias"],
        "time_embedding.linear_1.weight": state["time_embed.0.weight"],
        "time_embedding.linear_1.bias": state["time_embed.0.bias"],
        "time_embedding.linear_2.weight": state["time_embed.2.weight"],
        "time_embedding.linear_2.bias": state["time_embed.2.bias"],
        "norm_final.weight": state["transformer.final_layernorm.weight"],
        "norm_final.bias": state["transformer.final_layernorm.bias"],
        "norm_out.norm.weight": state["mixins.final_layer.norm_final.weight"],
        "norm_out.norm.bias": state["mixins.final_layer.norm_final.bias"],
        "norm_out.linear.weight": state["mixins.final_layer.adaLN_modulation.1.weight"],  # rows: shift, scale
        "norm_out.linear.bias": state["mixins.final_layer.adaLN_modulation.1.bias"],
        "proj_out.weight": state["mixins.final_layer.linear.weight"],
        "proj_out.bias": state["mixins.final_layer.linear.bias"],
    }
    attention_rows, mlp_rows = [0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]  # chunks of H of the 12H adaLN rows
    for i in range(spec.num_layers):
        sat, block = f"transformer.layers.{i}", f"transformer_blocks.{i}"
        ada = f"mixins.adaln_layer.adaLN_modulations.{i}.1"
        for part in ("weight", "bias"):
            chunks = state[f"{ada}.{part}"].split(h)  # 12 x (H, temb) | 12 x (H,)
            out[f"{block}.norm1.linear.{part}"] = torch.cat([chunks[c] for c in attention_rows])
            out[f"{block}.norm2.linear.{part}"] = torch.cat([chunks[c] for c in mlp_rows])
            out[f"{block}.norm1.norm.{part}"] = state[f"{sat}.input_layernorm.{part}"]
            out[f"{block}.norm2.norm.{part}"] = state[f"{sat}.post_attention_layernorm.{part}"]
            q, k, v = state[f"{sat}.attention.query_key_value.original.{part}"].split(h)  # contiguous thirds of 3H
            out.update({f"{block}.attn1.to_q.{part}": q, f"{block}.attn1.to_k.{part}": k})
            out[f"{block}.attn1.to_v.{part}"] = v
            out[f"{block}.attn1.to_out.0.{part}"] = state[f"{sat}.attention.dense.original.{part}"]
            out[f"{block}.attn1.norm_q.{part}"] = state[f"mixins.adaln_layer.query_layernorm_list.{i}.{part}"]
            out[f"{block}.attn1.norm_k.{part}"] = state[f"mixins.adaln_layer.key_layernorm_list.{i}.{part}"]
            out[f"{block}.ff.net.0.proj.{part}"] = state[f"{sat}.mlp.dense_h_to_4h.{part}"]
            out[f"{block}.ff.net.2.{part}"] = state[f"{sat}.mlp.dense_4h_to_h.{part}"]
    return out


def lora_state(state: dict[str, torch.Tensor], spec: SatDecoderSpec) -> dict[str, torch.Tensor]:
    """SAT lora2 (``x A_j^T B_j^T * alpha / r`` per q/k/v third and on the output) as peft weights of to_q/k/v/out."""
    out = {}
    for i in range(spec.num_layers):
        sat, attn = f"transformer.layers.{i}.attention", f"transformer_blocks.{i}.attn1"
        pairs = [(f"{sat}.query_key_value", j, proj) for j, proj in enumerate(("to_q", "to_k", "to_v"))]
        pairs.append((f"{sat}.dense", 0, "to_out.0"))
        for source, j, proj in pairs:
            out[f"{attn}.{proj}.lora_A.weight"] = state[f"{source}.matrix_A.{j}"]  # (r, H)
            out[f"{attn}.{proj}.lora_B.weight"] = state[f"{source}.matrix_B.{j}"]  # (H, r)
    return out


def null_shot_tokens(state: dict[str, torch.Tensor], spec: SatDecoderSpec) -> torch.Tensor:
    """The release's unconditional conditioning tokens (text_length, H): its fusion of zero T5 and zero CLIP inputs.

    A zero input makes every token of a branch the same vector (Linear-GELU-Linear of 0 = W2 gelu(b1) + b2, then
    the branch's LayerNorm), so the whole row is [text vector x n_text, image vector x n_image]. Computed in float64.
    """

    def branch(name: str, norm: str) -> torch.Tensor:
        first = state[f"mixins.patch_embed.{name}.0.bias"].double()
        second_w, second_b = (state[f"mixins.patch_embed.{name}.2.{p}"].double() for p in ("weight", "bias"))
        hidden = second_w @ F.gelu(first) + second_b  # the erf GELU of nn.GELU()
        weight, bias = (state[f"mixins.patch_embed.{norm}.{p}"].double() for p in ("weight", "bias"))
        return F.layer_norm(hidden, (spec.hidden_size,), weight, bias, SAT_EPS)

    n_text = spec.text_length - spec.image_tokens
    if n_text < 0:
        raise ReleaseFileError(f"text_length {spec.text_length} is shorter than the {spec.image_tokens} image tokens")
    text = branch("text_proj", "txt_mix_layer_norm").expand(n_text, -1)
    image = branch("ip_proj", "ip_mix_layer_norm").expand(spec.image_tokens, -1)
    return torch.cat([text, image]).float().contiguous()  # (text_length, H)


def check_position_table(state: dict[str, torch.Tensor], spec: SatDecoderSpec, path: Path) -> float:
    """The SAT checkpoint's stored 3-D sin-cos table against the one diffusers computes; returns the max difference.

    diffusers recomputes the table at load, so a mismatch (other grid order, interpolation or split of channels)
    would silently change every output: it is refused here instead.
    """
    from diffusers.models.embeddings import CogVideoXPatchEmbed

    kwargs = transformer_kwargs(spec)
    embed = CogVideoXPatchEmbed(
        patch_size=spec.patch_size,
        in_channels=1,
        embed_dim=spec.hidden_size,
        text_embed_dim=1,
        sample_width=spec.latent_width,
        sample_height=spec.latent_height,
        sample_frames=spec.num_frames,
        temporal_compression_ratio=spec.time_compressed_rate,
        max_text_seq_length=spec.text_length,
        spatial_interpolation_scale=kwargs["spatial_interpolation_scale"],
        temporal_interpolation_scale=kwargs["temporal_interpolation_scale"],
    )
    raw = state["mixins.pos_embed.pos_embedding"]
    ours, stored = embed.pos_embedding.double(), raw.double()
    diff = float((ours - stored).abs().max())
    # sin-cos values lie in [-1, 1]: stored in fp16 / bf16 (as a half-precision release stores it) each is off by at
    # most half a unit in the last place, under one eps of its dtype; another grid order or channel split is off by ~1
    if diff > max(1e-4, torch.finfo(raw.dtype).eps):
        raise ReleaseFileError(
            f"{path}: the stored position table differs from diffusers' CogVideoX table by {diff:.3g} (max abs)"
        )
    return diff


# the DecoderConfig fields a converted decoder_config.json records (read back by config.recorded at load)
DECODER_CONFIG_KEYS = (
    "lora_rank",
    "lora_alpha",
    "lora_targets",
    "motion_embed_dim",
    "num_motion_levels",
    "motion_scope",
    "motion_guidance",
)


def _decoder_settings(spec: SatDecoderSpec) -> dict:
    return {
        "lora_rank": spec.lora_rank,
        "lora_alpha": spec.lora_alpha,
        "lora_targets": LORA_TARGETS,
        "motion_scope": True,
        "num_motion_levels": len(RELEASE_FLOW_VALUES),
        "motion_guidance": False,
        "motion_embed_dim": spec.hidden_size,  # SAT's flow sinusoid is as wide as the hidden size
        "motion_values": RELEASE_FLOW_VALUES,
        "layernorm_eps": {"norm_out.norm": SAT_FINAL_NORM_EPS},
        "release_sampler": {
            "num_idx": spec.num_idx,
            "shift_scale": spec.shift_scale,
            "linear_start": spec.linear_start,
            "linear_end": spec.linear_end,
            "steps": spec.sample_steps,
            "guidance_scale": spec.guidance_scale,
            "guidance_exponent": spec.guidance_exponent,
            "dtype": "fp16",  # the release's inference.yaml: fp16 True
        },
    }


def _link_or_copy_tree(src: Path, dst: Path) -> None:
    def link(s: str, d: str) -> None:
        try:
            os.link(s, d)
        except OSError:
            shutil.copy2(s, d)

    shutil.copytree(src, dst, copy_function=link)


def convert_decoder(
    ckpt_dir: str | Path,
    out_dir: str | Path,
    model_yaml: str | Path | None = None,
    base_dir: str | Path | None = None,
) -> dict:
    """Convert the release's SAT decoder directory into ``out_dir/CogVideoX/`` and ``out_dir/decoder/``.

    ``model_yaml`` is the release's SAT model YAML (None: the released CogVideoX-2B values); ``base_dir`` a diffusers
    CogVideoX-2b folder whose ``vae/`` and ``scheduler/`` are hard-linked (or copied) beside the transformer.
    ``out_dir/CogVideoX`` and ``out_dir/decoder`` must not exist yet (FileExistsError). Everything is built in a
    temp dir inside ``out_dir`` and renamed into place at the end: a bad input raises
    :class:`ReleaseFileError` (one line naming the file) and leaves nothing behind. Returns a JSON-able summary
    with the ``decoder_config`` / ``sampling`` overrides an inference.yaml needs.
    """
    from diffusers import CogVideoXTransformer3DModel
    from peft import LoraConfig

    spec = read_model_yaml(model_yaml)
    path, iteration, state, ignored = read_sat_checkpoint(ckpt_dir, spec)
    pos_diff = check_position_table(state, spec, path)
    base = Path(base_dir) if base_dir is not None else None
    if base is not None:
        for sub, marker in (("vae", "config.json"), ("scheduler", "scheduler_config.json")):
            if not (base / sub / marker).is_file():
                raise ReleaseFileError(f"{base / sub / marker}: file not found (base_dir: a diffusers CogVideoX-2b)")

    out = Path(out_dir)
    targets = {"CogVideoX": out / "CogVideoX", "decoder": out / "decoder"}
    existing = [str(p) for p in targets.values() if p.exists()]
    if existing:
        raise FileExistsError(f"{existing[0]} exists; choose a new output directory")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".decoder-convert.", dir=out))
    try:
        kwargs = transformer_kwargs(spec)
        with torch.device("meta"):
            skeleton = CogVideoXTransformer3DModel(**kwargs)
        weights = diffusers_state(state, spec)
        wanted = {k: tuple(v.shape) for k, v in skeleton.state_dict().items()}
        got = {k: tuple(v.shape) for k, v in weights.items()}
        if wanted != got:  # a mapping bug, not a user error: say which key
            bad = sorted(set(wanted) ^ set(got)) or [k for k in wanted if wanted[k] != got[k]]
            raise RuntimeError(f"SAT -> diffusers mapping does not fill CogVideoXTransformer3DModel: {bad[:3]}")
        transformer_dir = tmp / "CogVideoX" / "transformer"
        transformer_dir.mkdir(parents=True)
        skeleton.save_config(str(transformer_dir))
        save_state_dict_file(weights, transformer_dir / "diffusion_pytorch_model.safetensors")
        del weights
        if base is not None:
            for sub in ("vae", "scheduler"):
                _link_or_copy_tree(base / sub, tmp / "CogVideoX" / sub)

        decoder_dir = tmp / "decoder"
        decoder_dir.mkdir()
        settings = _decoder_settings(spec)
        LoraConfig(
            r=spec.lora_rank, lora_alpha=spec.lora_alpha, init_lora_weights=True, target_modules=LORA_TARGETS
        ).save_pretrained(str(decoder_dir))
        save_state_dict_file(lora_state(state, spec), decoder_dir / ADAPTER_WEIGHTS)
        motion = {f"linear_{n}.{p}": state[f"flow_embed.{2 * n - 2}.{p}"] for n in (1, 2) for p in ("weight", "bias")}
        save_state_dict_file(motion, decoder_dir / MOTION_WEIGHTS)
        save_state_dict_file({"null_shot_embeds": null_shot_tokens(state, spec)}, decoder_dir / NULL_SHOT_WEIGHTS)
        atomic_write_json(decoder_dir / DECODER_CONFIG, settings)

        for name, target in targets.items():
            if (tmp / name).exists():
                os.replace(tmp / name, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    spatial = 8  # CogVideoX's VAE; the base VAE's own config decides when there is one
    if base is not None:
        spatial = 2 ** (len(read_json_bounded(base / "vae" / "config.json")["block_out_channels"]) - 1)
    height, width = spatial * spec.latent_height, spatial * spec.latent_width
    return {
        "source": str(path),
        "iteration": iteration,
        "tensors_converted": len(state),
        "ignored_tensors": ignored,
        "position_table_max_abs_diff": pos_diff,
        "sizes": {
            "hidden_size": spec.hidden_size,
            "num_layers": spec.num_layers,
            "num_heads": spec.num_heads,
            "time_embed_dim": spec.time_embed_dim,
            "latent_frames": spec.latent_frames,
        },
        "lora_scale": spec.lora_alpha / spec.lora_rank,
        "written": [str(p) for p in targets.values() if p.exists()],
        "has_vae": base is not None,
        "decoder_checkpoint": str(out),
        "decoder_config": {"pretrained": str(targets["CogVideoX"]), **{k: settings[k] for k in DECODER_CONFIG_KEYS}},
        "sampling": {
            "scheduler": "dpm",
            "steps": spec.sample_steps,
            "guidance_scale": spec.guidance_scale,
            "dynamic_cfg": True,
            "dynamic_cfg_exponent": spec.guidance_exponent,
            "num_frames": spec.num_frames,
            "height": height,
            "width": width,
            "fps": 8,
        },
    }
