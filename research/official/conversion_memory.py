"""How much memory converting the release's agent takes: a random ``pytorch_model.bin`` shaped like the release's
(peft-wrapped Mistral with modules_to_save norms, embeddings resized to the tokenizer's length, two resamplers),
converted in a child process by ``animegamer.official.mllm.convert_agent``.

    python research/official/conversion_memory.py --tokenizer DIR --hidden-size 2048 --layers 8 --shard-mb 256

prints the file size (about 1 GB of bf16 at the sizes above), the wall time and the child's peak resident memory,
split into anonymous memory (what the conversion really holds) and file-backed pages (shared libraries and the
memory-mapped input: page cache the kernel can drop). TOKENIZER_DIR is a tokenizer at the release's ids (the
release's ``animegamer_tokenizer``, or the stand-in ``animegamer.official.release_files.build_release_tokenizer``
writes).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from animegamer.bench.official import measure_conversion
from animegamer.cli import fail
from animegamer.official.release_files import random_agent_state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="a tokenizer directory at the release's ids")
    parser.add_argument("--hidden-size", type=int, default=2048, help="the random Mistral's hidden size")
    parser.add_argument("--layers", type=int, default=8, help="the random Mistral's decoder layers")
    parser.add_argument("--lora-rank", type=int, default=32, help="rank of the release-shaped LoRA")
    parser.add_argument("--shot-dim", type=int, default=1920, help="width of a shot token (the resamplers' outside)")
    parser.add_argument("--shard-mb", type=int, default=2048, help="output shard size (the conversion's working set)")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    except (OSError, ValueError) as exc:
        fail(f"{args.tokenizer}: not a readable tokenizer ({str(exc).splitlines()[0]})")
    vocab_total, base_vocab = len(tokenizer), tokenizer.vocab_size
    config = {
        "hidden_size": args.hidden_size,
        "intermediate_size": args.hidden_size * 11 // 4,
        "num_hidden_layers": args.layers,
        "num_attention_heads": max(1, args.hidden_size // 128),
        "num_key_value_heads": max(1, args.hidden_size // 512),
        "vocab_size": base_vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "sliding_window": 4096,
        "tie_word_embeddings": False,
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        agent = root / "pytorch_model.bin"
        torch.save(random_agent_state(config, args.lora_rank, args.shot_dim, vocab_total), agent)
        (root / "config.json").write_text(json.dumps(config))
        (root / "llm.yaml").write_text(
            json.dumps({"peft_config": {"r": args.lora_rank, "lora_alpha": args.lora_rank}})
        )
        child_args = {
            "agent_bin": str(agent),
            "tokenizer_dir": args.tokenizer,
            "out_dir": str(root / "out"),
            "base_config": str(root / "config.json"),
            "llm_yaml": str(root / "llm.yaml"),
            "shard_bytes": args.shard_mb * 1024**2,
        }
        try:
            measured = measure_conversion("animegamer.official.mllm:convert_agent", child_args)
        except RuntimeError as exc:
            fail(str(exc))
        report = {"agent_file_mb": agent.stat().st_size / 1024**2, "shard_mb": args.shard_mb, **measured}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
