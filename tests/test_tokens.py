import pytest
from transformers import AutoTokenizer

from animegamer.states import StateValues
from animegamer.tokens import (
    IGNORE_INDEX,
    PAPER,
    RELEASED,
    STATE_FIELDS,
    TurnLayout,
    TurnSpec,
    add_special_tokens,
    get_vocabulary,
)

SLOTS = 6


@pytest.fixture(params=["paper", "released"])
def layout(request, tiny_t5_config):
    tok = AutoTokenizer.from_pretrained(f"{tiny_t5_config.path}/tokenizer")
    vocab = get_vocabulary(request.param)
    added = add_special_tokens(tok, vocab, SLOTS)
    assert added == len(vocab.special_tokens(SLOTS))
    return TurnLayout(tok, vocab, SLOTS)


def test_vocabularies():
    assert PAPER.slot(0) == "<ANIME_0>" and PAPER.slot(225) == "<ANIME_225>"
    assert RELEASED.slot(0) == "<frame_00000>" and RELEASED.slot(225) == "<frame_00225>"
    assert len([t for t in PAPER.special_tokens() if t.startswith("<ANIME_")]) == 226
    assert PAPER.open_tag("motion_level") == "<MS>" and RELEASED.open_tag("motion_level") == "<ML>"
    assert RELEASED.value_token("motion_level", 3) == "<Strength_3>"
    assert PAPER.value_tokens("stamina") == ["<stamina_-1>", "<stamina_+0>", "<stamina_+1>"]
    with pytest.raises(ValueError):
        get_vocabulary("nope")


def test_layout_training_sequence(layout):
    values = [StateValues(2, 0, 1, -1), StateValues(3, 1, 0, 0), StateValues(5, 0, 0, 1)]
    turns = [TurnSpec("Character: Qiqi; Motion: run; Background: park.", values[i]) for i in range(2)]
    turns.append(TurnSpec("Qiqi sleeps", values[2], is_current=True))
    seq = layout.build_sequence(turns)
    ids = seq.input_ids
    assert len(seq.slot_positions) == 3 and all(len(p) == SLOTS for p in seq.slot_positions)
    for positions in seq.slot_positions:
        assert [ids[p] for p in positions] == layout.slot_ids
        assert ids[positions[0] - 1] == layout.shot_open_ids[-1]
        assert ids[positions[-1] + 1] == layout.shot_close_ids[0]
    # labels only at the current turn's value tokens
    labelled = [i for i, x in enumerate(seq.labels) if x != IGNORE_INDEX]
    assert labelled == [seq.value_positions[2][f] for f in STATE_FIELDS]
    assert layout.decode_values({f: ids[seq.value_positions[2][f]] for f in STATE_FIELDS}) == values[2]
    assert layout.decode_values({f: ids[seq.value_positions[0][f]] for f in STATE_FIELDS}) == values[0]
    assert ids[-1] == layout.turn_close_id
    assert seq.turn_spans[0][1] == seq.turn_spans[1][0]


def test_layout_inference_prompt(layout):
    turns = [TurnSpec("a run", StateValues(1, 0, 0, 0)), TurnSpec("a sleep", None, is_current=True)]
    seq = layout.build_sequence(turns)
    assert seq.state_prompt_end == len(seq) and seq.input_ids[-1] == layout.open_ids["motion_level"]
    assert all(x == IGNORE_INDEX for x in seq.labels)


def test_layout_errors(layout):
    with pytest.raises(ValueError, match="at least one"):
        layout.build_sequence([])
    with pytest.raises(ValueError, match="last turn"):
        layout.build_sequence([TurnSpec("a", None, is_current=True), TurnSpec("b", StateValues(1, 0, 0, 0))])
    with pytest.raises(ValueError, match="needs its state values"):
        layout.build_sequence([TurnSpec("a", None), TurnSpec("b", None, is_current=True)])
    with pytest.raises(ValueError, match="not a value token"):
        layout.decode_values({f: layout.slot_ids[0] for f in STATE_FIELDS})


def test_layout_requires_special_tokens(tiny_t5_config):
    tok = AutoTokenizer.from_pretrained(f"{tiny_t5_config.path}/tokenizer")
    with pytest.raises(ValueError, match="special tokens"):
        TurnLayout(tok, PAPER, SLOTS)


def test_released_vocabulary_matches_the_release_tokenizer(tmp_path):
    """Every released-layout token exists in the release tokenizer, at the ids the official reference uses."""
    from tests.helpers.official_ref_data import build_release_tokenizer, release_added_tokens

    assert set(RELEASED.special_tokens()) <= set(release_added_tokens())
    assert {RELEASED.value_token(f, 1) for f in STATE_FIELDS} == {"<Strength_1>"}  # one spelling for every field
    tok = AutoTokenizer.from_pretrained(build_release_tokenizer(tmp_path, 32000))
    layout = TurnLayout(tok, RELEASED)
    assert layout.slot_ids == list(range(32000, 32226))
    assert layout.shot_open_ids == [32256, 32260] and layout.shot_close_ids == [32261, 32257]
    assert layout.value_ids["stamina"] == [32266, 32267, 32268] and layout.value_ids["motion_level"][0] == 32268
    assert [layout.open_ids["motion_level"], layout.turn_open_id, layout.turn_close_id] == [32274, 32282, 32283]
