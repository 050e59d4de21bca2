"""What a game writes and reads: a save replaces only an earlier save, `:load` keeps the current game and plays the
loaded one in its own directory, every setting a game accepts makes saves it can load (and the others are refused
at start, before any model loads), and a save's messages name what is wrong."""

import dataclasses
import io
import json
import os
import stat
from importlib import import_module
from pathlib import Path

import pytest
import torch

from animegamer.game.browser import WebGame
from animegamer.game.save import MAX_SEED, SaveError, read_save
from animegamer.game.session import GameSession
from animegamer.game.terminal import main as play_main
from animegamer.game.terminal import run
from animegamer.game.turn import AnimeGamer
from tests.helpers.game import GAME, TINY, put, rewrite, turn0

ROOT = Path(__file__).resolve().parents[1]
K = 2  # history_turns of tiny_overrides


def mllm_only(session) -> AnimeGamer:
    """The session's game without its decoder (turns predicted, no clip rendered)."""
    return dataclasses.replace(session.game, renderer=None)


def fresh(played, out: Path, renderer: bool = False, seed: int = 42) -> GameSession:
    session, _ = played
    out.mkdir(parents=True, exist_ok=True)
    return GameSession(dataclasses.replace(session.game, renderer=session.game.renderer if renderer else None,
                                           seed=seed), output_dir=out)


def snapshot(path: Path):
    """What must not change about a file we refuse to replace: its inode, mode, links and bytes (if regular)."""
    info = os.lstat(path)
    content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
    return info.st_ino, info.st_mode, info.st_nlink, content


def not_a_save(kind: str, folder: Path, save: Path) -> Path:
    """A file at which a game must not be saved, of the given kind."""
    target = folder / f"{kind}.save"
    if kind == "text":
        target = folder / "notes.txt"
        target.write_text("my notes\n")
        target.chmod(0o600)
    elif kind == "text-named-save":
        target.write_text("not a game\n")
    elif kind == "weights":  # a safetensors file, but not a game
        from safetensors.torch import save_file

        save_file({"w": torch.zeros(3)}, str(target), metadata={"format": "pt"})
    elif kind == "other-format":  # safetensors with 'game' metadata of another format
        rewrite(save, target, put(format="someone-else-v9"))
    elif kind == "hard-link":  # an earlier save, but hard-linked: replacing it would break the link
        os.link(save, folder / "linked.save")
        target = folder / "linked.save"
    elif kind == "symlink-to-save":
        target.symlink_to(save)
    elif kind == "symlink-to-text":
        (folder / "plain.txt").write_text("text")
        target.symlink_to(folder / "plain.txt")
    elif kind == "dangling-symlink":
        target.symlink_to(folder / "nowhere")
    elif kind == "directory":
        target.mkdir()
        (target / "inside.txt").write_text("kept")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "device":
        target.symlink_to("/dev/null")
    return target


NOT_SAVES = ["text", "text-named-save", "weights", "other-format", "hard-link", "symlink-to-save", "symlink-to-text",
             "dangling-symlink", "directory", "fifo", "device"]


@pytest.mark.parametrize("kind", NOT_SAVES)
def test_save_refuses_to_replace_what_is_not_an_earlier_save(played, tmp_path, kind):
    session, save = played
    folder = tmp_path / "here"
    folder.mkdir()
    own = folder / "copy.save"
    own.write_bytes(save.read_bytes())  # a save of our own to hard-link
    target = not_a_save(kind, folder, own)
    before = snapshot(target)
    listing = sorted(p.name for p in folder.iterdir())
    with pytest.raises(ValueError, match="not replaced") as info:
        session.save(target)
    assert str(target) in str(info.value) and "\n" not in str(info.value)
    assert snapshot(target) == before  # same inode, mode, links and bytes
    assert sorted(p.name for p in folder.iterdir()) == listing  # no temp file left


def test_save_replaces_an_earlier_save_by_content_and_keeps_its_mode(played, tmp_path):
    session, save = played
    game = fresh(played, tmp_path / "g")
    game.play(GAME[0])
    for name, mode in (("notes.txt", 0o600), ("game.save", 0o640)):  # recognised by content, whatever its name
        target = tmp_path / name
        target.write_bytes(save.read_bytes())
        target.chmod(mode)
        game.save(target)
        assert os.lstat(target).st_mode & 0o777 == mode  # never widened to the umask's 0644
        assert len(read_save(target, history_turns=K).turns) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g", "game.save", "notes.txt"]


def test_terminal_save_over_a_text_file_is_one_line_and_the_game_goes_on(played, tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("shopping list\n")
    (tmp_path / "folder.save").mkdir()
    game = fresh(played, tmp_path / "g")
    out = io.StringIO()
    final = run(game, io.StringIO("\n".join([GAME[0], f":save {notes}", f":save {tmp_path / 'folder.save'}",
                                             GAME[1], ":quit"])), out, games_dir=tmp_path)
    errors = [line for line in out.getvalue().splitlines() if line.startswith("error: ")]
    assert len(errors) == 2 and "exists and is not an animegamer saved game" in errors[0]
    assert "is a directory, not a saved game" in errors[1]
    assert notes.read_text() == "shopping list\n" and len(final.turns) == 2
    assert len(read_save(tmp_path / "g" / "game.save", history_turns=K).turns) == 2  # autosaved at :quit


def test_web_save_over_a_directory_is_refused_in_the_status(played, tmp_path):
    session, _ = played
    web = WebGame(dataclasses.replace(session.game, renderer=None), tmp_path / "web")
    game = web.new_session()
    game.play(GAME[0])
    (Path(game.output_dir) / "game.save").mkdir()
    file, status = web.save(game)
    assert file is None and status.startswith("**Not saved:**") and "is a directory" in status


def test_terminal_load_autosaves_and_plays_in_its_own_directory(played, tmp_path):
    _, other = played
    games = tmp_path / "games"
    current = fresh(played, games / "current", renderer=True)
    script = [GAME[0], ":save", GAME[1], f":load {other}", GAME[2], ":quit"]
    out = io.StringIO()
    final = run(current, io.StringIO("\n".join(script)), out, games_dir=games)
    text = out.getvalue()
    mine = games / "current" / "game.save"
    assert f"saved 2 turns to {mine} before loading" in text
    clips = {p.name: p.read_bytes() for p in (games / "current").glob("turn_*.mp4")}
    assert sorted(clips) == ["turn_000.mp4", "turn_001.mp4"]
    # the loaded game played its third turn and autosaved at :quit in a new directory of its own
    assert Path(final.output_dir).parent == games and Path(final.output_dir) != games / "current"
    assert f"its clips go to {final.output_dir}" in text
    assert [p.name for p in Path(final.output_dir).glob("turn_*.mp4")] == ["turn_002.mp4"]
    assert len(read_save(Path(final.output_dir) / "game.save", history_turns=K).turns) == 3
    kept = read_save(mine, history_turns=K)  # the player's game: its two turns, not the loaded game's
    assert [t.instruction for t in kept.turns] == [current.turns[0].instruction, current.turns[1].instruction]
    assert all(p.read_bytes() == clips[p.name] for p in (games / "current").glob("turn_*.mp4"))


@pytest.mark.parametrize("case", ["saved-already", "bad-save", "other-file-in-the-way", "cannot-autosave"])
def test_terminal_load_never_drops_the_current_game(played, tmp_path, case):
    _, other = played
    games = tmp_path / "games"
    current = fresh(played, games / "current")
    load = other
    if case == "bad-save":
        load = rewrite(other, tmp_path / "bad.save", turn0("prompt_tokens", -1))
    script = [GAME[0], ":save"] if case == "saved-already" else [GAME[0]]
    if case == "other-file-in-the-way":  # something that is not a save sits where the autosave goes
        (games / "current" / "game.save").mkdir()
    if case == "cannot-autosave":  # and beside it too: the game cannot be saved, so it is not left
        for name in ["game.save", *(f"game-{n}.save" for n in range(2, 10))]:
            (games / "current" / name).write_text("not a save")
    out = io.StringIO()
    final = run(current, io.StringIO("\n".join([*script, f":load {load}", ":quit"])), out, games_dir=games)
    text = out.getvalue()
    folders = sorted(p.name for p in games.iterdir())
    if case == "saved-already":
        assert "before loading" not in text and len(final.turns) == 2 and len(folders) == 2
    elif case == "other-file-in-the-way":
        saved = games / "current" / "game-2.save"
        assert f"saved 1 turns to {saved} before loading" in text and len(final.turns) == 2 and len(folders) == 2
        assert len(read_save(saved, history_turns=K).turns) == 1 and (games / "current" / "game.save").is_dir()
    else:  # refused: the current game goes on where it was, no new directory
        assert final is current and len(final.turns) == 1 and folders == ["current"]
        assert "error: " in text and "loaded 2 turns" not in text


BAD_STARTS = [
    ("seed=-1", "seed=-1 must be an integer in 0..9223372036854775807"),
    (f"seed={MAX_SEED + 1}", "seed=9223372036854775808 must be"),
    ("history_turns=1000001", "history_turns=1000001 must be an integer in 0..1000000"),
    ("sampling.steps=0", "sampling.steps=0 must be >= 1"),
    ("sampling.num_frames=0", "sampling.num_frames=0 must be >= 1"),
    ("sampling.fps=0", "sampling.fps=0 must be >= 1"),
    ("sampling.height=-8", "sampling.height=-8 must be >= 1"),
    ("output_dir={file}/sub", "output_dir={file}/sub cannot be written"),
    ("output_dir=/proc/animegamer", "output_dir=/proc/animegamer cannot be written"),
]
if not torch.cuda.is_available():
    BAD_STARTS += [("device=cuda", "device=cuda: no CUDA GPU is visible here"),
                   ("device=cuda:3", "device=cuda:3: no CUDA GPU is visible here")]
if not torch.backends.mps.is_available():
    BAD_STARTS += [("device=mps", "device=mps: Metal (mps) is not available here")]


@pytest.mark.parametrize("entry", ["play", "app"])
@pytest.mark.parametrize("setting, needle", BAD_STARTS)
def test_settings_a_save_cannot_hold_are_one_line_before_any_model(entry, setting, needle, tiny_mistral_dir,
                                                                   tmp_path, monkeypatch, capsys):
    from animegamer.models.decoder import AnimationShotDecoder
    from animegamer.models.mllm import AnimeGamerMLLM

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(AnimeGamerMLLM, "from_config", no_model)
    monkeypatch.setattr(AnimationShotDecoder, "from_config", no_model)
    file = tmp_path / "a_file"
    file.write_text("")
    setting, needle = setting.format(file=file), needle.format(file=file)
    main = import_module("app").main if entry == "app" else play_main
    args = ["--config", str(TINY), f"output_dir={tmp_path / 'out'}", f"mllm.pretrained={tiny_mistral_dir}",
            "mllm_checkpoint=", "decoder_checkpoint=", setting]
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.startswith("error: ") and err.count("\n") == 1 and needle in err


@pytest.mark.parametrize("port", ["99999", "0", "-1", "65536"])
def test_app_port_out_of_range_is_one_line_before_any_model(port, tiny_mistral_dir, tmp_path, monkeypatch, capsys):
    from animegamer.models.mllm import AnimeGamerMLLM

    monkeypatch.setattr(AnimeGamerMLLM, "from_config", lambda *a, **k: pytest.fail("a model was loaded"))
    with pytest.raises(SystemExit) as info:
        import_module("app").main(["--config", str(TINY), "--port", port, f"output_dir={tmp_path}",
                            f"mllm.pretrained={tiny_mistral_dir}", "mllm_checkpoint=", "decoder_checkpoint="])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err == f"error: --port {port} is not a port (1..65535)\n"


@pytest.mark.parametrize("seed, history_turns", [(-1, K), (MAX_SEED + 1, K), (42, -1), (42, 10**6 + 1)])
def test_a_game_a_save_cannot_hold_is_refused_when_made(played, tmp_path, seed, history_turns):
    session, _ = played
    with pytest.raises(ValueError, match="must be an integer in"):
        GameSession(dataclasses.replace(session.game, renderer=None, history_turns=history_turns, seed=seed),
                    output_dir=tmp_path)


@pytest.mark.parametrize("seed", [0, 1, MAX_SEED])
def test_every_seed_a_game_accepts_makes_a_save_it_loads(played, tmp_path, seed):
    session, _ = played
    game = fresh(played, tmp_path, seed=seed)
    game.play(GAME[0])
    game.play("Character: Qiqi; Motion: " + "run " * 20 + "; Background: park.")
    loaded = GameSession.load(game.save(tmp_path / "g.save"), mllm_only(session), tmp_path)
    assert loaded.seed == seed and [t.instruction for t in loaded.turns] == [t.instruction for t in game.turns]


class NaNShots:
    """The real predictor, but its shots hold a NaN (a half-precision overflow): a save would refuse them."""

    def __init__(self, predictor):
        self.predictor = predictor

    def validate(self, instruction):
        self.predictor.validate(instruction)

    def predict_turn(self, history, instruction):
        prediction = self.predictor.predict_turn(history, instruction)
        prediction.shot_embeds = prediction.shot_embeds.clone()
        prediction.shot_embeds[0, 0] = float("nan")
        return prediction


def test_a_turn_a_save_would_refuse_is_not_played(played, tmp_path):
    session, _ = played
    game = fresh(played, tmp_path)
    game.play(GAME[0])
    game.game.predictor = NaNShots(session.game.predictor)
    with pytest.raises(ValueError, match="the predicted shot: holds NaN"):
        game.play(GAME[1])
    assert len(game.turns) == 1
    GameSession.load(game.save(tmp_path / "g.save"), mllm_only(session), tmp_path)


LONG = "7" * 5000  # JSON allows it; Python's int() refuses past 4300 digits


def with_long_number(save: Path, out: Path, change) -> Path:
    """A copy of ``save`` with the 5000-digit number :data:`LONG` wherever ``change(meta)`` put the string "@LONG@"
    (json.dumps cannot write such a number)."""
    return rewrite(save, out, lambda meta: json.dumps(change(meta)).replace('"@LONG@"', LONG))


def in_values(name):
    def change(meta):
        meta["turns"][0]["values"][name] = "@LONG@"
        return meta
    return change


LONG_NUMBERS = {
    "seed": (put(seed="@LONG@"), "seed: an integer of 5000 digits is outside 0..9223372036854775807"),
    "history_turns": (put(history_turns="@LONG@"), "history_turns: an integer of 5000 digits is outside"),
    "index": (turn0("index", "@LONG@"), r"turns\[0\].index: an integer of 5000 digits is outside 0..0"),
    "prompt_tokens": (turn0("prompt_tokens", "@LONG@"), r"turns\[0\].prompt_tokens: an integer of 5000 digits"),
    "instruction": (turn0("instruction", "@LONG@"), r"turns\[0\].instruction: expected a string, got int"),
    "clip": (turn0("clip", "@LONG@"), r"turns\[0\].clip: expected a string, got int"),
    "motion_level": (in_values("motion_level"), r"turns\[0\].values: .*<an integer of 5000 digits>"),
    "stamina": (in_values("stamina"), r"turns\[0\].values: .*<an integer of 5000 digits>"),
}


@pytest.mark.parametrize("case", list(LONG_NUMBERS))
def test_a_5000_digit_number_names_the_file_and_field(played, tmp_path, case):
    session, save = played
    change, needle = LONG_NUMBERS[case]
    bad = with_long_number(save, tmp_path / "long.save", change)
    with pytest.raises(SaveError, match=needle) as info:
        GameSession.load(bad, mllm_only(session), tmp_path)
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and len(message) < 300 and "\n" not in message


@pytest.mark.parametrize("kind, needle", [("device", "a character device"), ("fifo", "a named pipe (FIFO)"),
                                          ("dangling-symlink", "a symbolic link to a missing file")])
def test_a_save_that_is_no_file_says_what_it_is(played, tmp_path, kind, needle):
    session, save = played
    target = not_a_save(kind, tmp_path, save)
    with pytest.raises(SaveError) as info:
        GameSession.load(target, mllm_only(session), tmp_path)
    assert str(info.value) == f"{target}: {needle}, not a saved game file"
    with pytest.raises(FileNotFoundError, match="saved game not found"):
        GameSession.load(tmp_path / "absent.save", mllm_only(session), tmp_path)


EDGE_INSTRUCTIONS = [
    "Qiqi <ANIME_3> runs",  # a layout token
    "Qiqi </s> runs",  # the tokenizer's end of sequence
    " ".join(["zq"] * 130),  # past mllm.max_instruction_tokens
    "run " * 25_000,  # past the character limit
    "Qiqi runs\x00 fast",  # a control character
    "Qiqi\u202eruns",  # a bidirectional override
    "Character: Qiqi; Motion: ; Background: park.",  # an empty field
    "Ｑｉｑｉ ｒｕｎｓ",  # full-width letters
    "Qiqi läuft über die Brücke — schnell!",
    "Qiqi  runs\tfast ",  # extra spaces: saved in the form the game plays
    "Character: Qiqi; Motion: quickly run; Background: park",
]


@pytest.mark.parametrize("instruction", EDGE_INSTRUCTIONS)
def test_an_instruction_plays_exactly_when_its_save_loads(played, tmp_path, instruction):
    session, _ = played
    game = fresh(played, tmp_path)
    try:
        game.play(instruction)
    except ValueError:
        assert game.turns == []  # refused before the game changed
        return
    loaded = GameSession.load(game.save(tmp_path / "g.save"), mllm_only(session), tmp_path)
    assert loaded.turns[0].instruction == game.turns[0].instruction
