"""Convert the official AnimeGamer release (TencentARC/AnimeGamer) into this project's checkpoint layout.

    python scripts/convert_official.py --out checkpoints/official/Qiqi \\
        --agent-bin release/MLLM-Qiqi/pytorch_model.bin --tokenizer release/animegamer_tokenizer \\
        --mistral checkpoints/Mistral-7B-Instruct-v0.1 \\
        --decoder-ckpt release/VDM_Decoder-Qiqi --cogvideox checkpoints/CogVideoX-2b
    python inference_MLLM.py --config checkpoints/official/Qiqi/inference.yaml game=game_demo/demo.txt
    python inference_Decoder.py --config checkpoints/official/Qiqi/inference.yaml

Converts the agent (``--agent-bin``), the decoder (``--decoder-ckpt``) or both into ``--out``: ``Mistral/``,
``mllm/``, ``CogVideoX/``, ``decoder/``, plus ``inference.yaml`` (the config every play command takes unchanged) and
``conversion.json``. The release's files are pickles: they are read with PyTorch's restricted unpickler (nothing in
them runs) and memory-mapped; converting the 7B agent needs about 3 GB of RAM besides the page cache (README, "Play
the released weights"). Any bad input stops with one ``error: ...`` line (exit 2) and writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from animegamer.cli import fail
from animegamer.official.release_io import ReleaseFileError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--out", required=True, help="the converted checkpoint directory (new, or empty; not a symbolic link)"
    )
    agent = parser.add_argument_group("MLLM agent")
    agent.add_argument("--agent-bin", help="the release's MLLM-<film>/pytorch_model.bin (peft agent state dict)")
    agent.add_argument("--tokenizer", help="the release's tokenizer directory (MLLM/VisualAR/animegamer_tokenizer)")
    agent.add_argument(
        "--mistral",
        help="Mistral-7B-Instruct-v0.1 transformers directory: its config.json, and base weights the .bin lacks",
    )
    agent.add_argument("--mistral-config", help="a Mistral config.json to use instead of --mistral's")
    agent.add_argument(
        "--llm-yaml", help="the release's LLM YAML (LoRA r/alpha; default: the released r 32, alpha 32)"
    )
    agent.add_argument("--agent-yaml", help="the release's agent YAML (resampler num_queries; default: 226)")
    decoder = parser.add_argument_group("video decoder")
    decoder.add_argument(
        "--decoder-ckpt", help="the release's VDM_Decoder-<film> SAT dir (latest + <iter>/mp_rank_00_model_states.pt)"
    )
    decoder.add_argument("--decoder-yaml", help="the release's SAT model YAML (default: released CogVideoX-2B values)")
    decoder.add_argument("--cogvideox", help="diffusers CogVideoX-2b directory: its vae/ and scheduler/ are used")
    play = parser.add_argument_group("the written inference.yaml")
    play.add_argument(
        "--compat",
        choices=("released", "fixed"),
        default="fixed",
        help="released: the release's numerics, quirks included; fixed (default): its known bugs corrected",
    )
    play.add_argument(
        "--history-turns", type=int, default=0, help="earlier turns the MLLM sees (default 0, as the release plays)"
    )
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    from animegamer.official.convert import INFERENCE_FILE, convert_release

    try:
        summary = convert_release(
            args.out,
            agent_bin=args.agent_bin,
            tokenizer_dir=args.tokenizer,
            mistral_dir=args.mistral,
            mistral_config=args.mistral_config,
            llm_yaml=args.llm_yaml,
            agent_yaml=args.agent_yaml,
            decoder_dir=args.decoder_ckpt,
            decoder_yaml=args.decoder_yaml,
            cogvideox_dir=args.cogvideox,
            compat=args.compat,
            history_turns=args.history_turns,
        )
    except (ReleaseFileError, OSError, ValueError) as exc:  # OSError: a path that cannot be read or written
        fail(str(exc).splitlines()[0])
    parts = [name for name in ("agent", "decoder") if summary[name] is not None]
    print(f"converted the {' and the '.join(parts)} into {summary['out']}")
    print(f"play: python inference_MLLM.py --config {Path(summary['out']) / INFERENCE_FILE}")


if __name__ == "__main__":
    main()
