"""inference_MLLM.py and inference_Decoder.py on an unlucky machine and untrusted results: a results file that is a
named pipe or a device, numbers of thousands of digits, a disk that fills while rendering, two runs in one folder."""

import json
import os
import stat
from pathlib import Path

import pytest

from animegamer.data.video import probe_video
from animegamer.game.results import load_results
from animegamer.models.mllm import AnimeGamerMLLM
from tests.helpers.limits import directory_held, run_python
from tests.helpers.results import TINY, entry, refuse_models, results_dir

ROOT = Path(__file__).resolve().parents[1]


def decoder_args(out: Path, cogvideox: Path) -> list[str]:
    return ["--config", str(TINY), f"output_dir={out}", f"decoder.pretrained={cogvideox}",
            "decoder_checkpoint=", "device=cpu", "sampling.steps=1", "sampling.height=48", "sampling.width=64",
            "sampling.num_frames=9"]


# ---------------------------------------------------------------------- results files that are not files


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["pipe", "device"])
@pytest.mark.parametrize("name", ["game.json", "turns.jsonl", "turn_000/state.json",
                                  "turn_000/shot_embeds.safetensors"])
def test_a_results_file_that_is_a_pipe_or_a_device_is_one_line(tmp_path, tiny_cogvideox_dir, name, kind):
    """Opening a named pipe blocks for ever and a device reads without end (23.7 GB before the OOM killer): both
    are refused, by the real entry point in a real process, before anything is opened."""
    if kind == "device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root")
    out = results_dir(tmp_path / "out", turns=1)
    (out / name).unlink()
    if kind == "pipe":
        os.mkfifo(out / name)
    else:
        os.mknod(out / name, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # what /dev/zero is
    result = run_python(["inference_Decoder.py", *decoder_args(out, tiny_cogvideox_dir)], timeout=300)
    words = "named pipe" if kind == "pipe" else "character device"
    assert result.returncode == 2 and result.stderr.startswith("error: "), result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and words in result.stderr, result.stderr
    assert Path(name).name in result.stderr
    assert not list(out.glob("*.mp4"))


@pytest.mark.parametrize("where, field", [("game.json", "num_turns"), ("game.json", "seed"),
                                          ("turn_000/state.json", "prompt_tokens"),
                                          ("turn_000/state.json", "index")])
def test_a_number_of_thousands_of_digits_names_its_file_and_field(tmp_path, where, field):
    out = results_dir(tmp_path / "out", turns=1, shape=(8, 4))
    path = out / where
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, field: 0}).replace(f'"{field}": 0', f'"{field}": 1' + "0" * 5000))
    with pytest.raises(ValueError) as exc:
        load_results(out)
    message = str(exc.value)
    assert "\n" not in message and len(message) < 400 and "4300" not in message, message
    assert str(path) in message or str(path.parent) in message, message
    assert f"'{field}'" in message, message


def test_a_turns_line_past_its_bound_is_refused(tmp_path, monkeypatch):
    import animegamer.game.results as runner

    out = results_dir(tmp_path / "out", turns=2, shape=(8, 4), finish=False)
    monkeypatch.setattr(runner, "MAX_RECORD_BYTES", 100)
    with pytest.raises(ValueError, match="line 1 is longer than 100 characters"):
        load_results(out)
    monkeypatch.setattr(runner, "MAX_TURNS_FILE_BYTES", 10)
    with pytest.raises(ValueError, match="turns.jsonl: .* bytes, more than the 10 allowed"):
        load_results(out)


# ---------------------------------------------------------------------- a disk that fills while rendering


@pytest.mark.slow
@pytest.mark.parametrize("limit", [10_000, 40_000, 100_000])
def test_the_decoder_on_a_full_disk_stops_in_one_line_and_leaves_no_partial_file(tmp_path, tiny_cogvideox_dir,
                                                                                  limit):
    """Measured on the tiny models: a turn's gif ~27 kB, its mp4 ~5 kB, the x6 copy ~61 kB, game_x6.mp4 ~124 kB,
    the contact sheet ~112 kB; so the limits stop the run at a turn's gif, its enlarged copy, and the game videos."""
    out = results_dir(tmp_path / "out", turns=2)
    result = run_python(["inference_Decoder.py", *decoder_args(out, tiny_cogvideox_dir)], file_limit=limit)
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: rendering stopped: "), result.stderr
    assert not (out / "game.mp4").exists() and not (out / "game_x6.mp4").exists()
    for video in out.glob("*.mp4"):  # whatever was published is whole
        assert probe_video(video).num_frames == 9, video
    assert not [p for p in out.rglob(".*") if p.name != ".animegamer.lock"]  # no temp file
    for gif in out.glob("turn_*.gif"):  # a turn's clip is its gif and its mp4, never one alone
        assert gif.with_suffix(".mp4").exists(), gif
    if limit == 10_000:
        assert not list(out.glob("turn_*.*"))  # the first gif did not fit: nothing of the turn


# ---------------------------------------------------------------------- two runs in one folder


def test_a_second_decoder_or_mllm_run_in_a_held_folder_is_refused_in_one_line(tmp_path, tiny_cogvideox_dir,
                                                                              tiny_mistral_dir, monkeypatch, capsys):
    out = results_dir(tmp_path / "out", turns=1)
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".animegamer.lock"}
    game = tmp_path / "game.txt"
    game.write_text("Qiqi runs\n")
    decoder, mllm = entry("inference_Decoder"), entry("inference_MLLM")
    refuse_models(monkeypatch, decoder, "build_game")
    refuse_models(monkeypatch, AnimeGamerMLLM, "from_config")
    runs = {
        "decoder": lambda: decoder.main(decoder_args(out, tiny_cogvideox_dir)),
        "mllm": lambda: mllm.main(["--config", str(TINY), f"game={game}", f"output_dir={out}", "device=cpu",
                                   f"mllm.pretrained={tiny_mistral_dir}", "mllm_checkpoint="]),
    }
    with directory_held(out) as holder:
        for name, run in runs.items():
            with pytest.raises(SystemExit) as exc:
                run()
            err = capsys.readouterr().err
            assert exc.value.code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1, name
            assert f"PID {holder}" in err and "other_run.py" in err, err
    assert before == {p: p.read_bytes() for p in out.rglob("*") if p.is_file() and p.name != ".animegamer.lock"}
