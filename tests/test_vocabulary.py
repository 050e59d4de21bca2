"""The world's vocabulary that the games offer and check instructions against."""

import json

import pytest

from animegamer.config import load_config
from animegamer.data.vocabulary import Vocabulary, load_vocabulary, save_vocabulary
from animegamer.spriteworld.films import training_tags
from animegamer.states import parse_tags


def _shots(*lines):
    return [parse_tags(f"<S>{s}</S><MD>{m}</MD><EV>{e}</EV><ML>2</ML><MA>{a}</MA><SC>0</SC><ET>0</ET><ST>0</ST>")
            for s, m, e, a in lines]


def test_from_shots_most_frequent_first_and_round_trip(tmp_path):
    vocab = Vocabulary.from_shots(_shots(("Kai", "run", "noon park", "quickly"), ("Qiqi", "run", "night bedroom", ""),
                                         ("Qiqi", "sleep", "night bedroom", "soundly")))
    assert vocab == Vocabulary(("Qiqi", "Kai"), ("quickly", "soundly"), ("run", "sleep"),
                               ("night bedroom", "noon park"))
    assert vocab.placeholder() == "Character: Qiqi; Motion: quickly run; Background: night bedroom."
    save_vocabulary(vocab, tmp_path)
    assert load_vocabulary(tmp_path) == vocab
    assert load_vocabulary(tmp_path / "elsewhere") is None and load_vocabulary("") is None


def test_a_background_that_opens_a_film_is_the_example():
    """A memory world's most frequent background refers to earlier turns; the example shows one that opens a film."""
    shots = _shots(("Kai", "walk", "still here", "calmly"), ("Kai", "walk", "still here", "calmly"),
                   ("Kai", "eat", "morning kitchen", "happily"), ("Kai", "walk", "noon park", "calmly"))
    assert Vocabulary.from_shots(shots).backgrounds[0] == "still here"
    vocab = Vocabulary.from_shots(shots, openers=[shots[3]])
    assert vocab.backgrounds == ("noon park", "still here", "morning kitchen")
    assert vocab.placeholder() == "Character: Kai; Motion: calmly walk; Background: noon park."


def test_unknown_words_per_part():
    vocab = Vocabulary(("Qiqi", "Kai"), ("gently",), ("read a book", "talk with Kai"), ("night bedroom",))
    assert vocab.unknown_words("Character: qiqi; Motion: gently read a book; Background: night bedroom.") == []
    assert vocab.unknown_words("Character: Bob; Motion: gently lie down; Background: night moon.") == [
        "character 'Bob' is not one of Qiqi, Kai",
        "motion: 'lie', 'down' never seen in training",
        "background: 'moon' never seen in training",
    ]
    assert vocab.unknown_words("Kai reads a book at night") == ["'reads', 'at' never seen in training"]
    assert vocab.unknown_words("") == []  # not playable: the game's own error says so


@pytest.mark.parametrize("data, message", [
    ([], "exactly the keys"),
    ({"characters": ["Qiqi"], "adverbs": [], "motions": ["run"]}, "exactly the keys"),
    ({"characters": "Qiqi", "adverbs": [], "motions": ["run"], "backgrounds": ["park"]}, "must be a list"),
    ({"characters": ["Qi\nqi"], "adverbs": [], "motions": ["run"], "backgrounds": ["park"]}, "printable"),
    ({"characters": ["x" * 201], "adverbs": [], "motions": ["run"], "backgrounds": ["park"]}, "printable"),
    ({"characters": [], "adverbs": [], "motions": ["run"], "backgrounds": ["park"]}, "no characters"),
])
def test_malformed_vocabulary_file_is_one_value_error(tmp_path, data, message):
    (tmp_path / "vocabulary.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message):
        load_vocabulary(tmp_path)


def test_shipped_spriteworld_vocabulary_is_its_training_films():
    data = load_config("checkpoints/spriteworld/configs/data.yaml")
    expected = Vocabulary.from_shots(training_tags(data))  # memory films: as their instructions say them
    shipped = load_vocabulary(load_config("configs/spriteworld/inference.yaml").mllm_checkpoint)
    for name in ("characters", "adverbs", "motions", "backgrounds"):  # the words; their order is stage b's counts
        assert set(getattr(shipped, name)) == set(getattr(expected, name)), name
    assert set(shipped.characters) == {"Qiqi", "Momo", "Kai", "Luna"} and "read a book" in shipped.motions
    # the example a new game shows is a first turn of the shipped (memory) world: nothing in it refers back
    from animegamer.spriteworld.memory import GameMemory
    from animegamer.states import parse_instruction

    assert "still" in " ".join(shipped.backgrounds)  # the memory world's words are there ...
    GameMemory().resolve(parse_instruction(shipped.placeholder()))  # ... but not in the example (TagError if so)
