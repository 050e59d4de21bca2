"""The whole conversion of an official release into one checkpoint directory, and its ``inference.yaml``.

    out/
      Mistral/          transformers MistralForCausalLM (base vocabulary rows) + the release's tokenizer files
      mllm/             our trained MLLM parts (LoRA adapter, new-token rows, resamplers, layout)
      CogVideoX/        diffusers CogVideoX: the converted transformer, the base model's vae/ and scheduler/
      decoder/          our trained decoder parts (LoRA, flow embedding, release sampler settings)
      inference.yaml    what inference_MLLM.py, inference_Decoder.py, python -m animegamer.play and app.py
                        take (python -m animegamer.play too, under compat: fixed)
      conversion.json   what was converted, from which files, with which sizes

Everything is built in a temp directory beside ``out``, flushed to disk and renamed to ``out`` at the end: a bad input
or a crash leaves nothing half written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import yaml

from animegamer.io import atomic_write_json, atomic_write_text
from animegamer.official.decoder import convert_decoder
from animegamer.official.mllm import convert_agent
from animegamer.official.release_io import ReleaseFileError
from animegamer.training.checkpoint import replace_dir

INFERENCE_FILE = "inference.yaml"
SUMMARY_FILE = "conversion.json"
RELEASE_HISTORY_TURNS = 0  # the release's inference_MLLM.py plays with max_window 1: no earlier turn in the prompt


def _repoint(value: Any, work: Path, out: Path) -> Any:
    """Paths the converters returned inside the temp directory, pointed at the final directory."""
    if isinstance(value, str) and value.startswith(str(work)):
        return str(out) + value[len(str(work)) :]
    if isinstance(value, dict):
        return {k: _repoint(v, work, out) for k, v in value.items()}
    if isinstance(value, list):
        return [_repoint(v, work, out) for v in value]
    return value


def inference_config(out: Path, agent: dict | None, decoder: dict | None, compat: str, history_turns: int) -> dict:
    """The inference.yaml values of a converted checkpoint (config keys of :class:`InferenceConfig`): where the
    weights are and how to run them; both models' shapes are the ones their converted files record
    (:mod:`animegamer.config.recorded`)."""
    cfg: dict[str, Any] = {
        "kind": "inference",
        "output_dir": f"outputs/{out.name}",
        "compat": compat,
        "history_turns": history_turns,
    }
    if agent is not None:
        cfg["mllm"] = {
            "pretrained": agent["mistral_dir"],
            "dtype": "bf16",  # the release runs its agent in bf16
            "gradient_checkpointing": False,
        }
        cfg["mllm_checkpoint"] = agent["mllm_dir"]
    if decoder is not None:
        cfg["decoder"] = {"pretrained": decoder["decoder_config"]["pretrained"], "gradient_checkpointing": False}
        cfg["decoder_checkpoint"] = decoder["decoder_checkpoint"]
        cfg["sampling"] = dict(decoder["sampling"])
    return cfg


def convert_release(
    out: str | Path,
    *,
    agent_bin: str | Path | None = None,
    tokenizer_dir: str | Path | None = None,
    mistral_dir: str | Path | None = None,
    mistral_config: str | Path | None = None,
    llm_yaml: str | Path | None = None,
    agent_yaml: str | Path | None = None,
    decoder_dir: str | Path | None = None,
    decoder_yaml: str | Path | None = None,
    cogvideox_dir: str | Path | None = None,
    compat: str = "fixed",
    history_turns: int = RELEASE_HISTORY_TURNS,
) -> dict[str, Any]:
    """Convert the agent and/or the decoder into ``out`` (which must not exist, or be empty); returns the summary.

    ``out`` must not be a symbolic link (to anything, or dangling): the finished directory is renamed into place,
    which would replace the link and leave its target empty. Raises :class:`ReleaseFileError` (or FileExistsError /
    ValueError) with one line for any bad input.
    """
    if agent_bin is None and decoder_dir is None:
        raise ValueError("nothing to convert: give the agent .bin, the decoder checkpoint directory, or both")
    if agent_bin is not None and tokenizer_dir is None:
        raise ValueError("the agent needs the release's tokenizer directory (animegamer_tokenizer)")
    if agent_bin is not None and mistral_dir is None and mistral_config is None:
        raise ValueError("the agent needs the base Mistral-7B-Instruct-v0.1 directory (or its config.json)")
    if compat not in ("released", "fixed"):
        raise ValueError(f"compat must be released or fixed, got {compat!r}")
    if history_turns < 0:
        raise ValueError(f"history turns must be >= 0, got {history_turns}")
    out = Path(out).absolute()
    if out.is_symlink():  # publishing is a rename, which would replace the link itself, not fill its target
        raise FileExistsError(f"{out} is a symbolic link; give a new directory (or the link's target) as the output")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise FileExistsError(f"{out} exists and is not an empty directory; choose a new output directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.converting.", dir=out.parent))
    try:
        agent = decoder = None
        if agent_bin is not None:

            agent = convert_agent(
                agent_bin,
                tokenizer_dir,
                work,
                base_dir=mistral_dir,
                llm_yaml=llm_yaml,
                agent_yaml=agent_yaml,
                base_config=mistral_config,
            )
        if decoder_dir is not None:

            decoder = convert_decoder(decoder_dir, work, model_yaml=decoder_yaml, base_dir=cogvideox_dir)
        agent, decoder = _repoint(agent, work, out), _repoint(decoder, work, out)
        config = inference_config(out, agent, decoder, compat, history_turns)
        header = (
            "# Converted official AnimeGamer weights (scripts/convert_official.py). Play them with:\n"
            f"#   python inference_MLLM.py --config {out / INFERENCE_FILE} game=game_demo/demo.txt\n"
            f"#   python inference_Decoder.py --config {out / INFERENCE_FILE}\n"
            f"#   python -m animegamer.play --config {out / INFERENCE_FILE}\n"
            f"#   python app.py --config {out / INFERENCE_FILE}\n"
            "# compat: released reproduces the release's numerics, quirks included; fixed corrects its bugs.\n"
        )
        atomic_write_text(work / INFERENCE_FILE, header + yaml.safe_dump(config, sort_keys=False))
        summary = {
            "out": str(out),
            "agent": agent,
            "decoder": decoder,
            "sources": {
                k: str(v) if v is not None else None
                for k, v in {
                    "agent_bin": agent_bin,
                    "tokenizer_dir": tokenizer_dir,
                    "mistral_dir": mistral_dir,
                    "mistral_config": mistral_config,
                    "llm_yaml": llm_yaml,
                    "agent_yaml": agent_yaml,
                    "decoder_dir": decoder_dir,
                    "decoder_yaml": decoder_yaml,
                    "cogvideox_dir": cogvideox_dir,
                }.items()
            },
        }
        atomic_write_json(work / SUMMARY_FILE, json.loads(json.dumps(summary, default=str)))
        replace_dir(work, out)  # fsynced, then renamed in (an existing out is empty: checked above)
    finally:
        if work.is_symlink():  # an exchange with a link that appeared at ``out`` meanwhile: no stray link is left
            work.unlink()
        shutil.rmtree(work, ignore_errors=True)
    return summary


__all__ = ["INFERENCE_FILE", "ReleaseFileError", "convert_release", "inference_config"]
