"""scripts/run_ablations.py (animegamer.eval.ablations): the shipped ablation tables are complete and consistent;
two tiny rows train and print."""

from importlib import import_module
from pathlib import Path

import pytest

from animegamer.config import SCHEMAS, EvalConfig, load_config
from tests.helpers.eval_data import clip_overrides, eval_overrides, make_spriteworld

ROOT = Path(__file__).resolve().parents[1]
TABLES = ("representation", "pipeline")
# Every row of the paper's ablation tables (issue 7), by row name.
PAPER_ROWS = {"random_frame", "linear_projector", "fusion_add", "fusion_cross_attn", "no_warmup", "no_motion_scope",
              "no_adaptation", "cosine_loss"}
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]


def _script():
    from animegamer.eval import ablations

    return ablations


def _listed(items: list[str]) -> str:
    """A list override value; quoted items, since an item may hold '=' and brackets itself."""
    return "[" + ",".join(f"'{item}'" for item in items) + "]"


def _checkpoint_of(run_config) -> str:
    return f"{run_config.output_dir}/checkpoints/latest"


@pytest.mark.parametrize("table", TABLES)
def test_shipped_tables_point_each_row_at_what_it_trains(table, monkeypatch):
    monkeypatch.chdir(ROOT)  # paths in the tables are relative to the repository root
    cfg = load_config(ROOT / "configs" / "ablations" / f"{table}.yaml")
    assert type(cfg).__name__ == "AblationsConfig" and len(cfg.rows) >= 3
    for row in cfg.rows:
        steps, overrides = _script().row_plan(row, cfg)
        ev = load_config(row.eval_config or cfg.eval_config, [*cfg.eval_overrides, *overrides], schema=EvalConfig)
        assert len(ev.systems) == 1
        for step in steps:
            run = load_config(step.config, step.overrides)
            assert type(run) is SCHEMAS[step.script], (row.name, step.config)
            # the evaluation reads the checkpoint this row's last run of each stage writes
            if step.script == "stage_a" and ev.systems == ["reconstruction"]:
                assert ev.stage_a_checkpoint == _checkpoint_of(run), row.name
                # whose decoder shape (the motion scope) the evaluation reads from that checkpoint's own files
                # (config.recorded.with_decoder_checkpoint), so the row does not restate it
                assert not any(o.startswith("inference.decoder.") for o in row.eval_overrides), row.name
            if step.script == "stage_b":
                assert ev.inference.mllm_checkpoint == _checkpoint_of(run), row.name
            if step.script == "stage_c":
                assert ev.inference.decoder_checkpoint == _checkpoint_of(run), row.name
        if row.name == "no_adaptation":  # stage (c) skipped: the stage (a) decoder renders the MLLM's shots
            assert ev.inference.decoder_checkpoint == _checkpoint_of(load_config("configs/stage_a.yaml"))
            assert not row.train


def test_retrain_game_is_a_stage_b_and_a_stage_c_on_it(tmp_path, monkeypatch):
    """A row's ``retrain_game`` writes out as the two runs run.yaml's `paper` and `no_name_swaps` rows once spelled
    out step by step (the same steps and evaluation overrides), each run's config of its stage's kind; a row that
    also lists ``train`` is one error line before anything runs."""
    from animegamer.config import AblationStep

    monkeypatch.chdir(ROOT)
    train = import_module("scripts.spriteworld.train")
    cfg = load_config(ROOT / "configs/spriteworld/run.yaml", [f"output_dir={tmp_path}"])
    cfg.configs = str(ROOT / cfg.configs)
    table = load_config(train.resolve_configs(cfg)["ablations"])
    runs, configs = table.output_dir, tmp_path / "configs"
    assert runs == f"{tmp_path}/eval"
    spelled = {  # the rows as run.yaml wrote them before retrain_game
        "paper": ["identity_weight=0.0", "name_swap_copies=0"],
        "no_name_swaps": ["name_swap_copies=0"],
    }
    rows = {row.name: row for row in table.rows}
    for name, stage_b in spelled.items():
        steps, overrides = _script().row_plan(rows[name], table)
        assert steps == [
            AblationStep("stage_b", str(configs / "stage_b.yaml"), [*stage_b, f"output_dir={runs}/{name}/stage_b"]),
            AblationStep("stage_c", str(configs / "stage_c.yaml"),
                         [f"stage_b_checkpoint={runs}/{name}/stage_b/checkpoints/latest",
                          f"output_dir={runs}/{name}/stage_c"]),
        ]
        assert overrides == ["systems=[animegamer]",
                             f"inference.decoder_checkpoint={runs}/{name}/stage_c/checkpoints/latest",
                             f"inference.mllm_checkpoint={runs}/{name}/stage_b/checkpoints/latest"]
        for step in steps:
            assert type(load_config(step.config, step.overrides)) is SCHEMAS[step.script]
    plain = rows["k1"]
    assert _script().row_plan(plain, table) == (plain.train, plain.eval_overrides)
    both = tmp_path / "both.yaml"
    both.write_text("kind: ablations\nrows:\n  - name: twice\n    retrain_game: [seed=1]\n"
                    "    train: [{script: stage_b, config: configs/stage_b.yaml}]\n")
    with pytest.raises(SystemExit) as info:
        _script().main(["--config", str(both), "--quiet"])
    assert str(info.value) == "error: row twice: retrain_game and train both name its training runs; keep one"


def test_shipped_tables_cover_the_paper():
    names = set()
    for table in TABLES:
        names |= {row.name for row in load_config(ROOT / "configs" / "ablations" / f"{table}.yaml").rows}
    assert PAPER_ROWS <= names


def test_two_tiny_rows_train_evaluate_and_print(tmp_path, tiny_clip_config, tiny_cogvideox_dir, tiny_mistral_dir,
                                                  capsys):
    data = make_spriteworld(tmp_path / "data")
    out = tmp_path / "ablations"
    train = [
        *clip_overrides("clip", tiny_clip_config), f"t5.path={tiny_cogvideox_dir}",
        f"decoder.pretrained={tiny_cogvideox_dir}", f"data.manifest={data / 'clips.jsonl'}",
        f"data.features_dir={tmp_path / 'features'}", "data.height=48", "data.width=64", "data.num_frames=9",
        "train.max_steps=2", "warmup_steps=1", "train.checkpoint_every=2", "train.lr_warmup_steps=0",
        "train.report_to=csv",
    ]
    evaluation = ["systems=[reconstruction]", "max_games=1",
                  *eval_overrides(data, tiny_clip_config, tiny_cogvideox_dir, tiny_mistral_dir)]
    argv = ["--config", str(ROOT / "configs" / "tiny" / "ablations.yaml"), "--quiet", f"output_dir={out}",
            f"train_overrides={_listed(train)}", f"eval_overrides={_listed(evaluation)}"]
    script = _script()
    entries = script.main(argv)
    printed = capsys.readouterr().out

    assert [label for label, _ in entries] == ["concat (ours)", "addition"]
    for row, fusion in (("concat", "concat"), ("fusion_add", "add")):
        step = out / row / "stage_a" / "checkpoints" / "step_0000002"
        assert f'"fusion": "{fusion}"' in (step / "encoder" / "config.json").read_text().replace(":  ", ": ")
        assert (out / row / "results.jsonl").is_file() and (out / row / "per_turn.png").is_file()
    table = (out / "table.md").read_text()
    assert table in printed
    assert table.splitlines()[2].startswith("| ablation | CLIP-I ↑ |")
    rows = [line for line in table.splitlines() if line.startswith("| ") and "ablation" not in line]
    assert [r.split(" | ")[0] for r in rows] == ["| concat (ours)", "| addition"]
    for (_, summary), line in zip(entries, rows, strict=True):
        cells = line.strip("| ").split(" | ")
        assert cells[8] == f"{summary.means['psnr']:.2f}" and summary.means["psnr"] > 0  # reconstruction vs truth
        assert cells[6] == "–"  # reconstruction predicts no state
        assert summary.counts["clip_i"] == 3  # one game of 3 turns
    # the two encoders differ, so the reconstructions do
    assert entries[0][1].means["clip_i"] != entries[1][1].means["clip_i"]

    # --table-only rebuilds the same table from the rows' results, without training or sampling
    assert [label for label, _ in script.main([*argv, "--table-only"])] == ["concat (ours)", "addition"]
    assert (out / "table.md").read_text() == table
    # --rows evaluates the named row again; the table keeps the other row's results (read, not evaluated)
    kept = (out / "concat" / "results.jsonl").read_bytes()
    again = script.main([*argv, "--skip-train", "--rows", "fusion_add"])
    assert [label for label, _ in again] == ["concat (ours)", "addition"]
    assert (out / "concat" / "results.jsonl").read_bytes() == kept
    assert again[0][1].means == entries[0][1].means and again[1][1].counts == entries[1][1].counts


def test_skip_train_without_checkpoints_is_one_clear_error(tmp_path, tiny_clip_config, tiny_cogvideox_dir,
                                                          tiny_mistral_dir, capsys):
    data = make_spriteworld(tmp_path / "data")
    evaluation = ["systems=[reconstruction]", *eval_overrides(data, tiny_clip_config, tiny_cogvideox_dir,
                                                              tiny_mistral_dir)]
    argv = ["--config", str(ROOT / "configs" / "tiny" / "ablations.yaml"), "--quiet", "--skip-train",
            "--rows", "fusion_add", f"output_dir={tmp_path / 'none'}", f"eval_overrides={_listed(evaluation)}"]
    with pytest.raises(SystemExit, match=r"row fusion_add: .*checkpoint not found"):
        _script().main(argv)
    with pytest.raises(SystemExit, match=r"unknown rows \['nope'\]"):
        _script().main([*argv[:5], "nope", *argv[6:]])
