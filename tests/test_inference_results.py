"""The MLLM results directory (animegamer.game.results: ResultsWriter, load_results) and the checks the two
inference scripts run before any model loads (animegamer.game.preflight)."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from animegamer.data.video import mp4_stream, probe_video, read_video
from animegamer.game.contact_sheet import MAX_SHEET_PIXELS, contact_sheet
from animegamer.game.preflight import check_device, check_output_dir
from animegamer.game.results import ResultsWriter, load_results
from animegamer.models.mllm import AnimeGamerMLLM
from tests.helpers.limits import run_python
from tests.helpers.results import SHAPE, TINY, entry, played, refuse_models, results_dir

ROOT = Path(__file__).resolve().parents[1]
NO_GPU = not torch.cuda.is_available()


def bytes_written() -> int:
    """Bytes this process has passed to write(2) so far (Linux), whatever wrote them (Python, Rust, C)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("wchar:"):
            return int(line.split()[1])
    raise AssertionError("no wchar in /proc/self/io")


# ---------------------------------------------------------------------- writing: constant cost per turn


@pytest.mark.skipif(not Path("/proc/self/io").exists(), reason="counts bytes with Linux's /proc/self/io")
def test_a_turn_writes_the_same_bytes_early_and_late_in_a_long_game(tmp_path):
    shape = (8, 4)
    summary = {"game": "g.txt", "history_turns": 1, "seed": 3, "mllm": {"num_slots": shape[0], "shot_dim": shape[1]}}
    turns = [played(i, shape, instruction="Qiqi runs") for i in range(250)]
    cost = []
    with ResultsWriter(tmp_path / "out", summary) as results:
        game_inode = os.stat(tmp_path / "out" / "game.json").st_ino
        for turn in turns:
            before = bytes_written()
            results.add(turn)
            cost.append(bytes_written() - before)
        assert os.stat(tmp_path / "out" / "game.json").st_ino == game_inode  # not rewritten during the game
        results.finish()
    early, late = np.mean(cost[10:20]), np.mean(cost[-10:])
    # the digits of the turn number ("index": 249 vs 10) are the only growth allowed
    assert late - early < 16, (early, late)
    assert max(cost) < 2 * min(cost)
    game, loaded = load_results(tmp_path / "out", shape)
    assert game["complete"] and game["num_turns"] == 250 and len(loaded) == 250


def test_results_list_exactly_the_finished_turns_while_the_game_runs(tmp_path):
    out = tmp_path / "out"
    summary = {"game": "g.txt", "history_turns": 1, "seed": 3, "mllm": {"num_slots": 8, "shot_dim": 4}}
    with ResultsWriter(out, summary) as results:
        game, turns = load_results(out)
        assert not game["complete"] and turns == []
        for i in range(3):
            results.add(played(i, (8, 4)))
            game, turns = load_results(out, (8, 4))
            assert not game["complete"] and len(turns) == i + 1 and len(game["turns"]) == i + 1
        with open(out / "turns.jsonl", "a") as fh:  # a crash in the middle of appending the next line
            fh.write('{"turn": 3, "instr')
        game, turns = load_results(out, (8, 4))
        assert len(turns) == 3
    with pytest.raises(ValueError, match="turn 5 written after 3 turns"):  # turns are added in order
        results.add(played(5, (8, 4)))


def test_complete_results_must_list_every_turn(tmp_path):
    out = results_dir(tmp_path / "out", turns=3, shape=(8, 4))
    lines = (out / "turns.jsonl").read_text().splitlines(keepends=True)
    (out / "turns.jsonl").write_text("".join(lines[:2]))  # a turn lost
    with pytest.raises(ValueError, match="'num_turns' is 3 but turns.jsonl lists 2 turns"):
        load_results(out)
    (out / "turns.jsonl").write_text("".join(lines) + '{"cut": ')
    with pytest.raises(ValueError, match="line 4 is cut short"):
        load_results(out)
    (out / "turns.jsonl").write_text(lines[0] + "not json\n" + "".join(lines[2:]))
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        load_results(out)
    (out / "turns.jsonl").unlink()
    with pytest.raises(ValueError, match="turns.jsonl is missing"):
        load_results(out)
    (out / "turns.jsonl").symlink_to(tmp_path / "elsewhere.jsonl")
    (tmp_path / "elsewhere.jsonl").write_text("".join(lines))
    with pytest.raises(ValueError, match="is outside"):
        load_results(out)


def test_a_new_game_replaces_every_file_of_the_last_one(tmp_path):
    out = results_dir(tmp_path / "out", turns=4, shape=(8, 4))
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "mine.txt").write_text("mine")
    (out / "turn_007").symlink_to(keep)  # a link is removed, never what it points to
    (out / "notes.txt").write_text("mine")
    results_dir(out, turns=2, shape=(8, 4))
    assert sorted(p.name for p in out.iterdir()) == ["game.json", "notes.txt", "turn_000", "turn_001", "turns.jsonl"]
    assert len(load_results(out)[1]) == 2 and (keep / "mine.txt").read_text() == "mine"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_results_of_an_earlier_format_are_refused_in_one_line(tmp_path, version):
    """A turn is written in one JSON form (Turn.record: index, state), the one a save holds; results written by an
    earlier version are refused by name, with what to do."""
    out = results_dir(tmp_path / "old", turns=2, shape=(8, 4))
    game = json.loads((out / "game.json").read_text())
    (out / "game.json").write_text(json.dumps({**game, "format": f"animegamer-mllm-results-{version}"}))
    with pytest.raises(ValueError) as exc:
        load_results(out, (8, 4))
    assert "\n" not in str(exc.value) and "run inference_MLLM.py again" in str(exc.value)
    state = json.loads((out / "turn_001" / "state.json").read_text())
    assert state["index"] == 1 and set(state) >= {"instruction", "values", "state", "prompt_tokens", "clip", "gif"}


# ---------------------------------------------------------------------- reading: the config decides the shape


@pytest.mark.parametrize(
    "recorded, written, needle",
    [
        ((8, 4), (8, 4), "this config's models take num_slots=226, shot_dim=32"),  # both edited consistently
        ((226, 32), (8, 4), r"shape \(8, 4\), expected \(226, 32\)"),  # game.json untouched, shots replaced
        ((226, 32), (226, 33), r"shape \(226, 33\), expected \(226, 32\)"),
        ((226, 4), (226, 4), "num_slots=226, shot_dim=4"),
    ],
)
def test_shots_are_checked_against_the_config_not_the_results(tmp_path, recorded, written, needle):
    out = results_dir(tmp_path / "out", turns=2, shape=recorded)
    if written != recorded:
        save_file({"shot_embeds": torch.zeros(written)}, str(out / "turn_001" / "shot_embeds.safetensors"))
    with pytest.raises(ValueError, match=needle):
        load_results(out, SHAPE)


@pytest.mark.parametrize(
    "instruction, needle",
    [
        ("Qiqi runs " * 41, "more than 400"),  # 410 characters: longer than the game accepts
        ("x" * 10_000_000, "more than 400"),  # one 10 MB word: would be a sheet row of megapixels
        ("Qiqi\x1b[2J runs", "control characters"),
        ("   ", "empty instruction"),
        (["a", "list"], "'index' or 'instruction' is wrong"),
    ],
    ids=["410-chars", "10MB", "escape", "blank", "list"],
)
def test_instructions_in_the_results_are_held_to_the_games_limit(tmp_path, instruction, needle):
    out = results_dir(tmp_path / "out", turns=2)
    state_file = out / "turn_001" / "state.json"
    state = json.loads(state_file.read_text())
    state["instruction"] = instruction
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match=f"turn_001: not a turn written by inference_MLLM.py .*{needle}"):
        load_results(out, SHAPE)


def test_a_sheet_too_big_is_refused_before_its_memory_is_taken(tmp_path):
    frames = np.zeros((6, 64, 96, 3), np.uint8)
    rows = [(frames, ["turn"])] * (MAX_SHEET_PIXELS // ((6 * 100 + 260) * 68) + 1)
    with pytest.raises(ValueError, match="more than 64,000,000"):
        contact_sheet(rows, tmp_path / "sheet.png")
    assert not (tmp_path / "sheet.png").exists()


# ---------------------------------------------------------------------- preflight


@pytest.mark.parametrize("name", ["cuda", "cuda:0", "cuda:3"])
@pytest.mark.skipif(not NO_GPU, reason="checks the refusal on a machine without a GPU")
def test_cuda_without_a_gpu_is_refused(name):
    with pytest.raises(ValueError, match=f"device={name}: no CUDA GPU is visible"):
        check_device(name)


@pytest.mark.parametrize("name", ["graphics", "cuda:x", "", "tpu", "vulkan"])
def test_device_names_torch_cannot_use_are_refused(name):
    with pytest.raises(ValueError, match="device="):
        check_device(name)


def test_usable_devices_pass():
    assert check_device("cpu") == "cpu"
    assert check_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        assert check_device("cuda:0") == "cuda:0"
        with pytest.raises(ValueError, match="GPU"):
            check_device(f"cuda:{torch.cuda.device_count()}")


def test_output_dirs_that_cannot_be_written_are_refused(tmp_path):
    (tmp_path / "file").write_text("x")
    for path, needle in (
        (tmp_path / "file", "is not a folder"),
        (tmp_path / "file" / "sub", "cannot be written"),
        ("/proc/animegamer-results", "cannot be written"),
        ("/dev/null/results", "cannot be written"),
    ):
        with pytest.raises(ValueError, match=needle):
            check_output_dir(path)
    assert check_output_dir(tmp_path / "a" / "b").is_dir() and list((tmp_path / "a" / "b").iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_a_read_only_output_dir_is_refused(tmp_path):
    (tmp_path / "ro").mkdir(mode=0o555)
    with pytest.raises(ValueError, match="cannot be written"):
        check_output_dir(tmp_path / "ro")


# ---------------------------------------------------------------------- the scripts, before any model loads


def decoder_cases(tmp_path):
    (tmp_path / "file").write_text("x")
    cases = {
        "bad device": ["device=tpu"],
        "shape from the config": ["mllm.shot_dim=64"],
        "results dir is a file": [f"output_dir={tmp_path / 'file'}"],
    }
    if NO_GPU:
        cases["cuda without a GPU"] = ["device=cuda"]
    return cases


@pytest.mark.parametrize("case", ["bad device", "shape from the config", "results dir is a file",
                                  "cuda without a GPU"])
def test_decoder_script_refuses_before_the_decoder_loads(tmp_path, tiny_cogvideox_dir, monkeypatch, capsys, case):
    cases = decoder_cases(tmp_path)
    if case not in cases:
        pytest.skip("a GPU is visible")
    out = results_dir(tmp_path / "out", turns=2)
    module = entry("inference_Decoder")
    refuse_models(monkeypatch, module, "build_game")
    args = ["--config", str(TINY), f"output_dir={out}", f"decoder.pretrained={tiny_cogvideox_dir}",
            "decoder_checkpoint=", "device=cpu", *cases[case]]
    with pytest.raises(SystemExit) as exc:
        module.main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, err


def mllm_cases(tmp_path):
    (tmp_path / "file").write_text("x")
    (tmp_path / "games").mkdir()
    os.mkfifo(tmp_path / "pipe.txt")
    cases = {
        "game is a directory": ([f"game={tmp_path / 'games'}"], "a directory"),
        "game is a pipe": ([f"game={tmp_path / 'pipe.txt'}"], "not a regular file"),
        "output under a file": ([f"output_dir={tmp_path / 'file' / 'out'}"], "cannot be written"),
        "output is a file": ([f"output_dir={tmp_path / 'file'}"], "is not a folder"),
        "bad device": (["device=cuda:x"], "device="),
    }
    if NO_GPU:
        cases["cuda without a GPU"] = (["device=cuda"], "no CUDA GPU")
    return cases


@pytest.mark.parametrize("case", ["game is a directory", "game is a pipe", "output under a file", "output is a file",
                                  "bad device", "cuda without a GPU"])
def test_mllm_script_refuses_before_the_mllm_loads(tmp_path, tiny_mistral_dir, monkeypatch, capsys, case):
    cases = mllm_cases(tmp_path)
    if case not in cases:
        pytest.skip("a GPU is visible")
    overrides, needle = cases[case]
    game = tmp_path / "game.txt"
    game.write_text("\ufeffQiqi runs\n")  # a byte-order mark is no reason to refuse
    module = entry("inference_MLLM")
    refuse_models(monkeypatch, AnimeGamerMLLM, "from_config")
    args = ["--config", str(TINY), f"game={game}", f"output_dir={tmp_path / 'out'}", "device=cpu",
            f"mllm.pretrained={tiny_mistral_dir}", "mllm_checkpoint=", *overrides]
    with pytest.raises(SystemExit) as exc:
        module.main(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.startswith("error: ") and needle in err, err
    assert len(err.strip().splitlines()) == 1, err


# ---------------------------------------------------------------------- long games: streamed, paged


def test_an_mp4_stream_holds_every_piece_and_is_published_only_when_complete(tmp_path):
    pieces = [np.full((5, 48, 64, 3), 40 * i, np.uint8) for i in range(4)]
    with mp4_stream(tmp_path / "game.mp4", fps=8) as append:
        for piece in pieces:
            append(piece)
        assert not (tmp_path / "game.mp4").exists()  # not before the last piece is in
    frames, _ = read_video(tmp_path / "game.mp4")
    assert frames.shape == (20, 48, 64, 3)
    assert [int(np.median(frames[5 * i + 2])) for i in range(4)] == pytest.approx([0, 40, 80, 120], abs=3)
    with pytest.raises(ValueError, match="shape"), mp4_stream(tmp_path / "broken.mp4") as append:
        append(pieces[0])
        append(np.zeros((5, 48, 64), np.uint8))  # a bad piece half way: nothing is published
    assert sorted(p.name for p in tmp_path.iterdir()) == ["game.mp4"]


def test_a_long_game_gets_several_contact_sheets(tmp_path, tiny_cogvideox_dir, monkeypatch):
    out = results_dir(tmp_path / "out", turns=3)
    module = entry("inference_Decoder")
    monkeypatch.setattr(module, "SHEET_TURNS", 2)
    written = module.main(["--config", str(TINY), f"output_dir={out}", f"decoder.pretrained={tiny_cogvideox_dir}",
                           "decoder_checkpoint=", "device=cpu", "sampling.steps=1",
                           "sampling.height=48", "sampling.width=64", "sampling.num_frames=9"])
    assert sorted(p.name for p in out.glob("contact_sheet*.png")) == ["contact_sheet.png", "contact_sheet_002.png"]
    heights = [Image.open(out / name).height for name in ("contact_sheet.png", "contact_sheet_002.png")]
    assert heights[0] > heights[1]  # two rows, then the last one alone
    assert probe_video(written["game"]).num_frames == 3 * 9
    assert probe_video(written["game_upscaled"]).num_frames == 3 * 9


WRITE_UNTIL_FULL = """
import sys
from pathlib import Path
import torch
from animegamer.game.results import ResultsWriteError, ResultsWriter
from animegamer.game.turn import Turn
from animegamer.states import CharacterState, StateValues
from tests.helpers.results import SHAPE, TINY, VALUES, entry, played, refuse_models, results_dir

values = StateValues(motion_level=2, social=1, entertainment=0, stamina=-1)
with ResultsWriter(Path(sys.argv[1]), {"game": "g.txt", "mllm": {"num_slots": 4, "shot_dim": 8}}) as results:
    for index in range(200):
        shot = torch.randn(4, 8, generator=torch.Generator().manual_seed(index))
        try:
            results.add(Turn(index, f"Qiqi runs {index}" + " far" * index, values, CharacterState(), shot, 40))
        except ResultsWriteError as exc:
            print(results.num_turns)
            print(exc)
            break
"""


@pytest.mark.parametrize("limit", [200, 1500, 4000])  # the first shot file; a turns.jsonl line, early and later
def test_a_turn_that_cannot_be_written_leaves_the_turns_before_it_whole(tmp_path, limit):
    """A full disk (a real file size limit) while the results are written: the writer says so in one line and the
    directory holds exactly the turns before, each whole and listed once; no part of the failed turn stays."""
    out = tmp_path / "out"
    result = run_python(["-c", WRITE_UNTIL_FULL, str(out)], file_limit=limit, timeout=120)
    assert result.returncode == 0, result.stderr
    count, message = result.stdout.splitlines()
    count = int(count)
    assert f"could not write turn {count} to {out}" in message and "File too large" in message
    assert f"the {count} turns before it are complete" in message
    lines = (out / "turns.jsonl").read_bytes().decode().split("\n")
    assert lines[-1] == "" and len(lines) - 1 == count  # only whole lines
    assert [json.loads(line)["index"] for line in lines[:-1]] == list(range(count))
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [f"turn_{i:03d}" for i in range(count)]
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
