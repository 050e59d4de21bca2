"""Parity of the converted official agent with the official code's outputs (tests/data/official_ref, or the set named
by $ANIMEGAMER_OFFICIAL_REF): every size, the window, the turn count and the LoRA settings come from the set itself.

Per turn the official loop's history is what its window rule gives for the set's ``max_window``
(:func:`animegamer.official.agent.release_window`: the previous ``max_window - 1`` turns) with their stored ``s_a``;
captions are the reference ids between ``<TURN>`` and ``<img>`` (the set has no tokenizer).
"""

from __future__ import annotations

import json
import pickle
import re

import pytest
import torch
import yaml
from safetensors.torch import load_file

from animegamer.config import MLLMConfig
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.official import agent
from animegamer.official.mllm import convert_agent
from animegamer.official.release_io import ReleaseFileError
from tests.helpers.official_ref_data import REF_DIR, build_release_tokenizer, mllm_reference
from tests.helpers.pickle_trap import PickleTrap

TOL = 1e-4  # relative L2; the README: ~1e-6 is reachable in float32
AGENT_BIN = REF_DIR / "mllm_agent" / "pytorch_model.bin"
BASE_CONFIG = REF_DIR / "mllm_agent" / "tiny_mistral_config.json"


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm())


@pytest.fixture(autouse=True)
def no_grad():
    with torch.no_grad():
        yield


@pytest.fixture(scope="module")
def release_inputs(tmp_path_factory):
    """The release-side inputs of a conversion: tokenizer dir and the two YAMLs, written from the set's JSON."""
    meta, _ = mllm_reference()
    root = tmp_path_factory.mktemp("release")
    tokenizer = build_release_tokenizer(root / "animegamer_tokenizer", meta["tiny_mistral_config"]["vocab_size"])
    (root / "llm.yaml").write_text(yaml.safe_dump(meta["tiny_llm_yaml"]))
    (root / "agent.yaml").write_text(yaml.safe_dump(meta["tiny_agent_yaml"]))
    return {"tokenizer_dir": tokenizer, "llm_yaml": root / "llm.yaml", "agent_yaml": root / "agent.yaml"}


def convert(release_inputs, out, agent_bin=AGENT_BIN, **kwargs):
    args = {"base_config": BASE_CONFIG, **release_inputs, **kwargs}
    return convert_agent(agent_bin, args.pop("tokenizer_dir"), out, **args)


@pytest.fixture(scope="module")
def converted(release_inputs, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted")
    info = convert(release_inputs, out)
    cfg = MLLMConfig(pretrained=info["mistral_dir"], dtype="fp32", gradient_checkpointing=False, **info["mllm_config"])
    model = AnimeGamerMLLM.from_config(cfg)
    model.load_trained(info["mllm_dir"])
    return {"info": info, "model": model.eval(), "cfg": cfg, "out": out}


def reference_turns(model):
    """Per turn: (N, reference tensors of the turn, history list, caption ids of the current turn)."""
    meta, ref = mllm_reference()
    turn_open, img = model.layout.turn_open_id, model.layout.shot_open_ids[0]
    played: list[agent.ReleaseHistory] = []
    for index, entry in enumerate(meta["turns"]):
        n = entry["turn"]
        assert n == index + 1
        ids = ref[f"turn{n}.input_ids"][0].tolist()
        starts = [i for i, token in enumerate(ids) if token == turn_open]
        captions = [ids[s + 1 : ids.index(img, s)] for s in starts]
        history = [played[k] for k in agent.release_window(index, meta["max_window"]).history]
        assert len(captions) == len(history) + 1
        history = [agent.ReleaseHistory(h.instruction, h.shot_embeds, captions[i]) for i, h in enumerate(history)]
        yield n, {k.split(".", 1)[1]: v for k, v in ref.items() if k.startswith(f"turn{n}.")}, history, captions[-1]
        played.append(agent.ReleaseHistory(entry["instruction"], ref[f"turn{n}.s_a"][0]))


def test_conversion_layout(converted):
    meta, _ = mllm_reference()
    info, model = converted["info"], converted["model"]
    assert info["lora"]["r"] == meta["tiny_llm_yaml"]["peft_config"]["r"]
    assert info["lora"]["lora_alpha"] == meta["tiny_llm_yaml"]["peft_config"]["lora_alpha"]
    assert info["base_vocab"] + info["num_new_tokens"] == meta["tokenizer_len"] == len(model.tokenizer)
    assert model.slot_attention == "bidirectional" and model.resampler_gelu == "erf"
    assert sorted(p.name for p in (converted["out"] / "mllm").iterdir()) == sorted(
        ["adapter_config.json", "adapter_model.safetensors", "mllm_layout.json", "mllm_trained.safetensors"]
    )
    # the modules_to_save copy of each norm is the one converted (B14), not original_module
    state = torch.load(AGENT_BIN, weights_only=True)
    weights = load_file(str(converted["out"] / "Mistral" / "model.safetensors"))
    prefix = "llm.base_model.model."
    used = state[f"{prefix}model.norm.modules_to_save.default.weight"]
    assert torch.equal(weights["model.norm.weight"], used)
    assert not torch.equal(weights["model.norm.weight"], state[f"{prefix}model.norm.original_module.weight"])


def test_layout_ids_equal_reference(converted):
    model = converted["model"]
    meta, _ = mllm_reference()
    for n, ref, history, caption in reference_turns(model):
        seq = agent.release_sequence(model, history, "", caption)
        assert seq.input_ids == ref["input_ids"][0].tolist(), f"turn {n}"
        assert seq.slot_positions[-1] == ref["ids_gen_mask"][0].nonzero().squeeze(-1).tolist()
        # every history turn's slots, in order, are the official ids_cmp_mask (226 per history turn)
        history_slots = [p for slots in seq.slot_positions[:-1] for p in slots]
        assert history_slots == ref["ids_cmp_mask"][0].nonzero().squeeze(-1).tolist(), f"turn {n}"
        assert agent.release_window(n - 1, meta["max_window"]).gen_turn_id == int(ref["gen_turn_id"])
        assert seq.input_ids.count(model.layout.close_ids["stamina"]) == 2 * len(history)  # B5: </ST> twice


def test_logits_hidden_and_shot_match(converted):
    model = converted["model"]
    for n, ref, history, caption in reference_turns(model):
        seq = agent.release_sequence(model, history, "", caption)
        shots = torch.stack([h.shot_embeds for h in history]) if history else None
        shot = agent.shot_pass(model, seq, shots, last_positions=True)
        assert rel(shot["hidden"], ref["bi_last_hidden_last226"][0]) < TOL, f"turn {n}"
        assert rel(shot["shot_embeds"], ref["s_a"][0]) < TOL, f"turn {n}"
        hidden, _ = model.transformer(model.embed(torch.tensor([seq.input_ids])))
        logits = model.token_logits(hidden[0, -1])
        assert rel(logits, ref["first_step_logits"][0]) < TOL, f"turn {n}"
        # B4: the processed first-step scores are the raw ones with the first 100 frame ids and </frame> at 0.0
        processed = agent.release_process_scores(logits.clone(), seq.input_ids[-1], agent.release_chain(model))
        changed = (processed != logits).nonzero().squeeze(-1).tolist()
        zeroed = [*model.layout.slot_ids[: agent.RELEASE_VIDEO_GEN_TOKENS], model.layout.shot_close_ids[0]]
        assert set(changed) <= set(zeroed) and bool((processed[zeroed] == 0).all())


def test_greedy_ids_teacher_forced(converted):
    model = converted["model"]
    chain = agent.release_chain(model)
    for n, ref, history, caption in reference_turns(model):
        prompt = agent.release_sequence(model, history, "", caption).input_ids
        generated = ref["generated_ids"].tolist()
        ids = torch.tensor([prompt + generated[:-1]])
        hidden, _ = model.transformer(model.embed(ids))  # B3: plain token embeddings, causal
        logits = model.token_logits(hidden[0, len(prompt) - 1 :])  # (steps, V)
        previous = [prompt[-1], *generated[:-1]]
        picked = [
            int(agent.release_process_scores(row, last, chain).argmax())
            for row, last in zip(logits, previous, strict=True)
        ]
        assert picked == generated, f"turn {n}"


def test_chain_to_decoder(converted):
    """bf16 of the turn's s_a that the decoder reference names as its source (``s_a_source``, e.g.
    ``bf16(mllm_ref.safetensors[turn5.s_a])``) is the decoder reference's conditioning."""
    decoder_s_a = load_file(str(REF_DIR / "decoder_ref.safetensors"))["s_a"][0]
    source = json.loads((REF_DIR / "decoder_ref.json").read_text())["s_a_source"]
    match = re.fullmatch(r"bf16\(mllm_ref\.safetensors\[turn(\d+)\.s_a\]\)", source)
    assert match, f"decoder_ref.json s_a_source {source!r} is not a turn's s_a of mllm_ref"
    source_turn = int(match.group(1))
    n, ref, history, caption = next(t for t in reference_turns(converted["model"]) if t[0] == source_turn)
    seq = agent.release_sequence(converted["model"], history, "", caption)
    shots = torch.stack([h.shot_embeds for h in history]) if history else None
    ours = agent.shot_pass(converted["model"], seq, shots, last_positions=True)["shot_embeds"]
    assert rel(ours.bfloat16().float(), decoder_s_a) < 1e-3
    assert float((ours.bfloat16().float() == decoder_s_a).float().mean()) > 0.99


def test_slot_attention_is_recorded_and_adopted(converted, tmp_path):
    """The converted layout says its slots attend as one block; a re-saved checkpoint keeps it, a model of our own
    loading it adopts it, and an unknown value is refused."""
    model = converted["model"]
    converted_layout = json.loads((converted["out"] / "mllm" / "mllm_layout.json").read_text())
    assert converted_layout["slot_attention"] == "bidirectional"
    model.save_trained(tmp_path / "again")
    layout = json.loads((tmp_path / "again" / "mllm_layout.json").read_text())
    assert layout["slot_attention"] == "bidirectional" and "official" not in layout
    fresh = AnimeGamerMLLM.from_config(converted["cfg"])
    assert fresh.slot_attention == "causal"
    fresh.load_trained(tmp_path / "again")
    assert fresh.slot_attention == "bidirectional"
    (tmp_path / "again" / "mllm_layout.json").write_text(json.dumps({**layout, "slot_attention": "sideways"}))
    with pytest.raises(ValueError, match="slot_attention 'sideways'"):
        fresh.load_trained(tmp_path / "again")
    # a checkpoint converted before the layout named its slot attention said "official": true
    legacy = {k: v for k, v in layout.items() if k != "slot_attention"}
    (tmp_path / "again" / "mllm_layout.json").write_text(json.dumps({**legacy, "official": True}))
    older = AnimeGamerMLLM.from_config(converted["cfg"])
    older.load_trained(tmp_path / "again")
    assert older.slot_attention == "bidirectional"
    (tmp_path / "again" / "mllm_layout.json").write_text(json.dumps(legacy))
    older.load_trained(tmp_path / "again")
    assert older.slot_attention == "causal"


def test_release_history_state_tokens(converted):
    """B5: a history turn's states are <Strength_0> everywhere and </ST> comes twice (ids of the release tokenizer)."""
    layout = converted["model"].layout
    assert agent.release_history_state_tokens(layout) == [
        32274, 32267, 32275, 32276, 32267, 32277, 32278, 32267, 32279, 32280, 32267, 32281, 32281
    ]
    seq = agent.release_sequence(converted["model"], [agent.ReleaseHistory("a", torch.zeros(1), [5, 6])], "b", [7])
    assert seq.input_ids[:5] == [1, 32282, 5, 6, 32256] and seq.input_ids[-1] == 32274
    assert seq.input_ids.count(32281) == 2 and seq.current_turn == 1 and len(seq.slot_positions) == 2


@pytest.mark.parametrize("max_window", [1, 2, 3, 5])
def test_release_window_rule(max_window):
    """B6 for any max_window: the official loop's history is the previous max_window - 1 turns; its s_a window
    holds them, the current (zero) slot and, before turn max_window, the zero slots of turns not played yet."""
    for index in range(12):
        window = agent.release_window(index, max_window)
        expected = list(range(index))[-(max_window - 1) :] if max_window > 1 else []
        assert window.history == expected
        assert window.gen_turn_id == len(window.history) == min(index, max_window - 1)
        start, end = window.slots
        if index == 0:
            assert (start, end) == (0, 1)
        else:
            assert end - start == max_window and list(range(start, start + len(window.history))) == window.history
    with pytest.raises(ValueError, match="max_window"):
        agent.release_window(0, 0)


@pytest.mark.parametrize("max_window", [1, 2, 3])
def test_the_game_plays_the_release_window(converted, max_window):
    """The released turn inside the core's play_turn with history_turns = max_window - 1 sees exactly the turns the
    release's loop puts in its prompt, oldest first (the reference set's own window is one of these)."""
    from animegamer.game.predictor import MLLMPredictor
    from animegamer.game.turn import AnimeGamer

    seen = []

    def released_spy(model, history, instruction):
        seen.append([h.instruction for h in history])
        return agent.predict_released(model, history, instruction)

    game = AnimeGamer(MLLMPredictor(converted["model"], predict=released_spy), None, history_turns=max_window - 1)
    texts = [f"Character: Qiqi; Motion: {m}; Background: {b}." for m, b in
             [("fly", "day sky"), ("run", "park"), ("fly", "park"), ("run", "day sky")]]
    turns = []
    for text in texts:
        turns.append(game.play_turn(turns, text))
    assert seen == [[texts[k] for k in agent.release_window(i, max_window).history] for i in range(len(texts))]
    model = converted["model"]
    assert all(t.release_values is not None for t in turns)
    assert all(t.shot_embeds.shape == (model.num_slots, model.shot_dim) for t in turns)


def test_release_parse():
    assert agent.release_parse(
        "<Strength_3> </ML> <SC> <Strength_0> </SC> <ET> <Strength_1> </ET> <ST> <Strength_-1> </ST>"
    ) == [3, 0, 1, -1]
    assert agent.release_parse("random words") == [0, 0, 0, 0]
    assert agent.clamp_values([0, 0, 0, 0]).motion_level == 1
    # what the release's decoder table makes of a parsed level: 1..4 kept, anything else its last row
    assert [agent.release_render_level([ml, 0, 0, 0], 5) for ml in (0, 1, 4, 5, 9, -2)] == [5, 1, 4, 5, 5, 5]
    with pytest.raises(ValueError, match="4 integers"):
        agent.release_render_level([1, 0, 0], 5)
    with pytest.raises(ValueError, match="4 integers"):
        agent.release_render_level(["1", 0, 0, 0], 5)


# ---------------------------------------------------------------------- refused inputs: one line, nothing written


def _refused(release_inputs, tmp_path, agent_bin, match, **kwargs):
    out = tmp_path / "out"
    with pytest.raises(ReleaseFileError, match=match) as info:
        convert(release_inputs, out, agent_bin=agent_bin, **kwargs)
    assert "\n" not in str(info.value)
    assert not (out / "Mistral").exists() and not (out / "mllm").exists()
    assert not out.exists() or not any(out.iterdir())


def test_hostile_and_malformed_files_refused(release_inputs, tmp_path):
    hostile, marker = tmp_path / "hostile.bin", tmp_path / "code_ran"
    with open(hostile, "wb") as fh:
        pickle.dump({"llm.base_model.model.lm_head.weight": PickleTrap(marker)}, fh)
    _refused(release_inputs, tmp_path, hostile, "refused|not a readable")
    torch.save({"w": PickleTrap(marker)}, tmp_path / "hostile_zip.bin")
    _refused(release_inputs, tmp_path, tmp_path / "hostile_zip.bin", "refused")
    assert not marker.exists()
    garbage = tmp_path / "garbage.bin"
    garbage.write_bytes(b"PK\x03\x04 not really a zip" * 10)
    _refused(release_inputs, tmp_path, garbage, "not a readable")
    torch.save([torch.zeros(2)], tmp_path / "list.bin")
    _refused(release_inputs, tmp_path, tmp_path / "list.bin", "expected the agent state dict")


def test_wrong_shape_missing_key_and_rank_refused(release_inputs, tmp_path):
    state = torch.load(AGENT_BIN, weights_only=True)
    key = next(k for k in state if k.endswith("self_attn.k_proj.base_layer.weight"))
    bad = dict(state)
    bad[key] = torch.zeros(bad[key].shape[0] + 1, bad[key].shape[1], dtype=bad[key].dtype)
    torch.save(bad, tmp_path / "shape.bin")
    _refused(release_inputs, tmp_path, tmp_path / "shape.bin", "k_proj.weight has shape")
    missing = {k: v for k, v in state.items() if k != key}
    torch.save(missing, tmp_path / "missing.bin")
    _refused(release_inputs, tmp_path, tmp_path / "missing.bin", "neither in the agent file")
    lora = next(k for k in state if k.endswith("lora_B.default.weight"))
    torch.save({k: v for k, v in state.items() if k != lora}, tmp_path / "nolora.bin")
    _refused(release_inputs, tmp_path, tmp_path / "nolora.bin", "lora_B.default.weight is missing")
    # without the LLM YAML the released r=32 is assumed: the tiny set's rank is then refused, not misread
    _refused(release_inputs, tmp_path, AGENT_BIN, "LoRA rank", llm_yaml=None)


def test_base_weights_taken_from_base_dir(release_inputs, converted, tmp_path):
    """Base weights the agent file lacks come from the base model directory (here: the converted one)."""
    state = torch.load(AGENT_BIN, weights_only=True)
    dropped = {k: v for k, v in state.items() if not k.endswith("base_layer.weight")}
    torch.save(dropped, tmp_path / "lean.bin")
    out = tmp_path / "out"
    info = convert(
        release_inputs, out, agent_bin=tmp_path / "lean.bin", base_dir=converted["info"]["mistral_dir"],
        shard_bytes=2**20,
    )  # fmt: skip
    index = json.loads((out / "Mistral" / "model.safetensors.index.json").read_text())
    assert info["shards"] == len(set(index["weight_map"].values())) > 1
    fresh = {}
    for shard in sorted(set(index["weight_map"].values())):
        fresh.update(load_file(str(out / "Mistral" / shard)))
    before = load_file(str(converted["out"] / "Mistral" / "model.safetensors"))
    assert fresh.keys() == before.keys() and all(torch.equal(fresh[k], before[k]) for k in fresh)
    # the sharded directory loads through transformers like the single-file one
    cfg = MLLMConfig(pretrained=info["mistral_dir"], dtype="fp32", gradient_checkpointing=False, **info["mllm_config"])
    model = AnimeGamerMLLM.from_config(cfg)
    model.load_trained(info["mllm_dir"])
    ids = torch.tensor([[1, 5, 9, 32282, 32256]])
    assert torch.equal(model.eval().token_logits(model.transformer(model.embed(ids))[0]),
                       converted["model"].token_logits(converted["model"].transformer(converted["model"].embed(ids))[0]))


def test_fast_path_on_converted_weights(converted):
    """Merged LoRA + offload (session loader) + constrained state decoding give the unmerged model's turn."""
    from animegamer.config import InferenceConfig
    from animegamer.game.build import load_mllm_predictor
    from animegamer.models.mllm_turn import HistoryTurn, predict_turn

    instruction = "Character: Qiqi; Motion: fly; Background: day sky."
    first = predict_turn(converted["model"], [], instruction)
    history = [HistoryTurn(instruction, first.shot_embeds, first.values)]
    plain = predict_turn(converted["model"], history, instruction)
    cfg = InferenceConfig(
        mllm=converted["cfg"], mllm_checkpoint=converted["info"]["mllm_dir"], merge_lora=True, history_turns=1
    )
    fast = load_mllm_predictor(cfg, "cpu", offload=True)
    assert fast.model.slot_attention == "bidirectional"
    turn = fast.predict_turn(history, instruction)
    assert turn.values == plain.values and rel(turn.shot_embeds, plain.shot_embeds) < 1e-5
    assert all(abs(sum(p.values()) - 1) < 1e-5 for p in turn.value_probs.values())
    # slot_attention bidirectional: the shot comes from the slot-block pass, not from the causal prefill
    from animegamer.models.mllm_turn import prefill_turn, slot_block_shots

    with torch.no_grad():
        prefilled = prefill_turn(converted["model"], [], instruction)
        block = slot_block_shots(converted["model"], prefilled.sequence, [])
    assert torch.equal(first.shot_embeds, block.float().cpu()) and rel(prefilled.shot_embeds, block) > 1e-2
    # fixed mode reads the frame slots (B1 fixed), so its shot differs from the released reading of the same prompt
    seq = agent.release_sequence(converted["model"], [], "", None)
    assert seq.slot_positions[-1][-1] < len(seq) - 1
