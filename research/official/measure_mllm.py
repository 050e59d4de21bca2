"""How far ``compat: fixed`` moves the converted agent's outputs from the official ones, one behaviour at a time.

    python research/official/measure_mllm.py                  # tests/data/official_ref
    python research/official/measure_mllm.py --ref OTHER_SET  # any set in the same layout

Converts the reference set's agent (with a stand-in tokenizer at the release's ids), replays every turn with the
official history window and prints, per turn, the relative L2 change against the official output of: s_a read at
the frame slots (B1), s_a with a causal mask instead of the frame block (B2), the first-step logits with the history
s_a in the prompt (B3), with the previous turn's own state tokens (B5), with both (what ``fixed`` runs), and the
motion-level value logits of ``fixed``. These are the README's numbers ("Play the released weights").
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch
import yaml
from safetensors.torch import load_file

from animegamer.config import MLLMConfig
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.official import agent
from animegamer.official.mllm import convert_agent
from animegamer.official.release_files import build_release_tokenizer

DEFAULT_REF = Path(__file__).resolve().parents[2] / "tests" / "data" / "official_ref"  # the shipped set
COLUMNS = ("B1 s_a", "B2 s_a causal", "B3 logits", "B5 logits", "fixed logits", "fixed ML logits")


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


def converted_reference(ref: Path, work: Path) -> tuple[AnimeGamerMLLM, dict, dict]:
    """The reference set's agent converted and loaded in float32, with the set's JSON and tensors."""
    meta = json.loads((ref / "mllm_ref.json").read_text())
    tokenizer = build_release_tokenizer(work / "tokenizer", meta["tiny_mistral_config"]["vocab_size"])
    (work / "llm.yaml").write_text(yaml.safe_dump(meta["tiny_llm_yaml"]))
    (work / "agent.yaml").write_text(yaml.safe_dump(meta["tiny_agent_yaml"]))
    info = convert_agent(
        ref / "mllm_agent" / "pytorch_model.bin", tokenizer, work / "out", llm_yaml=work / "llm.yaml",
        agent_yaml=work / "agent.yaml", base_config=ref / "mllm_agent" / "tiny_mistral_config.json",
    )  # fmt: skip
    cfg = MLLMConfig(pretrained=info["mistral_dir"], dtype="fp32", gradient_checkpointing=False, **info["mllm_config"])
    model = AnimeGamerMLLM.from_config(cfg)
    model.load_trained(info["mllm_dir"])
    return model.eval(), meta, load_file(str(ref / "mllm_ref.safetensors"))


def _causal(model, seq, shots: torch.Tensor | None) -> torch.Tensor:
    """Final hidden states (T, hidden) of a causal pass; history slots carry ``shots`` unless it is None."""
    input_ids = torch.tensor([seq.input_ids])
    if shots is not None:
        embeds = model.embed(input_ids, torch.tensor(seq.slot_positions[:-1]), shots)
    else:
        embeds = model.embed(input_ids)
    return model.transformer(embeds)[0][0]


def _last_logits(model, seq, shots: torch.Tensor | None) -> torch.Tensor:
    return model.token_logits(_causal(model, seq, shots)[-1])


@torch.no_grad()
def measure(ref: Path) -> list[dict[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        model, meta, tensors = converted_reference(ref, Path(tmp))
    layout, window = model.layout, meta["max_window"] - 1
    past: list[torch.Tensor] = []
    rows = []
    for entry in meta["turns"]:
        n = entry["turn"]
        ids = tensors[f"turn{n}.input_ids"][0].tolist()
        starts = [i for i, token in enumerate(ids) if token == layout.turn_open_id]
        captions = [ids[s + 1 : ids.index(layout.shot_open_ids[0], s)] for s in starts]
        shots = torch.stack(past[-window:]) if window > 0 and past else None  # (M, N, shot_dim)
        history = [agent.ReleaseHistory("", s, captions[i]) for i, s in enumerate(shots if shots is not None else [])]
        released = agent.release_sequence(model, history, "", captions[-1])
        # fixed: history turns carry their own (parsed, clamped into range) states, one </ST>
        own = [
            agent.clamp_values(meta["turns"][k - 1]["parsed_states_ML_SC_ET_ST"]) for k in range(n - len(history), n)
        ]
        fixed = agent.release_sequence(model, history, "", captions[-1], values=own) if history else released
        official_s_a, official_logits = tensors[f"turn{n}.s_a"][0], tensors[f"turn{n}.first_step_logits"][0]
        levels = layout.value_ids["motion_level"]
        fixed_logits = _last_logits(model, fixed, shots)
        causal = _causal(model, released, shots)  # (T, hidden)
        rows.append({
            "turn": n,
            "B1 s_a": rel(agent.shot_pass(model, released, shots, last_positions=False)["shot_embeds"], official_s_a),
            "B2 s_a causal": rel(model.predict_shots(causal[-model.num_slots :]), official_s_a),
            "B3 logits": rel(_last_logits(model, released, shots), official_logits),
            "B5 logits": rel(_last_logits(model, fixed, None), official_logits),
            "fixed logits": rel(fixed_logits, official_logits),
            "fixed ML logits": rel(fixed_logits[levels], official_logits[levels]),
        })  # fmt: skip
        past.append(official_s_a)
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ref", type=Path, default=DEFAULT_REF, help="the official reference set directory")
    args = parser.parse_args(argv)
    print("| turn | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for row in measure(args.ref):
        print(f"| {row['turn']} | " + " | ".join(f"{row[c]:.3g}" for c in COLUMNS) + " |")


if __name__ == "__main__":
    main()
