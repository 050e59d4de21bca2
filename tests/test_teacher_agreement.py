"""research/teacher_agreement.py on tiny checkpoints: a teacher decoder run, a 1- and a 2-step "student" (random
trained parts with a sampler.json), two held-out SpriteWorld games; the files, the call counts, the reference row."""

import json
from importlib import import_module

import pytest
import torch

from animegamer.bench.options import distilled_timesteps
from animegamer.config import SamplingConfig
from animegamer.models.decoder import AnimationShotDecoder
from animegamer.sampling.fewstep import FewStepSampler
from animegamer.sampling.presets import guided_calls
from tests.helpers.eval_data import make_spriteworld
from tests.helpers.game import TINY, tiny_overrides
from tests.helpers.stage_scripts import tiny_decoder_config, write_decoder_run

pytestmark = pytest.mark.usefixtures("one_thread")
TEACHER = {"steps": 6, "scheduler": "ddim", "guidance_scale": 3.0, "dynamic_cfg": True, "dynamic_cfg_exponent": 5.0,
           "guidance_steps_fraction": 1.0}


@pytest.fixture(scope="module")
def setup(tiny_mistral_dir, tiny_cogvideox_dir, tmp_path_factory):
    """(argv of a run, the checkpoints' directory, the tiny decoder config)."""
    root = tmp_path_factory.mktemp("agreement")
    torch.manual_seed(0)
    cfg = tiny_decoder_config(tiny_cogvideox_dir)
    g = torch.Generator().manual_seed(0)
    teacher = write_decoder_run(cfg, root / "stage_c", 10, g)
    decoder = AnimationShotDecoder.from_config(cfg)
    students = []
    for k in (1, 2):
        step_dir = write_decoder_run(cfg, root / f"stage_d_{k}", 5, g)
        FewStepSampler(distilled_timesteps(decoder, TEACHER["steps"], k), teacher=dict(TEACHER)).save(
            step_dir / "decoder")
        students.append(str(root / f"stage_d_{k}"))
    games = make_spriteworld(root / "data") / "games"
    argv = ["--config", str(TINY), *tiny_overrides(tiny_mistral_dir, tiny_cogvideox_dir, root / "play"),
            f"decoder_checkpoint={teacher}", "--games", str(games), "--students", *students,
            "--out", str(root / "out")]
    return argv, root, cfg


def test_every_sampler_against_the_teacher(setup):
    argv, root, cfg = setup
    json_path, md_path = import_module("research.teacher_agreement").main(argv)
    result = json.loads(json_path.read_text())
    rows = result["rows"]
    assert list(rows) == ["teacher", "distilled 2", "distilled 1", "undistilled 4", "undistilled 2", "undistilled 1",
                          "cache first_block", "cache taylorseer", "cache pab", "cache faster", "cache magcache"]
    assert result["games"] == 2 and result["turns"] == 6
    teacher_calls = guided_calls(SamplingConfig(**TEACHER))
    assert teacher_calls == 12  # 6 guided DDIM steps, 2 calls each
    calls = {name: row["transformer_calls_per_turn"] for name, row in rows.items()}
    assert calls["teacher"] == teacher_calls
    assert (calls["distilled 2"], calls["distilled 1"]) == (2, 1)
    assert (calls["undistilled 4"], calls["undistilled 2"], calls["undistilled 1"]) == (4, 2, 1)
    caches = ("first_block", "taylorseer", "pab", "faster", "magcache")
    assert all(calls[f"cache {m}"] == teacher_calls for m in caches)
    # the teacher is the reference: no distance to itself
    assert "psnr" not in rows["teacher"] and "itself is infinite" in rows["teacher"]["note"]
    for name, row in rows.items():
        if name == "teacher":
            continue
        for metric in ("rel_l2", "psnr", "ssim"):
            low, mean, high = (float(row[metric][k]) for k in ("low", "mean", "high"))  # "inf" in strict JSON
            assert low <= mean <= high, (name, metric)
        assert len(row["per_turn"]) == 6 and 0 <= row["rel_l2"]["mean"] < 2 and 0 < row["ssim"]["mean"] <= 1
    # first-block caching skips nothing at its threshold on this random model: the teacher's clip exactly
    assert rows["cache first_block"]["psnr"]["mean"] == "inf" and rows["cache first_block"]["rel_l2"]["mean"] == 0
    for name in ("distilled 1", "undistilled 1", "cache taylorseer"):  # fewer calls or skipped work: a real distance
        assert 0 < rows[name]["rel_l2"]["mean"] and 10 < rows[name]["psnr"]["mean"] < 100, name
    assert rows["undistilled 1"]["psnr"]["mean"] < rows["undistilled 4"]["psnr"]["mean"]  # more steps: closer
    # the undistilled rows sample at the students' own timesteps where one exists
    assert result["students"]["distilled 2"]["timesteps"] == list(distilled_timesteps(
        AnimationShotDecoder.from_config(cfg), 6, 2))
    assert set(result["paired_psnr_gain_db"]) == {"distilled 1 - undistilled 1", "distilled 2 - undistilled 2"}
    assert "game 0: 3 turns" in result["magcache"]["calibrated_on"]
    table = md_path.read_text()
    assert "| teacher (the reference) | 12 | — | — | — |" in table and "| distilled 1 | 1 |" in table
    assert not list((root / "out").glob("*.tmp*"))


def test_user_errors_are_one_line(setup, capsys, tmp_path):
    argv, root, cfg = setup
    script = import_module("research.teacher_agreement")
    other = write_decoder_run(cfg, tmp_path / "other", 1, torch.Generator().manual_seed(1))
    FewStepSampler((999, 499), teacher={**TEACHER, "steps": 20}).save(other / "decoder")
    cases = [
        ([*argv, "--max-games", "-1"], "--max-games >= 0"),
        ([*argv[:argv.index("--games")], "decoder_checkpoint=", *argv[argv.index("--games"):]],
         "must name the teacher"),
        ([*argv, "--games", str(tmp_path / "none")], "neither a benchmark"),
        ([*argv, "--students", str(root / "stage_d_1"), str(tmp_path / "other")], "different teacher samplers"),
        ([*argv, "--students", str(root / "stage_d_1"), str(root / "stage_d_1")], "one checkpoint per step count"),
        ([*argv, "--students", str(root / "stage_c")], "sampler.json is missing"),
    ]
    for case, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            script.main(case)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and err.count("\n") == 1, (message, err)
