"""scripts/evaluate.py end to end on tiny models, and the parts it is made of: games, systems, scoring, report."""

import csv
import json
import math
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from animegamer.data.manifest import ClipRecord, read_manifest, write_manifest
from animegamer.data.motion import MotionSettings
from animegamer.eval.benchmark import BenchmarkError, BenchmarkGame
from animegamer.eval.games import GroundTruthGame, load_games
from animegamer.eval.harness import (
    LevelMeter,
    MetricTools,
    build_level_meter,
    match_clip,
    score_turn,
    training_clips,
)
from animegamer.eval.metrics import CLIPScorer, MetricRecord, MetricSettings, summarize
from animegamer.eval.report import csv_table, markdown_table, plot_per_turn
from animegamer.eval.systems import (
    GroundTruthSystem,
    MajorityClassSystem,
    RandomSystem,
    ReconstructionSystem,
    TurnOutput,
    majority_values,
)
from animegamer.states import ShotTags, StateValues, parse_tags
from tests.helpers.clips import make_clip_frames
from tests.helpers.eval_data import eval_overrides, make_spriteworld
from tests.helpers.llm_server import FakeChatServer

ROOT = Path(__file__).resolve().parents[1]
TINY_EVAL = ROOT / "configs" / "tiny" / "eval.yaml"
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_thread")]
JUDGED = {"overall": 6, "instruction_following": 7, "contextual_coherence": 5, "character_consistency": 8}


def _script(name):
    return import_module(f"scripts.{name}")


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_spriteworld(tmp_path_factory.mktemp("spriteworld"))


@pytest.fixture(scope="module")
def scorer(tiny_clip_config):
    return CLIPScorer.from_config(tiny_clip_config)


def _shot(level=3, social=0, entertainment=1, stamina=-1) -> ShotTags:
    return ShotTags("Qiqi", "run", "morning park", "quickly", StateValues(level, social, entertainment, stamina))


# --------------------------------------------------------------------------------------------
# End to end
# --------------------------------------------------------------------------------------------


def test_evaluate_end_to_end(world, tiny_clip_config, tiny_cogvideox_dir, tiny_mistral_dir, tmp_path, capsys):
    out = tmp_path / "eval"
    with FakeChatServer(lambda request: json.dumps(JUDGED)) as server:
        argv = ["--config", str(TINY_EVAL), "--quiet", f"output_dir={out}",
                *eval_overrides(world, tiny_clip_config, tiny_cogvideox_dir, tiny_mistral_dir),
                "systems=[animegamer,gc_baseline,random,majority]", "judge.backend.type=openai",
                f"judge.backend.base_url={server.base_url}", "judge.backend.model=judge", "judge.backend.retries=0"]
        result = _script("evaluate").main(argv)
        requests = list(server.requests)
    printed = capsys.readouterr().out

    # results.jsonl: one record per system, game and turn, plus one judge record per game of each rendering system
    rows = [MetricRecord.from_dict(json.loads(line)) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 * 2 * 3 + 2 * 2
    by_system = {s: [r for r in rows if r.system == s] for s in ("animegamer", "gc_baseline", "random", "majority")}
    games = sorted({r.game_id for r in rows})
    assert games == sorted(p.stem for p in (world / "games").glob("*.jsonl")) and len(games) == 2
    truth = {g.game_id: g for g in load_games(world / "games")}
    for name in ("animegamer", "gc_baseline"):
        turns = [r for r in by_system[name] if r.turn >= 0]
        assert [(r.game_id, r.turn) for r in turns] == [(g, t) for g in games for t in range(3)]
        for r in turns:
            v = r.values
            assert 0.0 < v["clip_i"] <= 1.0 + 1e-6 and -1.0 <= v["clip_t"] <= 1.0
            assert math.isfinite(v["psnr"]) and -1.0 < v["ssim"] < 1.0 and v["seconds"] > 0
            assert v["acc_f"] in (0.0, 1.0) and v["mae_f"] in (0.0, 1.0, 2.0, 3.0, 4.0)
            assert (v["mae_f"] == 0.0) == (v["acc_f"] == 1.0)
            assert "dreamsim" in r.missing and "dreamsim_path is empty" in r.missing["dreamsim"]
            assert r.settings.flow["levels"] == "measured" and "refitted by flow" in r.settings.flow["edges_from"]
            assert r.settings.flow["edges"] == sorted(r.settings.flow["edges"]) and len(r.settings.flow["edges"]) == 4
            assert r.settings.reference.startswith("ground-truth clip")
            # SpriteWorld turns: who is drawn, 0/1, the friend columns only on turns with a friend in view
            cast = truth[r.game_id].cast(r.turn)
            assert v["hero_on_screen"] in (0.0, 1.0)
            friend_keys = {"friend_named", "friend_remembered"} & set(v)
            assert friend_keys == ({"friend_named" if cast.named else "friend_remembered"} if cast.friend else set())
        judged = [r for r in by_system[name] if r.turn == -1]
        assert len(judged) == 2 and all(r.values["judge_overall"] == 6.0 for r in judged)
        assert len(list((out / "clips" / name / games[0]).glob("turn_*.mp4"))) == 3
    # the MLLM's state predictions are scored against the ground truth; the GC baseline predicts no state
    for r in by_system["animegamer"]:
        if r.turn >= 0:
            expected = truth[r.game_id].shots[r.turn].values
            assert 0.0 <= r.values["acc_s"] <= 1.0 and r.values["mae_s"] in (0.0, 1.0, 2.0)
            assert r.values["acc_level"] in (0.0, 1.0) and expected.motion_level in range(1, 6)
    assert all("acc_s" in r.missing for r in by_system["gc_baseline"] if r.turn >= 0)
    # state-only systems: predicted levels, no clip metrics, no judge
    majority = majority_values(training_clips(read_manifest(world / "clips.jsonl")))
    for r in by_system["majority"]:
        expected = truth[r.game_id].shots[r.turn].values
        assert r.values["mae_f"] == abs(majority.motion_level - expected.motion_level)
        assert r.settings.flow["levels"] == "predicted" and "clip_i" in r.missing
        assert r.missing["hero_on_screen"] == "the system renders no clip" and "hero_on_screen" not in r.values
    assert len(by_system["random"]) == 6

    # the main table: markdown with arrows, CSV with the means of the records
    table = (out / "table.md").read_text()
    assert table in printed
    header = ("| system | CLIP-I ↑ | DreamSim ↓ | CLIP-T ↑ | ACC-F ↑ | MAE-F ↓ | ACC-S ↑ | MAE-S ↓ | PSNR ↑ | SSIM ↑ "
              "| s/turn ↓ | Friend-N ↑ | Friend-R ↑ | Hero ↑ | Overall ↑ | Instr. ↑ | Coher. ↑ | Char. ↑ |")
    assert header in table
    lines = [line for line in table.splitlines() if line.startswith("| ") and "system" not in line]
    assert [line.split(" | ")[0] for line in lines] == ["| animegamer", "| gc_baseline", "| random", "| majority"]
    assert lines[1].split(" | ")[6] == "–"  # gc_baseline ACC-S
    assert "DreamSim missing: no weights directory configured" in table
    table_rows = list(csv.reader((out / "table.csv").open()))
    assert table_rows[0][0] == "system" and table_rows[0][-1] == "turns" and len(table_rows) == 5
    ag = dict(zip(table_rows[0], table_rows[1], strict=True))
    clip_t = [r.values["clip_t"] for r in by_system["animegamer"] if r.turn >= 0]
    assert float(ag["CLIP-T ↑"]) == pytest.approx(sum(clip_t) / len(clip_t), abs=1e-12)
    assert ag["DreamSim ↓"] == "" and ag["turns"] == "6" and float(ag["Overall ↑"]) == 6.0
    assert result.summaries[0].means["clip_t"] == pytest.approx(float(ag["CLIP-T ↑"]))

    # the per-turn plot, and the judge saw 3 turns x 2 frames per game
    with Image.open(out / "per_turn.png") as image:
        assert image.format == "PNG" and image.width > 400 and image.height > 200
    assert len(requests) == 4
    assert all(json.dumps(req).count('"type": "image_url"') == 6 for req in requests)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["turns"] == 6 and set(summary["systems"]) == set(by_system)

    # intervals over the 2 games, and the paired differences of the first system against the others
    intervals = json.loads((out / "table_intervals.json").read_text())["rows"]
    cell = {(r["system"], r["split"], r["metric"]): r for r in intervals}
    psnr = [r.values["psnr"] for r in by_system["animegamer"] if r.turn >= 0]
    ag_psnr = cell[("animegamer", "all", "psnr")]
    assert ag_psnr["mean"] == pytest.approx(sum(psnr) / 6) and ag_psnr["turns"] == 6 and ag_psnr["games"] == 2
    assert ag_psnr["lower"] <= ag_psnr["mean"] <= ag_psnr["upper"]
    assert ("animegamer − gc_baseline", "all", "psnr") in cell and ("random", "all", "psnr") not in cell
    assert result.files["intervals_md"].read_text().startswith("# 2 games from")


def test_batched_rendering_scores_every_turn_as_one_by_one(world, tiny_clip_config, tiny_cogvideox_dir,
                                                           tiny_mistral_dir, tmp_path):
    """render_batch renders the clips of several games at once, each from its own seed: the records match the
    game-by-game evaluation up to float rounding; clip_games writes the first games' clips only."""
    from animegamer.config import EvalConfig, load_config
    from animegamer.eval.harness import evaluate

    common = [*eval_overrides(world, tiny_clip_config, tiny_cogvideox_dir, tiny_mistral_dir),
              "systems=[animegamer,gc_baseline,ground_truth]"]
    one = evaluate(load_config(TINY_EVAL, [*common, f"output_dir={tmp_path / 'one'}"], schema=EvalConfig), False)
    batched_dir = tmp_path / "batched"
    stale = batched_dir / "clips" / "animegamer" / "old_game" / "turn_000.mp4"  # an earlier evaluation's clip
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    batched = evaluate(load_config(TINY_EVAL, [*common, f"output_dir={batched_dir}", "render_batch=4",
                                               "clip_games=1"], schema=EvalConfig), False)
    for name in ("animegamer", "gc_baseline", "ground_truth"):
        a, b = one.records[name], batched.records[name]
        assert [(r.game_id, r.turn) for r in a] == [(r.game_id, r.turn) for r in b] and len(a) == 6
        for x, y in zip(a, b, strict=True):
            assert set(x.values) == set(y.values) and x.missing == y.missing
            for metric in x.values.keys() - {"seconds"}:
                assert y.values[metric] == pytest.approx(x.values[metric], rel=1e-3, abs=1e-3), (name, metric)
            assert y.values["seconds"] >= 0
    games = sorted({r.game_id for r in one.records["animegamer"]})
    for name in ("animegamer", "gc_baseline", "ground_truth"):
        written = sorted(p.relative_to(batched_dir / "clips" / name).as_posix()
                         for p in (batched_dir / "clips" / name).rglob("*.mp4"))
        assert written == [f"{games[0]}/turn_{t:03d}.mp4" for t in range(3)]
        assert len(list((tmp_path / "one" / "clips" / name).rglob("turn_*.mp4"))) == 6  # default: every game
    with pytest.raises(ValueError, match="render_batch=0"):
        evaluate(load_config(TINY_EVAL, [*common, f"output_dir={tmp_path / 'bad'}", "render_batch=0"],
                             schema=EvalConfig), False)


def test_evaluate_rejects_unknown_systems_and_missing_benchmarks(tmp_path, world, capsys):
    script = _script("evaluate")
    with pytest.raises(SystemExit):
        script.main(["--config", str(TINY_EVAL), f"output_dir={tmp_path}", f"benchmark={world / 'games'}",
                     "systems=[animegamer,dalle]"])
    assert "dalle" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        script.main(["--config", str(TINY_EVAL), f"output_dir={tmp_path}", f"benchmark={tmp_path}",
                     "systems=[random]"])
    err = capsys.readouterr().err
    assert "neither a benchmark" in err and str(tmp_path) in err


# --------------------------------------------------------------------------------------------
# Games
# --------------------------------------------------------------------------------------------


def test_games_from_a_games_dir_and_a_manifest(world):
    games = load_games(world / "games")
    assert len(games) == 2 and all(isinstance(g, GroundTruthGame) and g.has_clips() and len(g) == 3 for g in games)
    first = games[0]
    assert first.clip_frames(0).shape == (9, 48, 64, 3)
    assert [i.render() for i in first.instructions] == \
        [line for line in (world / "games" / f"{first.game_id}.txt").read_text().splitlines() if line[:1] != "#"]
    from_manifest = load_games(world / "clips.jsonl")
    assert [g.shots for g in from_manifest] == [g.shots for g in games]  # the same test films, the same turns
    assert from_manifest[0].clip_frames(2).shape == (9, 48, 64, 3)
    assert len(load_games(world / "games", max_games=1)) == 1


def test_match_clip_resamples_time_and_space():
    real = make_clip_frames(17, 64, 96, speed=2.0)
    matched = match_clip(real, np.zeros((9, 48, 64, 3), np.uint8))
    assert matched.shape == (9, 48, 64, 3) and matched.dtype == np.uint8
    again = match_clip(real[::2], real[::2])  # already matching: unchanged
    assert np.array_equal(again, real[::2])


# --------------------------------------------------------------------------------------------
# Scoring one turn
# --------------------------------------------------------------------------------------------


def test_score_turn_on_known_inputs(scorer):
    clip = make_clip_frames(9, 48, 64, speed=3.0)
    truth = _shot(level=5, social=1, entertainment=1, stamina=1)
    tools = MetricTools(clip=scorer, dreamsim_reason="DreamSim: not installed", reference="truth")
    predicted = StateValues(motion_level=3, social=1, entertainment=0, stamina=-1)
    values, missing = score_turn(TurnOutput("run", predicted, clip, 3, 0.5), truth, clip, None, tools)
    assert values["clip_i"] == pytest.approx(1.0, abs=1e-5)  # the same clip as its ground truth
    assert values["psnr"] == math.inf and values["ssim"] == pytest.approx(1.0)
    assert values["acc_f"] == 0.0 and values["mae_f"] == 2.0  # no meter: the predicted level 3 vs 5
    assert values["acc_s"] == pytest.approx(1 / 3) and values["mae_s"] == 2.0 and values["acc_level"] == 0.0
    assert missing == {"dreamsim": "DreamSim: not installed"}

    still = np.repeat(clip[:1], 9, axis=0)
    meter = LevelMeter(MotionSettings(), [0.2, 0.5, 0.8, 1.2], {"levels": "measured"})  # DIS: 1.48 at 3 px/frame
    tools.meter = meter
    values, missing = score_turn(TurnOutput("run", None, still, 5, 0.1), truth, clip, None, tools)
    assert values["acc_f"] == 0.0 and values["mae_f"] == 4.0  # measured: a still clip is level 1, not the asked 5
    assert values["psnr"] < 40 and "acc_s" in missing
    values, _ = score_turn(TurnOutput("run", None, clip, 1, 0.1), truth, clip, None, tools)
    assert values["acc_f"] == 1.0  # 3 px/frame is level 5 with these edges, whatever level was asked

    references = np.stack([clip[0], clip[4]])
    tools.reference = "characters"
    values, missing = score_turn(TurnOutput("run", None, clip, 5, 0.1), truth, None, references, tools)
    assert values["clip_i"] == pytest.approx(scorer.clip_i(clip, references, pairing="all"))
    assert "psnr" in missing and "clip_i" not in missing
    values, missing = score_turn(TurnOutput("run", predicted, None, 3, 0.0), truth, None, None, tools)
    assert "clip_i" in missing and "clip_t" in missing and values["mae_f"] == 2.0


def test_level_meter_from_flow_meta_and_refitted(world, tmp_path):
    refit = build_level_meter(read_manifest(world / "clips.jsonl"), calibration_clips=64, progress=False)
    assert "refitted by flow on 6 training clips" in refit.info["edges_from"]
    assert len(refit.edges) == 4 and refit.edges == sorted(refit.edges) and refit.info["method"] == "dis"
    assert refit.level(np.repeat(make_clip_frames(9, 48, 64)[:1], 9, axis=0)) == 1
    assert refit.level(make_clip_frames(9, 48, 64, speed=6.0)) == 5

    meta = {"motion": {**MotionSettings(height=48, width=64, fps=8.0).to_meta(), "edges": [0.1, 0.2, 0.3, 0.4]}}
    record = ClipRecord("f_00000", "clips/a.mp4", "f", 0, 0.0, 2.0)
    manifest = read_manifest(write_manifest(tmp_path / "clips.jsonl", [record], meta))
    meter = build_level_meter(manifest, progress=False)
    assert meter.edges == [0.1, 0.2, 0.3, 0.4] and meter.info["edges_from"] == "manifest meta"
    with pytest.raises(ValueError, match="no 'motion' settings"):
        build_level_meter(read_manifest(write_manifest(tmp_path / "bare.jsonl", [record], {})), progress=False)


# --------------------------------------------------------------------------------------------
# Systems without models
# --------------------------------------------------------------------------------------------


def _game(game_id: str, turns: int = 4) -> BenchmarkGame:
    return BenchmarkGame(game_id, "Qiqi", tuple(_shot() for _ in range(turns)), Path(game_id))


def test_random_and_majority_systems():
    system = RandomSystem(seed=1)
    a, b = system.play_game(_game("g1", 20), "unused"), system.play_game(_game("g1", 20), "unused")
    assert [o.values for o in a] == [o.values for o in b]  # seeded per game
    assert [o.values for o in a] != [o.values for o in system.play_game(_game("g2", 20), "unused")]
    assert all(o.frames is None and o.motion_level == o.values.motion_level for o in a)
    assert len({o.values.motion_level for o in a}) > 2  # it really draws

    tags = "<S>Q</S><MD>m</MD><EV>e</EV><ML>{}</ML><MA></MA><SC>{}</SC><ET>1</ET><ST>{}</ST>"
    records = [ClipRecord(f"f_{i:05d}", "v.mp4", "f", i, i, i + 1, tags=tags.format(level, social, stamina))
               for i, (level, social, stamina) in enumerate([(2, 0, 1), (4, 1, 1), (4, 1, -1), (2, 0, 0)])]
    records.append(ClipRecord("f_00009", "v.mp4", "f", 9, 9, 10))  # untagged: ignored
    assert majority_values(records) == StateValues(2, 0, 1, 1)  # ties go to the smaller value
    outputs = MajorityClassSystem(majority_values(records)).play_game(_game("g"), "unused")
    assert [o.values for o in outputs] == [StateValues(2, 0, 1, 1)] * 4
    with pytest.raises(ValueError, match="no tagged clips"):
        majority_values(records[-1:])
    with pytest.raises(ValueError, match="ground-truth clips"):
        ReconstructionSystem(None, None).play_game(_game("g"), "unused")


def test_ground_truth_system_is_the_ceiling(world, scorer, tmp_path):
    game = load_games(world / "games", max_games=1)[0]
    outputs = GroundTruthSystem(24, 32, fps=8).play_game(game, tmp_path / "clips")
    assert len(outputs) == len(game)
    meter = build_level_meter(read_manifest(world / "clips.jsonl"), progress=False)
    tools = MetricTools(clip=scorer, meter=meter, reference="truth")
    for turn, (output, shot) in enumerate(zip(outputs, game.shots, strict=True)):
        assert output.frames.shape == (9, 24, 32, 3) and output.frames.dtype == np.uint8  # sampling size
        assert output.values is None and output.motion_level == shot.values.motion_level and output.seconds == 0.0
        assert Path(output.clip).is_file()
        values, missing = score_turn(output, shot, game.clip_frames(turn), None, tools)
        assert values["clip_i"] > 0.99 and values["ssim"] > 0.9  # the real clip against itself, resized
        assert values["acc_f"] == float(meter.level(output.frames) == shot.values.motion_level)
        assert "acc_s" in missing
    with pytest.raises(ValueError, match="ground-truth clips"):
        GroundTruthSystem(32, 48, fps=8).play_game(_game("g"), "unused")


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def _records(system: str, clip_i: list[float], settings: MetricSettings, judge: float | None = None):
    records = [MetricRecord(system, "g", t, {"clip_i": v, "acc_f": 1.0, "seconds": 2.0},
                            {"dreamsim": "DreamSim: not installed"}, settings) for t, v in enumerate(clip_i)]
    if judge is not None:
        records.append(MetricRecord(system, "g", -1, {"judge_overall": judge}, {}, settings))
    return records


def test_report_table_and_plot(tmp_path):
    settings = MetricSettings(clip_model="ViT-X", reference="refs", flow={"levels": "predicted", "why": "test"})
    a, b = _records("a", [0.5, 0.7], settings), _records("b", [0.9, 0.3], settings)
    entries = [("A", summarize(a)), ("B", summarize(b))]
    table = markdown_table(entries, "T")
    assert table.startswith("# T\n")
    assert "| A | 0.600 | – | – | 1.000 | – | – | – | – | – | 2.00 |" in table
    assert "Overall" not in table  # no judge columns without judge scores
    assert "- DreamSim missing: not installed" in table  # shared by every row: no row names
    rows = list(csv.reader(csv_table(entries).splitlines()))
    assert rows[1][:2] == ["A", "0.6"] and rows[2][1] == "0.6" and rows[1][-1] == "2"
    judged = markdown_table([("A", summarize(_records("a", [0.5], settings, judge=7.0))), entries[1]])
    assert "Overall ↑" in judged and "| 7.00 |" in judged
    path = plot_per_turn({"a": a, "b": b}, tmp_path / "p.png")
    with Image.open(path) as image:
        assert image.format == "PNG"
    with pytest.raises(ValueError, match="no per-turn values"):
        plot_per_turn({"a": a}, tmp_path / "q.png", metrics=("ssim",))


def test_benchmark_errors_name_the_file(tmp_path):
    games = tmp_path / "games"
    games.mkdir()
    (games / "film.jsonl").write_text(json.dumps({"turn": 1, "tags": _shot().render()}) + "\n")
    with pytest.raises(BenchmarkError, match=r"film.jsonl:1: expected turn 0"):
        load_games(games)
    (games / "film.jsonl").write_text(json.dumps({"turn": 0, "tags": _shot().render()}) + "\n")
    game = load_games(games)[0]
    assert game.shots == (parse_tags(_shot().render()),) and not game.has_clips()
    assert game.caption(0) == _shot().motion_text()  # no caption: the tags' motion text
    (games / "film.jsonl").write_text(json.dumps({"turn": 0, "tags": _shot().render(), "caption": 3}) + "\n")
    with pytest.raises(BenchmarkError, match=r"film.jsonl:1: 'caption' must be a non-empty string"):
        load_games(games)
