"""The release's SAT decoder files: the model YAML's sizes and settings, the checkpoint directory, validated.

``read_model_yaml`` turns VDM_Decoder/configs/cogvideox_2b.yaml (or None: the released values) into a
:class:`SatDecoderSpec`; ``expected_shapes`` lists every tensor that spec implies; ``read_sat_checkpoint`` reads
``latest`` + ``<iter>/mp_rank_00_model_states.pt`` without executing pickles and refuses, in one line naming the file,
anything that is not exactly those tensors.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import torch

from animegamer.official.release_io import ReleaseFileError, load_release_pickle, read_release_yaml, tensor_dict

PREFIX = "model.diffusion_model."
MODEL_STATES = "mp_rank_00_model_states.pt"
LORA_TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
# inference_Decoder.py's motion level -> flow value (levels 1, 2, 3, 4, anything else)
RELEASE_FLOW_VALUES = [0.5, 2.5, 10.0, 15.0, 40.0]
# SAT LayerNorm eps the checkpoint cannot tell: SAT's layernorm_epsilon (1e-5) for the transformer's norms and the
# fusion norms; 1e-6 for qk-LN and the final layer's norm_final. diffusers' config has one norm_eps (1e-5) and
# hard-codes 1e-6 for qk-LN, so only norm_out's is recorded and applied on load.
SAT_EPS, SAT_FINAL_NORM_EPS = 1e-5, 1e-6
RELEASE_IMAGE_TOKENS = 196  # FrozenOpenCLIPImageEmbedder_196: ViT-B-16 at 224 px, CLS dropped


@dataclasses.dataclass(frozen=True)
class SatDecoderSpec:
    """What the SAT model YAML says about the decoder (defaults: the released cogvideox_2b.yaml)."""

    hidden_size: int = 1920
    num_layers: int = 30
    num_heads: int = 30
    time_embed_dim: int = 512
    in_channels: int = 16
    out_channels: int = 16
    patch_size: int = 2
    num_frames: int = 17  # video frames; latent frames = (num_frames - 1) // time_compressed_rate + 1
    time_compressed_rate: int = 4
    latent_height: int = 60
    latent_width: int = 90
    text_hidden_size: int = 4096
    ip_hidden_size: int = 768
    text_length: int = 226
    image_tokens: int = RELEASE_IMAGE_TOKENS
    height_interpolation: float = 1.875
    width_interpolation: float = 1.875
    elementwise_affine: bool = True
    lora_rank: int = 64
    lora_alpha: int | float = 1  # SAT lora2's default
    shift_scale: float = 3.0  # ZeroSNRDDPMDiscretization
    linear_start: float = 0.00085
    linear_end: float = 0.012
    num_idx: int = 1000
    sample_steps: int = 50
    guidance_scale: float = 6.0
    guidance_exponent: float = 5.0

    @property
    def latent_frames(self) -> int:
        return (self.num_frames - 1) // self.time_compressed_rate + 1

    @property
    def video_tokens(self) -> int:
        return self.latent_frames * (self.latent_height // self.patch_size) * (self.latent_width // self.patch_size)


def _get(tree: dict, dotted: str, source: Path, default=None):
    node = tree
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            if default is not None:
                return default
            raise ReleaseFileError(f"{source}: missing {dotted}")
        node = node[part]
    return node


def _number(value) -> int | float:
    """An int when the value is integral (config fields such as DecoderConfig.lora_alpha are ints)."""
    value = float(value)
    return int(value) if value.is_integer() else value


def read_model_yaml(path: str | Path | None) -> SatDecoderSpec:
    """The decoder sizes and sampler settings of a SAT model YAML; ``None``: the released CogVideoX-2B values.

    Only the variant the release uses is supported (concatenated T5 + CLIP fusion, qk-LN, flow condition, no IP
    cross-attention); anything else is refused with one line.
    """
    if path is None:
        return SatDecoderSpec()
    path = Path(path)
    model = _get(read_release_yaml(path, "model YAML"), "model", path)
    net = _get(model, "network_config.params", path)
    mods = _get(net, "modules", path)
    patch = _get(mods, "patch_embed_config.params", path)
    lora = _get(mods, "lora_config.params", path)
    required = {
        "network_config.params.flow_condition": (_get(net, "flow_condition", path, False), True),
        "network_config.params.have_ip_cross_attn": (_get(net, "have_ip_cross_attn", path, False), False),
        "patch_embed_config.params.ip_hidden_size": (patch.get("ip_hidden_size"), 768),
        "patch_embed_config.params.use_attention_mix": (patch.get("use_attention_mix", False), False),
        "adaln_layer_config.params.qk_ln": (_get(mods, "adaln_layer_config.params.qk_ln", path, False), True),
    }
    for key, (value, wanted) in required.items():
        if value != wanted:
            raise ReleaseFileError(f"{path}: {key} is {value!r}; only the released variant ({wanted!r}) converts")
    image_encoder = str(_get(model, "clip_img_encoder_config.target", path, "none"))
    tokens = re.search(r"_(\d+)$", image_encoder)
    discretization = _get(model, "denoiser_config.params.discretization_config.params", path, {"shift_scale": 1.0})
    guider = _get(model, "sampler_config.params.guider_config.params", path)
    pos = _get(mods, "pos_embed_config.params", path)
    try:
        return SatDecoderSpec(
            hidden_size=int(net["hidden_size"]),
            num_layers=int(net["num_layers"]),
            num_heads=int(net["num_attention_heads"]),
            time_embed_dim=int(net["time_embed_dim"]),
            in_channels=int(net["in_channels"]),
            out_channels=int(net["out_channels"]),
            patch_size=int(net["patch_size"]),
            num_frames=int(net["num_frames"]),
            time_compressed_rate=int(net["time_compressed_rate"]),
            latent_height=int(net["latent_height"]),
            latent_width=int(net["latent_width"]),
            text_hidden_size=int(patch["text_hidden_size"]),
            ip_hidden_size=int(patch["ip_hidden_size"]),
            text_length=int(pos["text_length"]),
            image_tokens=int(tokens.group(1)) if tokens else RELEASE_IMAGE_TOKENS,
            height_interpolation=float(pos["height_interpolation"]),
            width_interpolation=float(pos["width_interpolation"]),
            elementwise_affine=bool(net.get("elementwise_affine", True)),
            lora_rank=int(lora["r"]),
            lora_alpha=_number(lora.get("lora_alpha", 1)),
            shift_scale=float(discretization.get("shift_scale", 1.0)),
            linear_start=float(discretization.get("linear_start", 0.00085)),
            linear_end=float(discretization.get("linear_end", 0.012)),
            num_idx=int(_get(model, "denoiser_config.params.num_idx", path)),
            sample_steps=int(_get(model, "sampler_config.params.num_steps", path)),
            guidance_scale=float(guider["scale"]),
            guidance_exponent=float(guider["exp"]),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReleaseFileError(f"{path}: missing or malformed decoder setting {exc}") from None


def expected_shapes(spec: SatDecoderSpec) -> dict[str, tuple[int, ...]]:
    """Every ``model.diffusion_model.*`` tensor of the release's DiT and its shape, from the YAML's sizes."""
    h, temb, r, p = spec.hidden_size, spec.time_embed_dim, spec.lora_rank, spec.patch_size
    head_dim = h // spec.num_heads
    shapes = {
        "mixins.pos_embed.pos_embedding": (1, spec.text_length + spec.video_tokens, h),
        "mixins.patch_embed.proj.weight": (h, spec.in_channels, p, p),
        "mixins.patch_embed.proj.bias": (h,),
        "mixins.patch_embed.text_proj.0.weight": (h, spec.text_hidden_size),
        "mixins.patch_embed.text_proj.2.weight": (h, h),
        "mixins.patch_embed.ip_proj.0.weight": (h, spec.ip_hidden_size),
        "mixins.patch_embed.ip_proj.2.weight": (h, h),
        "mixins.final_layer.linear.weight": (p * p * spec.out_channels, h),
        "mixins.final_layer.linear.bias": (p * p * spec.out_channels,),
        "mixins.final_layer.adaLN_modulation.1.weight": (2 * h, temb),
        "mixins.final_layer.adaLN_modulation.1.bias": (2 * h,),
    }
    for name in ("text_proj.0", "text_proj.2", "ip_proj.0", "ip_proj.2"):
        shapes[f"mixins.patch_embed.{name}.bias"] = (h,)
    norms = [f"mixins.patch_embed.{n}_mix_layer_norm" for n in ("output", "ip", "txt")]
    norms += ["mixins.final_layer.norm_final", "transformer.final_layernorm"]
    for embed in ("time_embed", "flow_embed"):
        shapes.update({f"{embed}.0.weight": (temb, h), f"{embed}.0.bias": (temb,)})
        shapes.update({f"{embed}.2.weight": (temb, temb), f"{embed}.2.bias": (temb,)})
    for i in range(spec.num_layers):
        shapes[f"mixins.adaln_layer.adaLN_modulations.{i}.1.weight"] = (12 * h, temb)
        shapes[f"mixins.adaln_layer.adaLN_modulations.{i}.1.bias"] = (12 * h,)
        for kind in ("query", "key"):
            shapes[f"mixins.adaln_layer.{kind}_layernorm_list.{i}.weight"] = (head_dim,)
            shapes[f"mixins.adaln_layer.{kind}_layernorm_list.{i}.bias"] = (head_dim,)
        layer = f"transformer.layers.{i}"
        norms += [f"{layer}.input_layernorm", f"{layer}.post_attention_layernorm"]
        shapes[f"{layer}.attention.query_key_value.original.weight"] = (3 * h, h)
        shapes[f"{layer}.attention.query_key_value.original.bias"] = (3 * h,)
        shapes[f"{layer}.attention.dense.original.weight"] = (h, h)
        shapes[f"{layer}.attention.dense.original.bias"] = (h,)
        for j in range(3):
            shapes[f"{layer}.attention.query_key_value.matrix_A.{j}"] = (r, h)
            shapes[f"{layer}.attention.query_key_value.matrix_B.{j}"] = (h, r)
        shapes[f"{layer}.attention.dense.matrix_A.0"] = (r, h)
        shapes[f"{layer}.attention.dense.matrix_B.0"] = (h, r)
        shapes[f"{layer}.mlp.dense_h_to_4h.weight"] = (4 * h, h)
        shapes[f"{layer}.mlp.dense_h_to_4h.bias"] = (4 * h,)
        shapes[f"{layer}.mlp.dense_4h_to_h.weight"] = (h, 4 * h)
        shapes[f"{layer}.mlp.dense_4h_to_h.bias"] = (h,)
    for norm in norms:
        shapes.update({f"{norm}.weight": (h,), f"{norm}.bias": (h,)})
    return shapes


def read_sat_checkpoint(ckpt_dir: str | Path, spec: SatDecoderSpec) -> tuple[Path, int, dict[str, torch.Tensor], int]:
    """(file, iteration, the DiT's tensors without the prefix, count of other tensors ignored), validated.

    Keys outside ``model.diffusion_model.`` (a VAE or text encoder a training run may have saved) are ignored; inside
    it every expected tensor must be present with the YAML's shape and nothing else may be.
    """
    ckpt_dir = Path(ckpt_dir)
    latest = ckpt_dir / "latest"
    if not latest.is_file():
        raise ReleaseFileError(f"{latest}: file not found (a SAT checkpoint dir holds latest + <iter>/{MODEL_STATES})")
    text = latest.read_text(errors="replace").strip()
    if not text.isdigit():
        raise ReleaseFileError(f"{latest}: expected an iteration number, got {text[:40]!r}")
    path = ckpt_dir / text / MODEL_STATES
    obj = load_release_pickle(path)
    if not isinstance(obj, dict) or "module" not in obj:
        raise ReleaseFileError(f"{path}: expected a dict with a 'module' state dict (SAT layout)")
    module = tensor_dict(obj["module"], path, "'module'")
    state = {k[len(PREFIX) :]: v for k, v in module.items() if k.startswith(PREFIX)}
    expected = expected_shapes(spec)
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        what = f"missing {PREFIX}{missing[0]}" if missing else f"unexpected {PREFIX}{unexpected[0]}"
        count = f" ({len(missing)} missing, {len(unexpected)} unexpected)"
        raise ReleaseFileError(f"{path}: does not match the model YAML's decoder: {what}{count}")
    for key, shape in expected.items():
        tensor = state[key]
        if tuple(tensor.shape) != shape or not tensor.is_floating_point():
            raise ReleaseFileError(
                f"{path}: {PREFIX}{key} is {tuple(tensor.shape)} {tensor.dtype}, the model YAML gives {shape} float"
            )
    return path, int(text), state, len(module) - len(state)
