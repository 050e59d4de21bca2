"""The benchmark's models: full-size (CogVideoX-2B + VAE, Mistral-7B) or tiny architectures, random weights.

No pretrained directory is needed: each architecture is a config written out here, built straight on the target
device in its compute dtype (``torch.device`` as default device, so a 7B model never passes through the CPU), and
wrapped in the project's own modules (:class:`AnimationShotDecoder`, :class:`AnimeGamerMLLM`,
:class:`ActionAwareEncoder`) exactly as the training and inference code wraps the pretrained ones. The trained
parts (LoRA, motion embedding) get random values instead of their zero init, so merged-vs-unmerged LoRA and the
motion path compute something real.

    arch = ARCHITECTURES["full"]
    decoder = build_decoder(arch, decoder_cfg, "cuda", with_vae=True)
    mllm = build_mllm(arch, mllm_cfg, "cuda", tokenizer_dir)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from animegamer.config import DecoderConfig, EncoderConfig, MLLMConfig
from animegamer.models.causal_decoder import CausalLatentDecoder, vae_layout
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.mllm_tokenizer import load_tokenizer
from animegamer.models.shot_encoder import ActionAwareEncoder
from animegamer.models.vae import DTYPES
from animegamer.tiny import COGVIDEOX_2B_SCHEDULER, train_sentencepiece


@dataclass(frozen=True)
class Architecture:
    """Sizes of every model of the game; the settings (LoRA, checkpointing, dtype) come from the run configs."""

    name: str
    transformer: dict  # CogVideoXTransformer3DModel kwargs
    vae: dict  # AutoencoderKLCogVideoX kwargs
    mistral: dict  # MistralConfig kwargs
    clip_tokens: int  # CLIP tokens per frame after dropping CLS (the precomputed stage (a) features)
    clip_dim: int
    text_tokens: int  # T5 tokens (the precomputed stage (a) features)
    text_dim: int
    tokenizer_vocab: int = 512  # size of the small BPE tokenizer trained for the prompt layout (<= mistral vocab)

    @property
    def hidden(self) -> int:
        """Decoder width = width of a shot representation s_a."""
        return self.transformer["num_attention_heads"] * self.transformer["attention_head_dim"]

    @property
    def spatial_compression(self) -> int:
        return 2 ** (len(self.vae["block_out_channels"]) - 1)


FULL = Architecture(
    name="full",
    # CogVideoX-2B transformer/config.json
    transformer=dict(
        num_attention_heads=30,
        attention_head_dim=64,
        in_channels=16,
        out_channels=16,
        flip_sin_to_cos=True,
        freq_shift=0,
        time_embed_dim=512,
        text_embed_dim=4096,
        num_layers=30,
        dropout=0.0,
        attention_bias=True,
        sample_width=90,
        sample_height=60,
        sample_frames=49,
        patch_size=2,
        temporal_compression_ratio=4,
        max_text_seq_length=226,
        activation_fn="gelu-approximate",
        timestep_activation_fn="silu",
        norm_elementwise_affine=True,
        norm_eps=1e-5,
        spatial_interpolation_scale=1.875,
        temporal_interpolation_scale=1.0,
        use_rotary_positional_embeddings=False,
    ),
    # CogVideoX-2B vae/config.json
    vae=dict(
        block_out_channels=(128, 256, 256, 512),
        latent_channels=16,
        layers_per_block=3,
        norm_eps=1e-6,
        norm_num_groups=32,
        temporal_compression_ratio=4,
        sample_height=480,
        sample_width=720,
        scaling_factor=1.15258426,
        force_upcast=True,
        use_quant_conv=False,
        use_post_quant_conv=False,
    ),
    # Mistral-7B-v0.1 config.json
    mistral=dict(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=32768,
        sliding_window=4096,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    ),
    clip_tokens=256,  # ViT-H-14 at 224 px
    clip_dim=1280,
    text_tokens=226,  # T5-XXL
    text_dim=4096,
)

# The sizes of animegamer.tiny's checkpoints (2 layers of width 32, 4 latent channels, a 64-wide Mistral).
TINY = Architecture(
    name="tiny",
    transformer=dict(
        num_attention_heads=4,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        time_embed_dim=32,
        text_embed_dim=32,
        num_layers=2,
        sample_height=8,
        sample_width=12,
        sample_frames=17,
        max_text_seq_length=226,
    ),
    vae=dict(
        block_out_channels=(8, 8, 16, 16),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=4,
        temporal_compression_ratio=4,
        sample_height=64,
        sample_width=96,
    ),
    mistral=dict(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        sliding_window=None,
        tie_word_embeddings=False,
    ),
    clip_tokens=16,
    clip_dim=32,
    text_tokens=226,
    text_dim=32,
)

ARCHITECTURES = {"full": FULL, "tiny": TINY}


@contextmanager
def building_on(device: torch.device | str, dtype: torch.dtype = torch.float32) -> Iterator[None]:
    """Create parameters directly on ``device`` in ``dtype`` (default device + default dtype, restored after)."""
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            yield
    finally:
        torch.set_default_dtype(before)


def randomize_trained(parameters: list[nn.Parameter], seed: int, std: float = 0.02) -> None:
    """Gaussian values in every trained tensor: LoRA B and the motion embedding's last layer start at zero, which
    would make a merged LoRA or the motion path trivially exact."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in parameters:
            p.copy_((torch.randn(p.shape, generator=g) * std).to(p.device, p.dtype))


def build_tokenizer(out_dir: str | Path, vocab_size: int) -> Path:
    """A Llama-style BPE tokenizer trained on the tiny corpus, saved to ``out_dir`` (no download needed).

    Only the prompt layout needs a tokenizer; the 226 slots per turn dominate the prompt's length either way.
    """
    import shutil

    from transformers import LlamaTokenizer

    out_dir = Path(out_dir)
    spm_dir = out_dir / "_spm"
    train_sentencepiece(
        spm_dir / "tokenizer",
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
    )
    LlamaTokenizer.from_pretrained(str(spm_dir)).save_pretrained(str(out_dir))
    shutil.rmtree(spm_dir)
    return out_dir


def build_decoder(arch: Architecture, cfg: DecoderConfig, device: torch.device | str, with_vae: bool, seed: int = 0):
    """:class:`AnimationShotDecoder` around a random CogVideoX transformer (+ VAE) of ``arch``, built on ``device``.

    LoRA, motion embedding and gradient checkpointing follow ``cfg``; frozen weights are in ``cfg.dtype``.
    """
    from diffusers import AutoencoderKLCogVideoX, CogVideoXTransformer3DModel

    torch.manual_seed(seed)
    with building_on(device, DTYPES[cfg.dtype]):
        # .to(device) also moves any buffer a constructor built on an explicit device (no-op otherwise)
        transformer = CogVideoXTransformer3DModel(**arch.transformer).to(device)
        vae = AutoencoderKLCogVideoX(**arch.vae).to(device).eval().requires_grad_(False) if with_vae else None
    with building_on(device):
        decoder = AnimationShotDecoder.from_modules(cfg, transformer, vae, COGVIDEOX_2B_SCHEDULER)
    randomize_trained(decoder.trainable_parameters(), seed)
    return decoder


def build_mllm(
    arch: Architecture,
    cfg: MLLMConfig,
    device: torch.device | str,
    tokenizer_dir: str | Path,
    seed: int = 0,
):
    """:class:`AnimeGamerMLLM` around a random Mistral of ``arch``, built on ``device`` (base weights in
    ``cfg.dtype``, attention ``cfg.attn_implementation``); LoRA, slots and checkpointing follow ``cfg``."""
    from transformers import MistralConfig, MistralForCausalLM

    tokenizer, base_vocab = load_tokenizer(str(tokenizer_dir), cfg.vocabulary, cfg.num_slots)
    if base_vocab > arch.mistral["vocab_size"]:
        raise ValueError(f"tokenizer has {base_vocab} tokens, more than the model's {arch.mistral['vocab_size']}")
    torch.manual_seed(seed)
    config = MistralConfig(**arch.mistral)
    config._attn_implementation = cfg.attn_implementation
    with building_on(device, DTYPES[cfg.dtype]):
        llm = MistralForCausalLM(config).to(device)
    with building_on(device):
        model = AnimeGamerMLLM.from_modules(cfg, llm, tokenizer, base_vocab, shot_dim=arch.hidden)
    randomize_trained([p for n, p in model.named_parameters() if "lora_" in n], seed)
    return model


# the small decoder's widths per preset: the full one is stage (e)'s default (9.9 M parameters for 16 channels)
SMALL_SIZES = {"full": ((256, 128, 64), 3), "tiny": ((16, 16, 8), 1)}


def build_small_decoder(decoder: AnimationShotDecoder, preset: str, seed: int = 0) -> CausalLatentDecoder:
    """A random stage (e) small decoder for ``decoder``'s VAE at ``preset``'s widths, on its device and dtype."""
    channels, blocks = SMALL_SIZES[preset]
    torch.manual_seed(seed)
    small = CausalLatentDecoder(*vae_layout(dict(decoder.vae.config)), channels, blocks)
    return small.to(device=decoder.device, dtype=decoder.dtype).eval()


def build_encoder(arch: Architecture, cfg: EncoderConfig, device: torch.device | str, seed: int = 0):
    """:class:`ActionAwareEncoder` with ``cfg``'s variant (projector, fusion, mixing) at ``arch``'s widths."""

    torch.manual_seed(seed)
    with building_on(device):
        return ActionAwareEncoder(
            clip_dim=arch.clip_dim,
            clip_tokens=arch.clip_tokens,
            text_dim=arch.text_dim,
            text_tokens=arch.text_tokens,
            hidden_dim=arch.hidden,
            num_tokens=arch.transformer["max_text_seq_length"],
            projector=cfg.projector,
            fusion=cfg.fusion,
            token_mixing=cfg.token_mixing,
            cross_attn_heads=cfg.cross_attn_heads,
        )


@dataclass
class ParameterCounts:
    """Parameters of each model (all / trained)."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def add(self, name: str, module: nn.Module) -> None:
        params = list(module.parameters())
        self.counts[name] = {
            "total": sum(p.numel() for p in params),
            "trained": sum(p.numel() for p in params if p.requires_grad),
        }


def tokenwise_linear_params(layers: nn.Module) -> int:
    """Weights of every ``nn.Linear`` inside ``layers`` (LoRA A/B included): the matmuls each token goes through."""
    return sum(m.weight.numel() for m in layers.modules() if isinstance(m, nn.Linear))
