"""Random files in the release's on-disk layout: SAT decoder checkpoints and their model YAML, the peft agent's
``pytorch_model.bin``, a stand-in tokenizer at the release's ids. The speed harness's ``official`` part, the tests
and research/official/conversion_memory.py build their release-layout inputs here.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from animegamer.official.sat_layout import PREFIX, SatDecoderSpec, expected_shapes
from animegamer.tiny import corpus_lines

LLM = "llm.base_model.model."
RELEASE_FRAME_TOKENS = 256  # <frame_00000> … <frame_00255> open the release tokenizer's added tokens


def release_added_tokens() -> list[str]:
    """The release tokenizer's 284 added tokens in id order (base vocabulary + 0 … + 283). Three ids whose names
    the reference set does not show get placeholder names (nothing reads them)."""
    frames = [f"<frame_{i:05d}>" for i in range(RELEASE_FRAME_TOKENS)]
    shot = ["<img>", "</img>", "<release_unused_0>", "<release_unused_1>", "<frame>", "</frame>"]
    strengths = [f"<Strength_{k}>" for k in range(-5, 6)]
    tags = ["<ML>", "</ML>", "<SC>", "</SC>", "<ET>", "</ET>", "<ST>", "</ST>", "<TURN>", "</TURN>"]
    return [*frames, *shot, *strengths, "<release_unused_2>", *tags]


def build_release_tokenizer(out_dir: str | Path, base_vocab: int) -> Path:
    """A stand-in for the release's tokenizer (which tests and measurements cannot download): a tiny BPE trained on
    the fly, padded with unreachable pieces to ``base_vocab`` (<unk> 0, <s> 1, </s> 2), then the release's added
    tokens at the release's ids."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(corpus_lines(repeat=2), trainer=trainer)
    data = json.loads(tok.to_str())
    vocab = data["model"]["vocab"]
    for i in range(len(vocab), base_vocab):
        vocab[f"<filler_{i}>"] = i
    fast = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_str(json.dumps(data)), unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.add_special_tokens({"additional_special_tokens": release_added_tokens()})
    out_dir = Path(out_dir)
    fast.save_pretrained(str(out_dir))
    return out_dir


def _sincos_1d(dim: int, positions: torch.Tensor) -> torch.Tensor:
    """[sin, cos] of positions (n,) at ω_k = 10000^(-k / (dim/2)) -> (n, dim), float64."""
    omega = 1.0 / 10000 ** (torch.arange(dim // 2, dtype=torch.float64) / (dim / 2))
    angles = positions.double()[:, None] * omega[None]
    return torch.cat([angles.sin(), angles.cos()], dim=1)


def position_table(spec: SatDecoderSpec) -> torch.Tensor:
    """(1, text_length + video tokens, H): zeros for the conditioning tokens, then per token (t, i, j) the temporal
    part (H/4 channels, frame index) and the spatial part (3H/4: first half the column j, second the row i,
    positions divided by the interpolation scale), as the official reference set's README describes SAT's table."""
    h = spec.hidden_size
    rows, cols = spec.latent_height // spec.patch_size, spec.latent_width // spec.patch_size
    t_idx, i_idx, j_idx = torch.meshgrid(
        torch.arange(spec.latent_frames), torch.arange(rows), torch.arange(cols), indexing="ij"
    )
    spatial = 3 * h // 4
    temporal = _sincos_1d(h // 4, t_idx.flatten().double())
    width = _sincos_1d(spatial // 2, j_idx.flatten().double() / spec.width_interpolation)
    height = _sincos_1d(spatial // 2, i_idx.flatten().double() / spec.height_interpolation)
    video = torch.cat([temporal, width, height], dim=1)  # (T*rows*cols, H)
    return torch.cat([torch.zeros(spec.text_length, h, dtype=torch.float64), video])[None].float()


def write_random_checkpoint(
    out: Path, spec: SatDecoderSpec, seed: int, iteration: int = 7, dtype: torch.dtype = torch.float32
) -> dict:
    """``out/latest`` + ``out/<iteration>/mp_rank_00_model_states.pt`` (SAT's layout: ``{"module": {prefixed
    tensors}, "iteration": n}``) with random weights of every tensor ``spec`` implies, stored in ``dtype``; returns
    the state dict (unprefixed). Weights N(0,1)/sqrt(fan_in), norm weights 1 + 0.1 N, other vectors 0.1 N, the
    position table SAT's fixed sin-cos one (as the reference set draws them)."""
    g = torch.Generator().manual_seed(seed)
    state = {}
    for key, shape in expected_shapes(spec).items():
        if key.endswith("pos_embedding"):
            tensor = position_table(spec)
        elif len(shape) == 1:
            base = 1.0 if key.endswith("weight") else 0.0
            tensor = base + 0.1 * torch.randn(shape, generator=g)
        else:
            tensor = torch.randn(shape, generator=g) / math.prod(shape[1:]) ** 0.5
        state[key] = tensor.to(dtype)
    (out / str(iteration)).mkdir(parents=True)
    (out / "latest").write_text(str(iteration))
    module = {PREFIX + k: v for k, v in state.items()}
    torch.save({"module": module, "iteration": iteration}, out / str(iteration) / "mp_rank_00_model_states.pt")
    return state


def sat_model_yaml(spec: SatDecoderSpec) -> dict:
    """A SAT model YAML tree (VDM_Decoder/configs/cogvideox_2b.yaml's structure, the fields
    :func:`~animegamer.official.sat_layout.read_model_yaml` reads) that describes ``spec``."""
    return {"model": {
        "clip_img_encoder_config": {"target": f"FrozenOpenCLIPImageEmbedder_{spec.image_tokens}"},
        "denoiser_config": {"params": {
            "num_idx": spec.num_idx,
            "discretization_config": {"params": {"shift_scale": spec.shift_scale, "linear_start": spec.linear_start,
                                                 "linear_end": spec.linear_end}},
        }},
        "sampler_config": {"params": {
            "num_steps": spec.sample_steps,
            "guider_config": {"params": {"scale": spec.guidance_scale, "exp": spec.guidance_exponent}},
        }},
        "network_config": {"params": {
            "hidden_size": spec.hidden_size, "num_layers": spec.num_layers, "num_attention_heads": spec.num_heads,
            "time_embed_dim": spec.time_embed_dim, "in_channels": spec.in_channels,
            "out_channels": spec.out_channels, "patch_size": spec.patch_size, "num_frames": spec.num_frames,
            "time_compressed_rate": spec.time_compressed_rate, "latent_height": spec.latent_height,
            "latent_width": spec.latent_width, "elementwise_affine": spec.elementwise_affine,
            "flow_condition": True, "have_ip_cross_attn": False,
            "modules": {
                "patch_embed_config": {"params": {"text_hidden_size": spec.text_hidden_size,
                                                  "ip_hidden_size": spec.ip_hidden_size, "use_attention_mix": False}},
                "lora_config": {"params": {"r": spec.lora_rank, "lora_alpha": spec.lora_alpha}},
                "adaln_layer_config": {"params": {"qk_ln": True}},
                "pos_embed_config": {"params": {"text_length": spec.text_length,
                                                "height_interpolation": spec.height_interpolation,
                                                "width_interpolation": spec.width_interpolation}},
            },
        }},
    }}  # fmt: skip


LORA_MODULES = {"self_attn": ("q_proj", "k_proj", "v_proj", "o_proj"), "mlp": ("gate_proj", "up_proj", "down_proj")}


def random_agent_state(config: dict, lora_rank: int, shot_dim: int, vocab_total: int, seed: int = 0) -> dict:
    """The release agent's flat state dict (bf16) for a Mistral ``config`` (hidden_size, intermediate_size,
    num_hidden_layers, num_attention_heads, num_key_value_heads)."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = hidden // config["num_attention_heads"]
    kv = config["num_key_value_heads"] * head_dim
    shapes = {
        "q_proj": (hidden, hidden),
        "k_proj": (kv, hidden),
        "v_proj": (kv, hidden),
        "o_proj": (hidden, hidden),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }

    def rand(*shape: int, scale: float = 0.02) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)

    state = {
        f"{LLM}model.embed_tokens.weight": rand(vocab_total, hidden),
        f"{LLM}lm_head.weight": rand(vocab_total, hidden),
    }
    norms = ["model.norm"]
    for i in range(config["num_hidden_layers"]):
        for block, names in LORA_MODULES.items():
            for name in names:
                out, inp = shapes[name]
                prefix = f"{LLM}model.layers.{i}.{block}.{name}"
                state[f"{prefix}.base_layer.weight"] = rand(out, inp)
                state[f"{prefix}.lora_A.default.weight"] = rand(lora_rank, inp)
                state[f"{prefix}.lora_B.default.weight"] = rand(out, lora_rank)
        norms += [f"model.layers.{i}.input_layernorm", f"model.layers.{i}.post_attention_layernorm"]
    for norm in norms:
        for copy in ("original_module", "modules_to_save.default"):
            state[f"{LLM}{norm}.{copy}.weight"] = (1 + rand(hidden, scale=0.1).float()).to(torch.bfloat16)
    for which, (a, b) in {"input_resampler": (shot_dim, hidden), "output_resampler": (hidden, shot_dim)}.items():
        state[f"{which}.proj.0.weight"], state[f"{which}.proj.0.bias"] = rand(b, a), rand(b)
        state[f"{which}.proj.2.weight"], state[f"{which}.proj.2.bias"] = rand(b, b), rand(b)
    return state
