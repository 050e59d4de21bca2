from dataclasses import replace
from importlib import import_module
from pathlib import Path

import pytest
import torch

from animegamer.config import load_config
from animegamer.game.predictor import InstructionError, MLLMPredictor
from animegamer.game.results import load_results
from animegamer.game.turn import AnimeGamer
from animegamer.models.mllm import AnimeGamerMLLM
from animegamer.models.mllm_turn import HistoryTurn, predict_turn
from animegamer.states import CharacterState, StateValues, read_game_file
from animegamer.tokens import TurnSpec

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "configs" / "tiny" / "inference.yaml"
DEMO = ROOT / "game_demo" / "demo.txt"
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def load_entry_point():
    return import_module("inference_MLLM")


def scrambled_model(cfg, seed: int) -> AnimeGamerMLLM:
    """The tiny config's MLLM with random values in every trained tensor (a stand-in for a trained checkpoint)."""
    torch.manual_seed(0)
    model = AnimeGamerMLLM.from_config(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.trainable_parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return model.eval()


@pytest.fixture(scope="module")
def tiny_checkpoint(tiny_mistral_dir, tmp_path_factory):
    """A checkpoint for the shipped tiny inference config (226 slots, shot_dim 32) on the tiny Mistral."""
    cfg = replace(load_config(TINY).mllm, pretrained=str(tiny_mistral_dir))
    torch.set_num_threads(1)
    out = scrambled_model(cfg, seed=7).save_trained(tmp_path_factory.mktemp("mllm_ckpt") / "step_0000001")
    return cfg, out


def test_demo_game_writes_eight_turns(tmp_path, tiny_checkpoint):
    cfg, checkpoint = tiny_checkpoint
    out = tmp_path / "game"
    (out / "turn_009").mkdir(parents=True)  # a stale turn from a longer earlier game is removed
    load_entry_point().main(["--config", str(TINY), f"output_dir={out}", f"game={DEMO}",
                             f"mllm.pretrained={cfg.pretrained}", f"mllm_checkpoint={checkpoint}"])
    turn_dirs = [f"turn_{i:03d}" for i in range(8)]
    assert sorted(p.name for p in out.iterdir()) == [".animegamer.lock", "game.json", *turn_dirs, "turns.jsonl"]
    game, turns = load_results(out)
    assert game["complete"] and len(game["turns"]) == 8 and game["history_turns"] == 1
    assert game["mllm"]["checkpoint"] == str(checkpoint) and game["mllm"]["num_slots"] == 226
    instructions = [i.render() for i in read_game_file(DEMO)]
    state = CharacterState()
    for index, (record, shot) in enumerate(turns):
        assert shot.shape == (226, 32) and shot.dtype == torch.float32 and torch.isfinite(shot).all()
        assert record["instruction"] == instructions[index] and record["index"] == index
        values = StateValues(**record["values"])  # valid by construction
        state = state.update(values)
        assert record["state"] == state.to_dict()
        assert set(record) >= {"index", "instruction", "values", "state", "prompt_tokens"}
        assert abs(sum(record["value_probs"]["motion_level"].values()) - 1) < 1e-5
        assert game["turns"][index]["dir"] == f"turn_{index:03d}"
    assert turns[0][0]["prompt_tokens"] < turns[1][0]["prompt_tokens"]  # turn 0 has no history
    assert len({tuple(r["values"].values()) for r, _ in turns}) > 1 or len({s.sum().item() for _, s in turns}) > 1

    # the run fed its own predictions back: turn 3 is what the model predicts from turn 2 alone (K = 1)
    model = AnimeGamerMLLM.from_config(cfg)
    model.load_trained(checkpoint)
    previous = HistoryTurn(turns[2][0]["instruction"], turns[2][1], StateValues(**turns[2][0]["values"]))
    again = predict_turn(model, [previous], instructions[3])
    torch.testing.assert_close(again.shot_embeds, turns[3][1], rtol=1e-5, atol=1e-5)
    assert vars(again.values) == turns[3][0]["values"]


def test_empty_checkpoint_runs_the_fresh_model_with_a_warning(tmp_path, tiny_mistral_dir, capsys):
    game = tmp_path / "game.txt"
    game.write_text("# two turns\nQiqi wakes up\n\nCharacter: Qiqi; Motion: run; Background: park.\n")
    load_entry_point().main(["--config", str(TINY), f"output_dir={tmp_path / 'out'}", f"game={game}",
                             f"mllm.pretrained={tiny_mistral_dir}", "mllm_checkpoint=''", "mllm.num_slots=8"])
    assert "warning: mllm_checkpoint is empty" in capsys.readouterr().err
    game_json, turns = load_results(tmp_path / "out")
    assert len(turns) == 2 and turns[0][1].shape == (8, 32) and game_json["mllm"]["checkpoint"] == ""
    assert turns[0][0]["instruction"] == "Qiqi wakes up"


@pytest.mark.parametrize(
    "content, overrides, needle",
    [
        (b"Qiqi runs\nCharacter: Qiqi; Motion: ; Background: park.\n", [], "game.txt:2: field 'motion'"),
        (b"# nothing but a comment\n", [], "no instructions"),
        (b"Qiqi runs\nQiqi runs and jumps and dances in the park at night\n", ["mllm.max_instruction_tokens=12"],
         "turn 2: instruction is"),
        (b"Qiqi sleeps\n\xff\xfe bad bytes\n", [], "not UTF-8"),
        (b"Qiqi <ANIME_3> runs\n", [], "reserved token"),
        (b"Qiqi runs\n", ["mllm_checkpoint=/no/such/checkpoint"], "not found: mllm_checkpoint=/no/such/checkpoint"),
        (None, [], "game file not found"),
    ],
    ids=["empty-field", "no-lines", "too-long", "undecodable", "reserved-token", "no-checkpoint", "no-game"],
)
def test_bad_input_fails_before_any_model_loads(tmp_path, tiny_mistral_dir, monkeypatch, capsys, content,
                                                overrides, needle):
    module = load_entry_point()

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was checked")

    monkeypatch.setattr(AnimeGamerMLLM, "from_config", no_model)
    game = tmp_path / "game.txt"
    if content is not None:
        game.write_bytes(content)
    with pytest.raises(SystemExit) as exit_info:
        module.main(["--config", str(TINY), f"output_dir={tmp_path / 'out'}", f"game={game}",
                     f"mllm.pretrained={tiny_mistral_dir}", *overrides])
    assert exit_info.value.code == 2
    assert needle in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_sliding_window_bounds_the_prompt_over_50_turns(tiny_mistral_dir):
    cfg = replace(load_config(TINY).mllm, pretrained=str(tiny_mistral_dir), num_slots=8, shot_dim=16)
    model = scrambled_model(cfg, seed=3)
    texts = ["Qiqi sleeps", "Character: Qiqi; Motion: quickly run and jump high; Background: sunny park at noon."]
    instructions = [texts[i % 3 == 0] for i in range(50)]
    for k in (0, 2):
        game, turns = AnimeGamer(MLLMPredictor(model), None, history_turns=k), []
        for text in instructions:
            turns.append(game.play_turn(turns, text))
        lengths = [turn.prompt_tokens for turn in turns]
        assert len(lengths) == 50
        # the longest possible prompt: BOS + k longest history turns + the longest current turn's prompt
        turn_len = {t: len(model.layout.build_sequence([_spec(t)], add_bos=False)) for t in texts}
        prompt_len = {t: len(model.layout.build_sequence([_spec(t, current=True)], add_bos=False)) for t in texts}
        bound = 1 + k * max(turn_len.values()) + max(prompt_len.values())
        assert max(lengths) <= bound
        # periodic once the window is full: turn i and turn i + 3 see the same window shape
        assert lengths[10:40] == lengths[13:43]
        if k == 0:
            assert set(lengths) == {1 + prompt_len[t] for t in texts}
    with pytest.raises(InstructionError, match="max_instruction_tokens=3"):
        AnimeGamer(MLLMPredictor(model, max_instruction_tokens=3), None).play_turn([], texts[1])
    with pytest.raises(InstructionError, match="empty"):
        MLLMPredictor(model).validate("  ")


def _spec(text: str, current: bool = False) -> TurnSpec:
    return TurnSpec(text, None if current else StateValues(1, 0, 0, 0), is_current=current)
