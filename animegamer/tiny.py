"""Tiny random models, built from configs and saved in the real on-disk layouts.

Tests, ``make demo`` and SpriteWorld load these through the same ``from_pretrained`` code that loads
CLIP ViT-H-14, T5-XXL, CogVideoX-2B and Mistral-7B. Weights are random but seeded, so every build is
identical. Tokenizers are sentencepiece models trained on the fly on a small corpus.

    python scripts/make_tiny_checkpoints.py --out checkpoints/tiny
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

import torch

from animegamer.io import atomic_write_text

# Words the tiny tokenizers must cover: the game instruction format and a small life-sim lexicon.
_CORPUS_WORDS = """
Character Motion Background the a an and of in on at to with is are
Qiqi Sam Mia Ken Luna girl boy cat dog friend character characters
walk walks run runs jump jumps fly flies sleep sleeps eat eats talk talks read reads sit sits dance dances
swim play plays cook cooks lie down stand up look wave waves laugh cry smile sing sings climb
gently quickly slowly happily calmly softly loudly fast slow high low together alone
forest bedroom kitchen park beach street school garden sky room house city field river mountain
night day morning evening sunset rain snow sunny dark bright
""".split()


def corpus_lines(repeat: int = 30, words: Sequence[str] = ()) -> list[str]:
    """A deterministic corpus of instruction-like sentences for training tiny tokenizers.

    ``words`` extends the lexicon (e.g. a world's own names, adverbs and places): a word the corpus never shows is
    split into letters, so its sentences would tokenize to lengths that vary with the spelling of their words.
    """
    import random

    lexicon = _CORPUS_WORDS + [w for w in dict.fromkeys(words) if w not in _CORPUS_WORDS]
    rng = random.Random(0)
    lines = []
    for _ in range(repeat * 20):
        picked = rng.sample(lexicon, 8)
        lines.append(f"Character: {picked[0]}; Motion: {picked[1]} {picked[2]}; Background: {picked[3]} {picked[4]}.")
        lines.append(" ".join(picked))
    lines += [" ".join(lexicon)] * 5
    return lines


def train_sentencepiece(
    out_prefix: Path, vocab_size: int = 256, model_type: str = "unigram", words: Sequence[str] = (), **kwargs
) -> Path:
    """Train a sentencepiece model on :func:`corpus_lines` (with ``words``); returns the ``.model`` path."""
    import sentencepiece as spm

    out_prefix.parent.mkdir(parents=True, exist_ok=True)
    corpus = out_prefix.with_suffix(".corpus.txt")
    corpus.write_text("\n".join(corpus_lines(words=words)) + "\n", encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(out_prefix),
        vocab_size=vocab_size,
        model_type=model_type,
        character_coverage=1.0,
        hard_vocab_limit=False,
        minloglevel=2,
        **kwargs,
    )
    corpus.unlink()
    return out_prefix.with_suffix(".model")


TINY_CLIP_CONFIG = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 32, "layers": 3, "width": 32, "head_width": 16, "patch_size": 8},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 2},
}
TINY_CLIP_ARCH = "animegamer-tiny-vit"


def build_tiny_clip(out_dir: str | Path, seed: int = 0, arch: str = TINY_CLIP_ARCH) -> tuple[Path, Path]:
    """Write an open_clip model config JSON and random weights; returns (config path, weights path)."""
    import open_clip
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / f"{arch}.json"
    config_path.write_text(json.dumps(TINY_CLIP_CONFIG, indent=2))
    open_clip.add_model_config(config_path)
    torch.manual_seed(seed)
    model = open_clip.create_model(arch, pretrained=None)
    weights = out_dir / "open_clip_model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    return config_path, weights


def build_tiny_t5(out_dir: str | Path, seed: int = 0, d_model: int = 32, words: Sequence[str] = ()) -> Path:
    """A tiny T5 encoder + sentencepiece tokenizer in diffusers layout (text_encoder/, tokenizer/); ``words``
    extend the tokenizer's corpus (:func:`corpus_lines`)."""
    from transformers import T5Config, T5EncoderModel, T5Tokenizer

    out_dir = Path(out_dir)
    spm_model = train_sentencepiece(out_dir / "_spm" / "spiece", vocab_size=200, words=words)
    tokenizer = T5Tokenizer.from_pretrained(str(spm_model.parent), extra_ids=0)
    tokenizer.save_pretrained(str(out_dir / "tokenizer"))
    shutil.rmtree(spm_model.parent)
    torch.manual_seed(seed)
    config = T5Config(
        vocab_size=len(tokenizer),
        d_model=d_model,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=32,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    T5EncoderModel(config).save_pretrained(str(out_dir / "text_encoder"))
    return out_dir


# CogVideoX-2B's scheduler config (v-prediction, zero-terminal-SNR betas, SNR shift 3), kept for the tiny copy.
COGVIDEOX_2B_SCHEDULER = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "clip_sample": False,
    "clip_sample_range": 1.0,
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "rescale_betas_zero_snr": True,
    "sample_max_value": 1.0,
    "set_alpha_to_one": True,
    "snr_shift_scale": 3.0,
    "steps_offset": 0,
    "timestep_spacing": "trailing",
}


def build_tiny_cogvideox(
    out_dir: str | Path, seed: int = 0, text_embed_dim: int = 32, height: int = 64, width: int = 96
) -> Path:
    """A tiny CogVideoX-2B look-alike in diffusers layout: ``transformer/``, ``vae/``, ``scheduler/``.

    Written beside the tiny T5 (``text_encoder/``, ``tokenizer/``) so ``out_dir`` is a whole CogVideoX folder.
    Same architecture family as 2B (sincos positions, no rotary, patch 2, 226 text tokens, 4x temporal and 8x
    spatial VAE compression), with 2 layers of width 32 (4 heads x 8) and a 4-channel latent.
    """
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXTransformer3DModel

    out_dir = Path(out_dir)
    torch.manual_seed(seed)
    vae = AutoencoderKLCogVideoX(
        block_out_channels=(8, 8, 16, 16),
        latent_channels=4,
        layers_per_block=1,
        norm_num_groups=4,
        temporal_compression_ratio=4,
        sample_height=height,
        sample_width=width,
    )
    vae.save_pretrained(str(out_dir / "vae"))
    spatial = 2 ** (len(vae.config.block_out_channels) - 1)
    transformer = CogVideoXTransformer3DModel(
        num_attention_heads=4,
        attention_head_dim=8,
        in_channels=4,
        out_channels=4,
        time_embed_dim=32,
        text_embed_dim=text_embed_dim,
        num_layers=2,
        sample_height=height // spatial,
        sample_width=width // spatial,
        sample_frames=17,
        max_text_seq_length=226,
    )
    transformer.save_pretrained(str(out_dir / "transformer"))
    CogVideoXDDIMScheduler(**COGVIDEOX_2B_SCHEDULER).save_pretrained(str(out_dir / "scheduler"))
    write_model_index(out_dir)
    return out_dir


def write_model_index(out_dir: str | Path) -> None:
    """model_index.json: a CogVideoX folder we write also loads as diffusers' own CogVideoXPipeline."""
    index = {
        "_class_name": "CogVideoXPipeline",
        "scheduler": ["diffusers", "CogVideoXDDIMScheduler"],
        "text_encoder": ["transformers", "T5EncoderModel"],
        "tokenizer": ["transformers", "T5Tokenizer"],
        "transformer": ["diffusers", "CogVideoXTransformer3DModel"],
        "vae": ["diffusers", "AutoencoderKLCogVideoX"],
    }
    atomic_write_text(Path(out_dir) / "model_index.json", json.dumps(index, indent=2) + "\n")


def build_all(out_dir: str | Path, seed: int = 0) -> dict[str, Path]:
    """Every tiny model the tiny configs name, under ``out_dir`` (clip/, CogVideoX/, Mistral/)."""
    out_dir = Path(out_dir)
    written: dict[str, Path] = {}
    _, written["clip"] = build_tiny_clip(out_dir / "clip", seed=seed)
    written["t5"] = build_tiny_t5(out_dir / "CogVideoX", seed=seed)
    written["mistral"] = build_tiny_mistral(out_dir / "Mistral", seed=seed)
    written["cogvideox"] = build_tiny_cogvideox(out_dir / "CogVideoX", seed=seed)
    return written


def build_tiny_mistral(
    out_dir: str | Path, seed: int = 0, hidden_size: int = 64, words: Sequence[str] = ()
) -> Path:
    """A tiny ``MistralForCausalLM`` + Llama-style sentencepiece BPE tokenizer (byte fallback), in HF layout.

    The tokenizer is trained on :func:`corpus_lines` (with ``words``), converted by ``LlamaTokenizer`` and saved with
    ``save_pretrained``, so ``AutoTokenizer.from_pretrained(out_dir)`` reloads it like Mistral-7B's.
    """
    from transformers import LlamaTokenizer, MistralConfig, MistralForCausalLM

    out_dir = Path(out_dir)
    spm_dir = out_dir / "_spm"
    train_sentencepiece(
        spm_dir / "tokenizer",
        vocab_size=512,
        model_type="bpe",
        words=words,
        byte_fallback=True,  # as Llama/Mistral: no <unk> for unseen characters
        split_digits=True,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
    )
    tokenizer = LlamaTokenizer.from_pretrained(str(spm_dir))  # reads spm_dir/tokenizer.model
    tokenizer.save_pretrained(str(out_dir))
    shutil.rmtree(spm_dir)
    torch.manual_seed(seed)
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        sliding_window=None,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    MistralForCausalLM(config).save_pretrained(str(out_dir))
    return out_dir
