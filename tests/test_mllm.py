import json
from dataclasses import replace

import pytest
import torch

from animegamer.config import MLLMConfig
from animegamer.config.recorded import MLLM_SHAPE, adopt, mllm_record
from animegamer.data.manifest import read_manifest
from animegamer.data.sequences import build_windows
from animegamer.data.stage_b import StageBCollator, StageBDataset
from animegamer.data.tensor_store import TensorStore
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.mllm_turn import HistoryTurn, predict_turn
from animegamer.models.resampler import ShotResampler
from animegamer.states import StateValues
from animegamer.tokens import IGNORE_INDEX, STATE_FIELDS, TurnSpec
from animegamer.training.losses import stage_b_loss
from tests.helpers.stage_b_data import write_stage_b_data
from tests.helpers.tiny_mllm import history_turns

SLOTS, SHOT_DIM = 8, 16
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def mllm_cfg(tiny_mistral_dir) -> MLLMConfig:
    return MLLMConfig(
        pretrained=str(tiny_mistral_dir),
        num_slots=SLOTS,
        shot_dim=SHOT_DIM,
        lora_rank=4,
        lora_alpha=8,
        lora_dropout=0.0,
        gradient_checkpointing=False,
        dtype="fp32",
    )


def make_model(cfg: MLLMConfig, seed: int = 0, **kwargs) -> AnimeGamerMLLM:
    torch.manual_seed(seed)
    return AnimeGamerMLLM.from_config(cfg, **kwargs)


def scramble(model: AnimeGamerMLLM, seed: int) -> None:
    """Random values in every trained tensor (LoRA B starts at zero, which would hide adapter bugs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


@pytest.fixture
def stage_b_items(tmp_path, mllm_cfg):
    """A model-independent dataset of 2 films x 4 clips, history 2, and its collator."""
    manifest_path, store_path = write_stage_b_data(tmp_path, films=2, clips_per_film=4, num_slots=SLOTS,
                                                   shot_dim=SHOT_DIM)
    manifest = read_manifest(manifest_path)
    windows = build_windows(manifest, history_turns=2, split="all")

    def dataset_for(model):
        return StageBDataset(windows, manifest, TensorStore(store_path), model.layout, 512, SHOT_DIM)

    return dataset_for


def test_resampler_shapes():
    up, down = ShotResampler(16, 64, 2), ShotResampler(64, 16, 1)
    x = torch.randn(3, SLOTS, 16)
    assert up(x).shape == (3, SLOTS, 64) and down(up(x)).shape == (3, SLOTS, 16)
    assert len(up.mlp) == 3 and len(down.mlp) == 1  # Linear-GELU-Linear | Linear
    assert up(torch.zeros(0, SLOTS, 16)).shape == (0, SLOTS, 64)
    with pytest.raises(ValueError, match="width 16"):
        up(torch.randn(2, 5))
    with pytest.raises(ValueError, match="at least one"):
        ShotResampler(4, 4, 0)


def test_resampler_gelu_erf_is_the_release_projection():
    """``gelu="erf"`` computes Linear-GELU(exact)-Linear, the release's ProjectionLayer; tanh is our default."""
    torch.manual_seed(0)
    erf, tanh = ShotResampler(8, 16, 2, gelu="erf"), ShotResampler(8, 16, 2)
    tanh.load_state_dict(erf.state_dict())
    x = torch.randn(2, SLOTS, 8) * 3
    first, second = erf.mlp[0], erf.mlp[2]
    expected = second(torch.nn.functional.gelu(first(x), approximate="none"))
    assert torch.equal(erf(x), expected) and not torch.allclose(tanh(x), expected, atol=1e-6, rtol=0)
    with pytest.raises(ValueError, match="gelu"):
        ShotResampler(4, 4, 2, gelu="relu")


def test_trained_parts_only(mllm_cfg):
    model = make_model(mllm_cfg)
    names = model.trained_names()
    assert all(("lora_" in n) or n.split(".")[0] in {"new_token_embed", "new_token_head", "input_resampler",
                                                    "output_resampler"} for n in names)
    assert any("lora_A" in n for n in names) and "new_token_embed.weight" in names
    # the base vocabulary's rows stay frozen: only the added tokens' rows train (tie-break of the design)
    assert not model.llm.get_input_embeddings().weight.requires_grad
    assert not model.llm.get_output_embeddings().weight.requires_grad
    assert model.new_token_embed.num_embeddings == len(model.tokenizer) - model.base_vocab
    assert model.base_vocab == 512 and len(model.tokenizer) == 512 + len(model.layout.vocab.special_tokens(SLOTS))


def test_slots_carry_history_shots_and_queries(mllm_cfg, stage_b_items):
    model = make_model(mllm_cfg)
    scramble(model, 1)
    dataset = stage_b_items(model)
    items = [dataset[3], dataset[1]]  # 3 turns (2 history) and 2 turns (1 history)
    batch = StageBCollator(pad_id=0, max_seq_len=512)(items)
    rows, length = batch["input_ids"].shape
    layout = model.layout
    with torch.no_grad():
        embeds = model.embed(batch["input_ids"], batch["history_positions"], batch["history_shots"])
    flat_ids = batch["input_ids"].reshape(-1)
    flat = embeds.reshape(rows * length, -1)
    # the collator's flat positions are exactly the slots tokens.py laid out, shifted to their row
    assert batch["history_positions"].shape == (3, SLOTS) and batch["query_positions"].shape == (2, SLOTS)
    for positions in [*batch["history_positions"], *batch["query_positions"]]:
        assert flat_ids[positions].tolist() == layout.slot_ids
    assert (batch["query_positions"][1] // length == 1).all()
    # history slots carry input_resampler(s_a); current slots keep the learnable slot-token rows (queries)
    with torch.no_grad():
        expected_history = model.input_resampler(batch["history_shots"])
        queries = model.new_token_embed(torch.tensor(layout.slot_ids) - model.base_vocab)
    torch.testing.assert_close(flat[batch["history_positions"]], expected_history)
    torch.testing.assert_close(flat[batch["query_positions"][0]], queries)
    text = (flat_ids < model.base_vocab).nonzero().squeeze(-1)
    torch.testing.assert_close(flat[text], model.llm.get_input_embeddings()(flat_ids[text]))
    # labels: exactly the 4 value tokens of each current turn
    labelled = (batch["labels"] != IGNORE_INDEX).sum(-1)
    assert labelled.tolist() == [4, 4]


def test_value_logits_are_token_logits_at_value_ids(mllm_cfg):
    model = make_model(mllm_cfg)
    scramble(model, 2)
    hidden = torch.randn(3, model.hidden_size)
    with torch.no_grad():
        full = model.token_logits(hidden)
        assert full.shape == (3, len(model.tokenizer))
        for name in STATE_FIELDS:
            torch.testing.assert_close(model.value_logits(hidden, name), full[:, model.layout.value_ids[name]])


def test_loss_parts_and_overfit_until_states_exact(mllm_cfg, stage_b_items):
    model = make_model(mllm_cfg)
    dataset = stage_b_items(model)
    items = [dataset[i] for i in (0, 3, 5)]  # 1, 3 and 2 turns
    batch = StageBCollator(pad_id=0, max_seq_len=512)(items)
    optimizer = torch.optim.AdamW(model.trainable_parameters(), lr=1e-2)
    history = []
    for _ in range(150):
        out = stage_b_loss(model(batch), batch["target_shots"], mse_weight=0.5, cosine_weight=0.5)
        assert all(torch.isfinite(out[k]) for k in ("loss", "ce", "mse", "cos"))
        history.append({k: out[k].item() for k in ("loss", "ce", "mse", "cos", "state_acc")})
        if out["state_acc"].item() == 1.0 and out["ce"].item() < 0.05:
            break
        optimizer.zero_grad()
        out["loss"].backward()
        optimizer.step()
    first, last = history[0], history[-1]
    assert last["state_acc"] == 1.0, history[-1]
    assert last["loss"] < 0.5 * first["loss"] and last["ce"] < first["ce"] and last["mse"] < first["mse"]
    assert first["loss"] == pytest.approx(first["ce"] + 0.5 * first["mse"] + 0.5 * first["cos"], rel=1e-5)
    # constrained, cached decoding predicts the trained values too
    for index in (0, 3, 5):
        window = dataset.windows[index]
        turns = [dataset.records[c].shot_tags() for c in window.clip_ids]
        shots = [dataset._shot(c) for c in window.clip_ids]
        pairs = zip(turns[:-1], shots[:-1], strict=True)
        past = [HistoryTurn(t.instruction().render(), s, t.values) for t, s in pairs]
        assert predict_turn(model, past, turns[-1].instruction().render()).values == turns[-1].values


def test_packed_rows_give_the_same_loss_as_padded_rows(mllm_cfg, stage_b_items):
    model = make_model(mllm_cfg)
    scramble(model, 3)
    dataset = stage_b_items(model)
    items = [dataset[i] for i in (3, 0, 5, 1)]
    padded = StageBCollator(pad_id=0, max_seq_len=512)(items)
    packed = StageBCollator(pad_id=0, max_seq_len=512, pack=True)(items)
    assert packed["input_ids"].shape[0] < padded["input_ids"].shape[0] and "attention_mask" not in packed
    with torch.no_grad():
        a = stage_b_loss(model(padded), padded["target_shots"], 0.5, 0.5)
        b = stage_b_loss(model(packed), packed["target_shots"], 0.5, 0.5)
    for k in ("loss", "ce", "mse", "cos"):
        torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


# window: Mistral's sliding-window attention shorter than the prompt; the cached path keeps a plain KV cache (no
# host copy per layer) and must still attend as the windowed full forward does
@pytest.mark.parametrize("window", [None, 24])
def test_cached_decoding_equals_full_forward(mllm_cfg, window):
    model = make_model(mllm_cfg)
    scramble(model, 4)
    model.llm.config.sliding_window = window
    g = torch.Generator().manual_seed(0)
    history = [
        HistoryTurn("Character: Qiqi; Motion: quickly run; Background: park.",
                    torch.randn(SLOTS, SHOT_DIM, generator=g), StateValues(4, 0, 1, -1)),
        HistoryTurn("Qiqi eats in the kitchen", torch.randn(SLOTS, SHOT_DIM, generator=g), StateValues(1, 1, 0, 1)),
    ]
    instruction = "Character: Qiqi; Motion: gently lie down; Background: night bedroom."
    pred = predict_turn(model, history, instruction)
    assert pred.shot_embeds.shape == (SLOTS, SHOT_DIM) and pred.shot_embeds.dtype == torch.float32
    assert sorted(pred.value_probs) == sorted(STATE_FIELDS)
    # the same sequence completed with the predicted values, in one forward pass without a cache
    layout = model.layout
    seq = layout.build_sequence(
        [TurnSpec(h.instruction, h.values) for h in history] + [TurnSpec(instruction, pred.values, is_current=True)]
    )
    assert pred.prompt_tokens == seq.value_positions[-1]["motion_level"]  # the prompt ends at the first open tag
    with torch.no_grad():
        embeds = model.embed(torch.tensor([seq.input_ids]), torch.tensor(seq.slot_positions[:-1]),
                             torch.stack([h.shot_embeds for h in history]))
        hidden, _ = model.transformer(embeds)
    torch.testing.assert_close(model.predict_shots(hidden[0, seq.slot_positions[-1]]), pred.shot_embeds,
                               rtol=1e-5, atol=1e-5)
    tied = True
    for name in STATE_FIELDS:
        probs = model.value_logits(hidden[0, seq.value_positions[-1][name] - 1], name).softmax(-1)
        torch.testing.assert_close(probs, torch.tensor(list(pred.value_probs[name].values())), rtol=1e-5, atol=1e-6)
        best = layout.id_to_value[name][layout.value_ids[name][int(probs.argmax())]]
        assert best == getattr(pred.values, name)
        tied &= bool(torch.allclose(probs, probs.mean().expand_as(probs)))
    assert not tied  # the comparison is not between uniform distributions
    if window is not None:  # the window shapes these outputs: without it they differ
        model.llm.config.sliding_window = None
        with torch.no_grad():
            unwindowed, _ = model.transformer(embeds)
        assert len(seq.input_ids) > 2 * window and not torch.allclose(unwindowed, hidden, atol=1e-3)


def test_save_and_reload_identical(tmp_path, mllm_cfg, stage_b_items):
    model = make_model(mllm_cfg, seed=0)
    scramble(model, 5)
    out = model.save_trained(tmp_path / "ckpt", history_turns=2)
    for name in ("adapter_config.json", "adapter_model.safetensors", "mllm_trained.safetensors", "mllm_layout.json"):
        assert (out / name).is_file(), name
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and adapter["lora_alpha"] == 8 and adapter["peft_type"] == "LORA"
    # what the files record is the model's whole shape and K: a config that names the checkpoint needs neither
    record = mllm_record(out)
    assert record.history_turns == 2 and set(record.shape) == set(MLLM_SHAPE)
    adopted = adopt(MLLMConfig(pretrained=mllm_cfg.pretrained, dtype="fp32"), record, "mllm")
    assert adopted == replace(mllm_cfg, gradient_checkpointing=True)  # the LoRA targets: the same set
    other = make_model(mllm_cfg, seed=1)
    batch = StageBCollator(pad_id=0, max_seq_len=512)([stage_b_items(model)[i] for i in (2, 3)])
    with torch.no_grad():
        before = stage_b_loss(model(batch), batch["target_shots"], 0.5, 0.0)
        assert not torch.equal(stage_b_loss(other(batch), batch["target_shots"], 0.5, 0.0)["loss"], before["loss"])
        other.load_trained(out)
        after = stage_b_loss(other(batch), batch["target_shots"], 0.5, 0.0)
    for k in ("loss", "ce", "mse", "cos"):
        assert torch.equal(before[k], after[k]), k
    for (n, p), (m, q) in zip(model.state_dict().items(), other.state_dict().items(), strict=True):
        assert n == m and torch.equal(p, q), n
    history = [HistoryTurn("a run", torch.ones(SLOTS, SHOT_DIM), StateValues(2, 0, 0, 0))]
    a, b = predict_turn(model, history, "Qiqi sleeps"), predict_turn(other, history, "Qiqi sleeps")
    assert torch.equal(a.shot_embeds, b.shot_embeds) and a.values == b.values

    with pytest.raises(ValueError, match="num_slots"):
        make_model(replace(mllm_cfg, num_slots=SLOTS + 1)).load_trained(out)
    with pytest.raises(ValueError, match="LoRA settings"):
        make_model(replace(mllm_cfg, lora_rank=2)).load_trained(out)
    with pytest.raises(FileNotFoundError):
        other.load_trained(tmp_path / "nothing")
    with pytest.raises(ValueError, match="resampler_gelu"):
        make_model(replace(mllm_cfg, resampler_gelu="erf")).load_trained(out)
    # a checkpoint written before the layout recorded its GELU is a tanh one
    layout = json.loads((out / "mllm_layout.json").read_text())
    del layout["resampler_gelu"]
    (out / "mllm_layout.json").write_text(json.dumps(layout))
    make_model(mllm_cfg, seed=1).load_trained(out)


def test_bf16_and_gradient_checkpointing(mllm_cfg, stage_b_items):
    plain = make_model(mllm_cfg, seed=0)
    checkpointed = make_model(replace(mllm_cfg, gradient_checkpointing=True), seed=0)
    batch = StageBCollator(pad_id=0, max_seq_len=512)([stage_b_items(plain)[i] for i in (1, 3)])
    for model in (plain, checkpointed):
        model.train()
        stage_b_loss(model(batch), batch["target_shots"], 0.5, 0.0)["loss"].backward()
    for (n, p), (_, q) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        if p.requires_grad:
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=n)
    half = make_model(replace(mllm_cfg, dtype="bf16"), seed=0)
    assert half.llm.get_input_embeddings().weight.dtype == torch.bfloat16
    assert half.input_resampler.mlp[0].weight.dtype == torch.float32  # trained parts stay fp32
    out = stage_b_loss(half(batch), batch["target_shots"], 0.5, 0.0)
    assert torch.isfinite(out["loss"]) and out["loss"].dtype == torch.float32
    out["loss"].backward()
    assert half.input_resampler.mlp[0].weight.grad is not None


# ---- mllm.shot_residual "previous": the output resampler gives the shot's change from the last history shot
def residual_pair(cfg, seed: int = 3):
    """The same trained tensors in a paper model and a shot_residual "previous" one."""
    plain = make_model(cfg)
    scramble(plain, seed)
    residual = make_model(replace(cfg, shot_residual="previous"))
    residual.load_state_dict(plain.state_dict())
    assert plain.shot_residual == "none" and residual.shot_residual == "previous"
    return plain, residual


def test_the_collator_points_each_turn_at_its_last_history_shot(mllm_cfg, stage_b_items):
    model = make_model(mllm_cfg)
    dataset = stage_b_items(model)
    items = [dataset[i] for i in (3, 0, 1, 5)]  # 2, 0, 1 and 1 history turns
    assert [len(i["history_shots"]) for i in items] == [2, 0, 1, 1]
    for pack in (False, True):
        batch = StageBCollator(pad_id=0, max_seq_len=512, pack=pack)(items)
        assert batch["previous_index"].tolist() == [1, -1, 2, 3]
        torch.testing.assert_close(batch["history_shots"][1], items[0]["history_shots"][-1])
        torch.testing.assert_close(batch["history_shots"][3], items[3]["history_shots"][-1])


def test_training_adds_the_previous_shot_and_the_loss_falls(mllm_cfg, stage_b_items):
    plain, residual = residual_pair(mllm_cfg)
    dataset = stage_b_items(plain)
    batch = StageBCollator(pad_id=0, max_seq_len=512)([dataset[i] for i in (3, 0, 1)])
    with torch.no_grad():
        a, b = plain(batch), residual(batch)
    history = batch["history_shots"]
    torch.testing.assert_close(b["shots"][0], a["shots"][0] + history[1])  # two history turns: the later one
    torch.testing.assert_close(b["shots"][1], a["shots"][1])  # no history: the shot itself
    torch.testing.assert_close(b["shots"][2], a["shots"][2] + history[2])
    assert torch.equal(a["value_logits"], b["value_logits"])  # the states do not change
    # a batch without any history turn: the shots themselves
    lone = StageBCollator(pad_id=0, max_seq_len=512)([dataset[0], dataset[4]])
    assert lone["history_shots"].shape[0] == 0 and lone["previous_index"].tolist() == [-1, -1]
    with torch.no_grad():
        assert torch.equal(plain(lone)["shots"], residual(lone)["shots"])

    # gradients reach the output resampler through the change, and a few steps bring the loss down
    optimizer = torch.optim.AdamW(residual.trainable_parameters(), lr=1e-2)
    losses = []
    for _ in range(30):
        out = stage_b_loss(residual(batch), batch["target_shots"], mse_weight=0.5, cosine_weight=0.5)
        optimizer.zero_grad()
        out["loss"].backward()
        grad = residual.output_resampler.mlp[0].weight.grad
        assert grad is not None and grad.abs().sum() > 0
        optimizer.step()
        losses.append(out["loss"].item())
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.parametrize("kv_cache", ["static", "dynamic"])
def test_a_turn_adds_the_last_history_shot(mllm_cfg, kv_cache):
    plain, residual = residual_pair(replace(mllm_cfg, kv_cache=kv_cache))
    history = history_turns(2, seed=4)
    a, b = predict_turn(plain, history, "Qiqi sleeps"), predict_turn(residual, history, "Qiqi sleeps")
    torch.testing.assert_close(b.shot_embeds, a.shot_embeds + history[-1].shot_embeds)
    assert a.values == b.values
    first_a, first_b = predict_turn(plain, [], "Qiqi sleeps"), predict_turn(residual, [], "Qiqi sleeps")
    assert torch.equal(first_a.shot_embeds, first_b.shot_embeds)
    # the bidirectional slot block (a release-shaped model) reads the shot from its second pass, with the residual
    plain.slot_attention = residual.slot_attention = "bidirectional"
    a, b = predict_turn(plain, history, "Qiqi sleeps"), predict_turn(residual, history, "Qiqi sleeps")
    torch.testing.assert_close(b.shot_embeds, a.shot_embeds + history[-1].shot_embeds)


def test_a_checkpoint_records_the_residual_and_a_model_adopts_it(tmp_path, mllm_cfg):
    _, residual = residual_pair(mllm_cfg)
    out = residual.save_trained(tmp_path / "ckpt", history_turns=2)
    assert json.loads((out / "mllm_layout.json").read_text())["shot_residual"] == "previous"
    loaded = make_model(mllm_cfg, seed=1)  # configured "none": the checkpoint says how it predicts
    loaded.load_trained(out)
    assert loaded.shot_residual == "previous"
    history = history_turns(1, seed=2)
    assert torch.equal(predict_turn(loaded, history, "Qiqi runs").shot_embeds,
                       predict_turn(residual, history, "Qiqi runs").shot_embeds)
    # a paper checkpoint records nothing and loads as one, whatever the model was
    paper = make_model(mllm_cfg).save_trained(tmp_path / "paper")
    assert "shot_residual" not in json.loads((paper / "mllm_layout.json").read_text())
    loaded.load_trained(paper)
    assert loaded.shot_residual == "none"
    layout = json.loads((out / "mllm_layout.json").read_text())
    (out / "mllm_layout.json").write_text(json.dumps({**layout, "shot_residual": "sideways"}))
    with pytest.raises(ValueError, match="shot_residual 'sideways'"):
        loaded.load_trained(out)
