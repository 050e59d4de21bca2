import os

import pytest

from animegamer.states import (
    CharacterState,
    Instruction,
    ShotTags,
    StateValues,
    TagError,
    parse_instruction,
    parse_tags,
    read_game_file,
)

LINE = "<S>Girl</S><MD>run</MD><EV>Forest</EV><ML>3</ML><MA>slowly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>"


def test_tag_round_trip():
    tags = parse_tags(LINE)
    assert tags.subject == "Girl" and tags.motion == "run" and tags.environment == "Forest"
    assert tags.values == StateValues(motion_level=3, social=0, entertainment=1, stamina=-1)
    assert tags.render() == LINE
    assert parse_tags(tags.render()) == tags


def test_tags_in_other_order_and_spaces_are_canonicalised():
    shuffled = "<ML> 2 </ML><S>Boy</S><MD>walk</MD><EV>Park</EV><MA></MA><SC>1</SC><ET>0</ET><ST>0</ST>"
    tags = parse_tags(shuffled)
    assert tags.render() == "<S>Boy</S><MD>walk</MD><EV>Park</EV><ML>2</ML><MA></MA><SC>1</SC><ET>0</ET><ST>0</ST>"
    assert tags.instruction().render() == "Character: Boy; Motion: walk; Background: Park."


@pytest.mark.parametrize(
    "line, field, needle",
    [
        ("", None, "empty"),
        (LINE.replace("<MD>run</MD>", ""), "motion", "missing tag <MD>"),
        (LINE.replace("<MD>run</MD>", "<MD> </MD>"), "motion", "must not be empty"),
        (LINE.replace("<ML>3</ML>", "<ML>7</ML>"), "motion_level", "not one of"),
        (LINE.replace("<ML>3</ML>", "<ML>three</ML>"), "motion_level", "not an integer"),
        (LINE.replace("<SC>0</SC>", "<SC>2</SC>"), "social", "not one of"),
        (LINE.replace("<ST>-1</ST>", "<ST>-3</ST>"), "stamina", "not one of"),
        (LINE + "<ZZ>1</ZZ>", None, "unknown tag"),
        (LINE + "<S>again</S>", "subject", "twice"),
        ("garbage " + LINE, None, "outside tags"),
        (LINE.replace("<ET>1</ET>", "<ET>1"), None, "outside tags"),
    ],
)
def test_bad_tag_lines(line, field, needle):
    with pytest.raises(TagError) as err:
        parse_tags(line, source="caps.txt", line=12)
    assert needle in str(err.value)
    assert "caps.txt:12" in str(err.value)
    assert err.value.field == field


def test_instruction_structured_and_free_text():
    ins = parse_instruction("Character: Qiqi; Motion: gently lie down; Background: night bedroom.")
    assert ins == Instruction("Qiqi", "gently lie down", "night bedroom")
    assert ins.render() == "Character: Qiqi; Motion: gently lie down; Background: night bedroom."
    assert parse_instruction(ins.render()) == ins
    free = parse_instruction("  Qiqi   eats a cake in the kitchen ")
    assert not free.structured and free.render() == "Qiqi eats a cake in the kitchen"


@pytest.mark.parametrize(
    "text, needle",
    [
        ("", "empty"),
        ("   ", "empty"),
        ("Character: Qiqi; Motion: ; Background: park.", "'motion'"),
        ("Character: ; Motion: run; Background: park.", "'character'"),
        ("Character: Qiqi; Motion: run", "expected"),
        ("x" * 500, "more than"),
        ("run\x07 fast", "control"),
    ],
)
def test_bad_instructions(text, needle):
    with pytest.raises(TagError, match=needle):
        parse_instruction(text, source="game.txt", line=3)


def test_read_game_file_names_the_line(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("# a game\nCharacter: A; Motion: run; Background: park.\n\nCharacter: A; Motion: ; Background: x.\n")
    with pytest.raises(TagError, match=r"g.txt:4"):
        read_game_file(str(p))
    p.write_text("Character: A; Motion: run; Background: park.\nA sleeps.\n")
    assert len(read_game_file(str(p))) == 2


def test_state_update_rule_and_clamps():
    s = CharacterState()
    assert (s.stamina, s.social, s.entertainment) == (50, 50, 50)
    s2 = s.update(StateValues(motion_level=4, social=1, entertainment=0, stamina=-1))
    assert s2.to_dict() == {"stamina": 45, "social": 55, "entertainment": 45}
    assert s.to_dict() == {"stamina": 50, "social": 50, "entertainment": 50}
    high = CharacterState(stamina=98, social=100, entertainment=3)
    out = high.update(StateValues(motion_level=1, social=1, entertainment=0, stamina=1))
    assert out.to_dict() == {"stamina": 100, "social": 100, "entertainment": 0}
    low = CharacterState(stamina=2, social=0, entertainment=100)
    assert low.update(StateValues(1, 0, 1, -1)).to_dict() == {"stamina": 0, "social": 0, "entertainment": 100}
    assert CharacterState.from_dict(out.to_dict()) == out
    with pytest.raises(TagError):
        CharacterState.from_dict({"stamina": 101, "social": 0, "entertainment": 0})


def test_state_values_validate():
    with pytest.raises(TagError, match="motion_level"):
        StateValues(motion_level=0, social=0, entertainment=0, stamina=0)
    with pytest.raises(TagError, match="stamina"):
        StateValues(motion_level=1, social=0, entertainment=0, stamina=2)
    with pytest.raises(TagError, match="social"):
        StateValues(motion_level=1, social=True, entertainment=0, stamina=0)


def test_shot_tags_to_dict():
    d = parse_tags(LINE).to_dict()
    assert d["motion_level"] == 3 and d["subject"] == "Girl"
    assert ShotTags("a", "b", "c", "", StateValues(1, 0, 0, 0)).render().startswith("<S>a</S>")


@pytest.mark.parametrize("newline", ["\n", "\r\n"])
@pytest.mark.parametrize("first", ["Character: Qiqi; Motion: run; Background: park.", "# a comment", "", "run home"])
def test_a_game_file_with_a_byte_order_mark_is_read(tmp_path, first, newline):
    """Windows editors start UTF-8 files with U+FEFF; it is not part of the first instruction."""
    lines = [first, "Character: Qiqi; Motion: sit; Background: bench.", "walk to the river"]
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_bytes(newline.join(lines).encode("utf-8"))
    marked.write_bytes(b"\xef\xbb\xbf" + newline.join(lines).encode("utf-8"))
    assert read_game_file(str(marked)) == read_game_file(str(plain))


def test_a_byte_order_mark_inside_an_instruction_is_still_refused(tmp_path):
    p = tmp_path / "game.txt"
    p.write_text("walk\ufeff home\n", encoding="utf-8")
    with pytest.raises(TagError, match="control characters"):
        read_game_file(str(p))


def test_a_game_path_that_is_not_a_file_is_refused_without_opening_it(tmp_path):
    os.mkfifo(tmp_path / "pipe.txt")  # opening it would wait forever for a writer
    (tmp_path / "loop.txt").symlink_to("loop.txt")
    for path, needle in ((tmp_path, "a directory"), (tmp_path / "pipe.txt", "not a regular file"),
                         (tmp_path / "loop.txt", "not a regular file")):
        with pytest.raises(TagError, match=needle) as exc:
            read_game_file(str(path))
        assert str(path) in str(exc.value)
    with pytest.raises(FileNotFoundError):
        read_game_file(str(tmp_path / "missing.txt"))
