"""Saved games and results directories are untrusted input; the games survive bad files and Ctrl-C; entry points
reject bad settings with one line before any model loads."""

import dataclasses
import importlib.util
import io
import json
import math
import os
import re
import subprocess
import sys
from importlib import import_module
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from animegamer.data.video import probe_video
from animegamer.game.browser import WebGame
from animegamer.game.results import ResultsWriter, load_results
from animegamer.game.session import GameSession
from animegamer.game.terminal import run
from animegamer.game.turn import AnimeGamer, Turn
from animegamer.io import path_inside
from animegamer.states import CharacterState, StateValues
from tests.helpers.game import GAME, TINY, drop, put, rewrite, turn0

ROOT = Path(__file__).resolve().parents[1]
K = 2  # history_turns of tiny_overrides


def mllm_only(session) -> AnimeGamer:
    """The session's game without its decoder (turns predicted, no clip rendered)."""
    return dataclasses.replace(session.game, renderer=None)


def nan_shot(tensors):
    tensors["turn_00000"][3, 5] = math.nan
    return tensors


BAD_SAVES = {
    "missing-key": (drop("seed"), None, r"game: missing key\(s\) \['seed'\]"),
    "unknown-key": (put(extra=1), None, r"game: unknown key\(s\) \['extra'\]"),
    "not-json": (lambda m: "{not json", None, "metadata 'game' is not valid JSON"),
    "not-a-mapping": (lambda m: [1, 2], None, "game: expected a mapping"),
    "deep-json": (lambda m: "[" * 100_000 + "]" * 100_000, None, "metadata 'game' is nested too deeply"),
    "format": (put(format="other"), None, "format: 'other'"),
    "seed-type": (put(seed="42"), None, "seed: expected an integer, got str"),
    "seed-bool": (put(seed=True), None, "seed: expected an integer, got bool"),
    "negative-k": (put(history_turns=-1), None, "history_turns: -1 is outside"),
    "other-k": (put(history_turns=5), None, "history_turns: the game was played with K=5"),
    "turns-type": (put(turns={"0": 1}), None, "turns: expected a list"),
    "index": (turn0("index", 1), None, r"turns\[0\].index: 1 is outside 0..0"),
    "values-none": (turn0("values", None), None, r"turns\[0\].values: expected a mapping, got NoneType"),
    "turn-missing-key": (lambda m: put(turns=[drop("prompt_tokens")(m["turns"][0]), *m["turns"][1:]])(m), None,
                         r"turns\[0\]: missing key\(s\) \['prompt_tokens'\]"),
    "instruction-type": (turn0("instruction", 5), None, r"turns\[0\].instruction: expected a string"),
    "instruction-chars": (turn0("instruction", "run " * 25_000), None, "instruction is 99999 characters"),
    "instruction-tokens": (turn0("instruction", " ".join(["zq"] * 130)), None, "mllm.max_instruction_tokens=96"),
    "layout-token": (turn0("instruction", "Qiqi <ANIME_3> runs"), None, r"reserved token\(s\) \['<ANIME_3>'\]"),
    "eos-token": (turn0("instruction", "Qiqi </s> runs"), None, r"reserved token\(s\) \['</s>'\]"),
    "not-canonical": (turn0("instruction", "  Qiqi   runs "), None, "not in the form the game saves"),
    "value-range": (turn0("values", {"motion_level": 9, "social": 0, "entertainment": 0, "stamina": 0}), None,
                    r"turns\[0\].values: .*motion_level"),
    "value-type": (turn0("values", {"motion_level": "3", "social": 0, "entertainment": 0, "stamina": 0}), None,
                   r"turns\[0\].values"),
    "state-forged": (turn0("state", {"stamina": 100, "social": 100, "entertainment": 100}), None,
                     r"turns\[0\].state: .* does not follow from the values played"),
    "state-type": (turn0("state", {"stamina": "50", "social": 50, "entertainment": 50}), None,
                   r"turns\[0\].state.stamina: expected an integer"),
    "prompt-tokens": (turn0("prompt_tokens", -4), None, r"turns\[0\].prompt_tokens: -4 is outside"),
    "clip-type": (turn0("clip", ["/etc/passwd"]), None, r"turns\[0\].clip: expected a string"),
    "nan-shot": (None, nan_shot, "tensor turn_00000: holds NaN or infinite values"),
    "shot-shape": (None, put(turn_00001=torch.zeros(10, 32)),
                   r"tensor turn_00001: shape \(10, 32\), expected \(226, 32\)"),
    "shot-dtype": (None, lambda t: put(turn_00001=t["turn_00001"].half())(t), "tensor turn_00001: dtype F16"),
    "shot-rank": (None, lambda t: put(turn_00001=t["turn_00001"][None])(t), "tensor turn_00001: .* shape"),
    "extra-tensor": (None, lambda t: put(turn_00002=t["turn_00001"].clone())(t), "tensors: .* do not match the 2"),
    "missing-tensor": (None, drop("turn_00001"), "tensors: .* do not match the 2 turns"),
}


@pytest.mark.parametrize("case", list(BAD_SAVES))
def test_bad_save_is_one_value_error_naming_the_field(played, tmp_path, case):
    session, save = played
    meta_fn, tensors_fn, needle = BAD_SAVES[case]
    bad = rewrite(save, tmp_path / "bad.save", meta_fn, tensors_fn)
    with pytest.raises(ValueError, match=needle) as info:
        GameSession.load(bad, mllm_only(session), tmp_path)
    message = str(info.value)
    assert message.startswith(f"{bad}: ") and "\n" not in message


def test_good_save_loads_without_its_clip_paths(played, tmp_path):
    session, save = played
    loaded = GameSession.load(save, mllm_only(session), tmp_path)
    assert [t.instruction for t in loaded.turns] == [t.instruction for t in session.turns]
    assert [t.state for t in loaded.turns] == [t.state for t in session.turns]
    assert all(torch.equal(a.shot_embeds, b.shot_embeds) for a, b in zip(loaded.turns, session.turns, strict=True))
    assert session.turns[-1].clip and all(t.clip == "" and t.gif == "" for t in loaded.turns)
    assert loaded.history_turns == K and loaded.seed == session.seed


def with_declared_tensor(save: Path, out: Path, key: str, shape: tuple[int, int]) -> Path:
    """A copy of ``save`` whose safetensors header also declares an F32 tensor ``key`` of ``shape``, its data a
    sparse hole at the end of the file (gigabytes declared, nothing written to disk)."""
    raw = save.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + size]), raw[8 + size :]
    header[key] = {"dtype": "F32", "shape": list(shape), "data_offsets": [len(data), len(data) + 4 * math.prod(shape)]}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(out, "wb") as fh:
        fh.write(len(text).to_bytes(8, "little") + text + data)
        fh.truncate(8 + len(text) + header[key]["data_offsets"][1])
    return out


READ_UNDER_A_DATA_LIMIT = """
import resource, sys
from animegamer.game.save import SaveError, read_save
data = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmData:")) * 1024
resource.setrlimit(resource.RLIMIT_DATA, (data + 2**30, resource.RLIM_INFINITY))
try:
    read_save(sys.argv[1], history_turns=int(sys.argv[2]))
except SaveError as exc:
    print(exc)
"""


def test_extra_tensor_is_refused_from_the_header_before_it_is_read(played, tmp_path):
    # The extra key declares 4 GiB; the reader runs with 1 GiB of writable memory to spare, so opening the save's
    # tensors for torch (a copy-on-write map of the whole file) fails. The old reader opened and read every tensor
    # before checking the keys (a RuntimeError traceback here); the header alone refuses it now.
    _, save = played
    bad = with_declared_tensor(save, tmp_path / "big.save", "turn_00002", (32768, 32768))
    result = subprocess.run([sys.executable, "-c", READ_UNDER_A_DATA_LIMIT, str(bad), str(K)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == (f"{bad}: tensors: ['turn_00000', 'turn_00001', 'turn_00002'] do not match the "
                                     "2 turns (expected ['turn_00000', 'turn_00001'])")


def test_web_load_serves_only_files_inside_the_tab_folder(played, tmp_path):
    session, save = played
    game = WebGame(session.game, tmp_path / "web")
    readme = str(ROOT / "README.md")

    def point_clips(target):
        def change(meta):
            for turn in meta["turns"]:
                turn["clip"] = turn["gif"] = target
            return meta
        return change

    for target in (readme, "/etc/passwd", "../../README.md"):
        hostile = rewrite(save, tmp_path / "hostile.save", point_clips(target))
        loaded, status, video, *_ = game.load(str(hostile), None)
        assert status == "Loaded 2 turns." and len(loaded.turns) == 2
        assert video is not None and Path(video).suffix == ".mp4"
        assert path_inside(loaded.output_dir, video) == Path(video).resolve()  # re-rendered in the tab's folder
        assert Path(loaded.output_dir).resolve().is_relative_to((tmp_path / "web").resolve())
        assert probe_video(video).num_frames == 9

    # the view itself refuses any clip outside the session folder, symlinks followed
    (Path(loaded.output_dir) / "turn_009.mp4").symlink_to(readme)
    for path in (readme, "/etc/passwd", str(Path(loaded.output_dir) / "turn_009.mp4")):
        loaded.turns[-1].clip = loaded.turns[-1].shown = path
        assert game.view(loaded, "")[2] is None

    # a bad save: the current game stays, the status names the field
    bad = rewrite(save, tmp_path / "nan.save", None, nan_shot)
    kept, status, *_ = game.load(str(bad), loaded)
    status = re.sub(r"\\(.)", r"\1", status)  # the page's Markdown shows the message as text: punctuation escaped
    assert kept is loaded and "Not loaded" in status and "turn_00000: holds NaN" in status
    other_k = WebGame(dataclasses.replace(session.game, history_turns=K + 1), tmp_path / "web3")
    kept, status, *_ = other_k.load(str(save), None)
    status = re.sub(r"\\(.)", r"\1", status)
    assert kept is None and "history_turns: the game was played with K=2" in status


def _results_dir(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    values = StateValues(motion_level=2, social=1, entertainment=0, stamina=-1)
    turns = [Turn(i, f"Qiqi runs {i}", values, CharacterState(), torch.randn(8, 4), 40) for i in range(2)]
    with ResultsWriter(out, {"seed": 1, "mllm": {"num_slots": 8, "shot_dim": 4}}) as results:
        for turn in turns:
            results.add(turn)
        results.finish()
    return out


def test_load_results_keeps_every_path_inside_the_results_dir(tmp_path):
    out = _results_dir(tmp_path)
    game, turns = load_results(out)
    assert len(turns) == 2 and turns[1][1].shape == (8, 4)
    original = [json.loads(line) for line in (out / "turns.jsonl").read_text().splitlines()]

    def with_dir(value):
        lines = json.loads(json.dumps(original))
        lines[1]["dir"] = value
        (out / "turns.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))

    (tmp_path / "elsewhere").mkdir()
    for bad in ("..", "../elsewhere", "/etc", str(out / "turn_001"), "turn_000", "README.md", 5):
        with_dir(bad)
        with pytest.raises(ValueError, match=r"turns.jsonl: line 2: 'dir' must be 'turn_001'"):
            load_results(out)
    with_dir("turn_001")
    # a symlinked turn folder (or file) pointing outside is refused though its name is right
    (out / "turn_001").rename(tmp_path / "elsewhere" / "turn_001")
    (out / "turn_001").symlink_to(tmp_path / "elsewhere" / "turn_001")
    with pytest.raises(ValueError, match="is outside"):
        load_results(out)
    (out / "turn_001").unlink()
    (out / "turn_001").mkdir()
    (out / "turn_001" / "state.json").symlink_to(tmp_path / "elsewhere" / "turn_001" / "state.json")
    with pytest.raises(ValueError, match="is outside"):
        load_results(out)


def test_load_results_checks_records_and_shots(tmp_path):
    out = _results_dir(tmp_path)
    save_file({"shot_embeds": torch.full((8, 4), math.nan)}, str(out / "turn_001" / "shot_embeds.safetensors"))
    with pytest.raises(ValueError, match="turn_001: not a turn written by inference_MLLM.py .*NaN"):
        load_results(out)
    out = _results_dir(tmp_path / "b")
    state = json.loads((out / "turn_000" / "state.json").read_text())
    state["values"]["motion_level"] = 0
    (out / "turn_000" / "state.json").write_text(json.dumps(state))
    with pytest.raises(ValueError, match="turn_000: not a turn written by inference_MLLM.py .*motion_level"):
        load_results(out)
    for broken in ("{broken", "[" * 100_000):
        (out / "game.json").write_text(broken)
        with pytest.raises(ValueError, match="game.json: not valid JSON"):
            load_results(out)


def test_terminal_load_of_a_bad_save_keeps_the_game(played, tmp_path):
    session, save = played
    game = GameSession(mllm_only(session), output_dir=tmp_path)
    no_turns = rewrite(save, tmp_path / "a.save", drop("turns"))
    turns_int = rewrite(save, tmp_path / "b.save", put(turns=5))
    script = io.StringIO("\n".join([GAME[0], f":load {no_turns}", f":load {turns_int}", f":load {tmp_path}",
                                    GAME[1], ":quit"]))
    out = io.StringIO()
    final = run(game, script, out)
    lines = out.getvalue().splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 3 and "missing key(s) ['turns']" in errors[0] and "turns: expected a list" in errors[1]
    assert f"{tmp_path} is a directory, not a saved game file" in errors[2]
    assert len(final.turns) == 2 and final.turns[1].instruction == GAME[1]


class InterruptOnce:
    """The real renderer, but the first render is interrupted as by Ctrl-C (after the MLLM has predicted)."""

    def __init__(self, renderer):
        self.renderer, self.fps, self.armed = renderer, renderer.fps, True

    def latents(self, *args):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return self.renderer.latents(*args)

    def chunk_count(self, latents):
        return self.renderer.chunk_count(latents)

    def decode(self, latents):
        return self.renderer.decode(latents)


class InterruptedInput(io.StringIO):
    """Lines of a script; the first read is interrupted as by Ctrl-C at the prompt."""

    armed = True

    def readline(self, *args):
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt
        return super().readline(*args)


def test_ctrl_c_cancels_the_turn_and_keeps_the_game(played, tmp_path):
    session, _ = played
    game = GameSession(mllm_only(session), output_dir=tmp_path)
    game.play(GAME[0])
    game.game.renderer = InterruptOnce(session.game.renderer)
    out = io.StringIO()
    final = run(game, InterruptedInput("\n".join([GAME[1], ":state", GAME[1], ":quit"])), out)
    text = out.getvalue()
    assert "interrupted: type :quit to leave" in text  # Ctrl-C at the prompt
    assert "cancelled; the game is as it was (1 turns)" in text  # Ctrl-C during the turn
    assert len(final.turns) == 2 and "turn 1:" in text
    # the cancelled turn left nothing behind: the replayed turn is the one the uninterrupted game played
    again, original = final.turns[1], session.turns[1]
    assert again.values == original.values and again.state == original.state
    assert torch.equal(again.shot_embeds, original.shot_embeds)


def _entry(name):
    return import_module(name).main


ENTRY_POINTS = ["inference_MLLM", "inference_Decoder", "app", "play"]
BAD_SETTINGS = [
    ("device=tpu", "device='tpu' is not a device"),
    ("history_turns=-3", "history_turns=-3 must be >= -1"),  # -1: the K recorded with the checkpoint
    ("decoder_checkpoint=/nonexistent", "decoder_checkpoint=/nonexistent"),
    ("mllm_checkpoint=/nonexistent", "mllm_checkpoint=/nonexistent"),
]


NOT_READ = {("inference_MLLM", "decoder_checkpoint"), ("inference_Decoder", "mllm_checkpoint")}


@pytest.mark.parametrize(
    "entry, setting, needle",
    [(e, s, n) for e in ENTRY_POINTS for s, n in BAD_SETTINGS if (e, s.split("=")[0]) not in NOT_READ],
)
def test_bad_setting_is_one_line_before_any_model(entry, setting, needle, tiny_mistral_dir, tmp_path, monkeypatch,
                                                  capsys):
    from animegamer.models.decoder import AnimationShotDecoder
    from animegamer.models.mllm import AnimeGamerMLLM

    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr(AnimeGamerMLLM, "from_config", no_model)
    monkeypatch.setattr(AnimationShotDecoder, "from_config", no_model)
    main = _entry(entry) if entry != "play" else importlib.import_module("animegamer.game.terminal").main
    with pytest.raises(SystemExit) as info:
        main(["--config", str(TINY), f"output_dir={tmp_path}", f"game={ROOT / 'game_demo' / 'demo.txt'}",
              f"mllm.pretrained={tiny_mistral_dir}", "mllm_checkpoint=", "decoder_checkpoint=", setting])
    err = capsys.readouterr().err
    assert info.value.code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and needle in err


def test_save_file_is_atomic_with_the_umask_mode(played, tmp_path):
    session, save = played
    before = os.umask(0o022)
    try:
        path = session.save(tmp_path / "mine.save")
    finally:
        os.umask(before)
    assert path.stat().st_mode & 0o777 == 0o644  # was 0600 whatever the umask
    assert [p.name for p in tmp_path.iterdir()] == ["mine.save"]  # no temp file left beside it
    assert path.read_bytes() == save.read_bytes()
