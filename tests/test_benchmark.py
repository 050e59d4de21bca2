import base64
import io
import json
from importlib import import_module
from pathlib import Path

import numpy as np
import pytest

from animegamer.config import BenchmarkGenConfig, EvalConfig, JudgeConfig, load_config
from animegamer.eval.benchmark import (
    BenchmarkError,
    fill_template,
    generate_benchmark,
    load_benchmark,
    parse_story,
)
from animegamer.eval.judge import JudgeFormatError, JudgeScores, LLMJudge, parse_judgement, summarize_judgements
from animegamer.eval.metrics import MetricSettings, summarize
from animegamer.llm import make_backend
from animegamer.states import StateValues, TagError, read_game_file
from tests.helpers.llm_server import FakeChatServer

ROOT = Path(__file__).resolve().parents[1]
MOTIONS = ["wake up", "eat breakfast", "run", "fly over the trees", "talk with a friend", "read a book", "dance",
           "swim", "cook dinner", "lie down"]


def story_lines(character: str, variant: int = 0, turns: int = 10) -> list[str]:
    lines = []
    for t in range(turns):
        level, social, fun, stamina = 1 + (t + variant) % 5, t % 2, (t // 2) % 2, (t + variant) % 3 - 1
        lines.append(f"<S>{character}</S><MD>{MOTIONS[t]}</MD><EV>park {variant}</EV><ML>{level}</ML><MA>gently</MA>"
                     f"<SC>{social}</SC><ET>{fun}</ET><ST>{stamina}</ST>")
    return lines


def story(character: str, variant: int = 0) -> str:
    return "\n".join(story_lines(character, variant))


def test_parse_story_accepts_valid_and_rejects_malformed():
    shots = parse_story(story("qiqi"), "Qiqi", 10)  # subject compared case-insensitively, stored as given
    assert len(shots) == 10 and all(s.subject == "Qiqi" for s in shots)
    assert shots[2].values == StateValues(3, 0, 1, 1)
    assert shots[0].instruction().render() == "Character: Qiqi; Motion: gently wake up; Background: park 0."
    fenced = "```\n" + story("Qiqi").replace("\n", "\n\n") + "\n```"
    assert parse_story(fenced, "Qiqi", 10) == parse_story(story("Qiqi"), "Qiqi", 10)
    lines = story_lines("Qiqi")
    bad = {
        "expected exactly 10 tag lines, got 9": "\n".join(lines[:9]),
        "answer:4: field 'motion_level': 7 is not one of": "\n".join(lines).replace("<ML>4</ML>", "<ML>7</ML>", 1),
        "answer:1: field 'subject': 'Sam' is not the character 'Qiqi'": story("Sam"),
        "answer:1: text outside tags": "\n".join(f"{i}. {line}" for i, line in enumerate(lines, 1)),
        "answer:3: field 'motion': does not make a valid instruction": "\n".join(lines).replace("run", "run; jump"),
        "answer:2: field 'stamina': missing tag <ST>": "\n".join(lines).replace("<ST>0</ST>", "", 1),
    }
    for needle, answer in bad.items():
        with pytest.raises((TagError, BenchmarkError), match=needle.replace("(", r"\(")):
            parse_story(answer, "Qiqi", 10)


def _config(tmp_path: Path, server: FakeChatServer, **overrides) -> BenchmarkGenConfig:
    cfg = BenchmarkGenConfig(output_dir=str(tmp_path / "bench"), characters=["Qiqi", "Sam"], games_per_character=2,
                             backend={"type": "openai", "base_url": server.base_url, "model": "writer",
                                      "retries": 0, "api_key": "secret"})
    for key, value in overrides.items():
        setattr(cfg, key, value)
    return cfg


def test_generation_rejects_malformed_answers_retries_and_stores(tmp_path):
    answers = [
        "\n".join(story_lines("Qiqi")[:9]),  # qiqi_000: wrong line count
        story("Qiqi", 0),  # qiqi_000: valid
        story("Qiqi", 1).replace("<ML>2</ML>", "<ML>9</ML>", 1),  # qiqi_001: bad tag value
        story("Qiqi", 0),  # qiqi_001: repeats qiqi_000
        story("Qiqi", 1),  # qiqi_001: valid
        story("Qiqi", 2), story("Qiqi", 3), story("Qiqi", 4),  # sam_000: another character, three times -> failed
        "```\n" + story("Sam", 1) + "\n```",  # sam_001: valid inside a code fence
    ]
    with FakeChatServer(answers) as server:
        report = generate_benchmark(_config(tmp_path, server), progress=False)
        requests = server.requests
    assert report.stored == ["qiqi_000", "qiqi_001", "sam_001"]
    assert report.rejected_answers == 6 and list(report.failed) == ["sam_000"]
    assert len(report.failed["sam_000"]) == 3 and all("'Qiqi' is not the character 'Sam'" in e
                                                      for e in report.failed["sam_000"])
    assert len(requests) == 9 and not answers
    # the first request is the filled template; a retry carries the rejected answer and the reason
    first = requests[0]["messages"]
    assert [m["role"] for m in first] == ["system", "user"] and requests[0]["model"] == "writer"
    assert "for the anime character Qiqi: 10 turns" in first[1]["content"] and "{" not in first[1]["content"]
    retry = requests[1]["messages"]
    assert [m["role"] for m in retry] == ["system", "user", "assistant", "user"]
    assert "expected exactly 10 tag lines, got 9" in retry[3]["content"]
    assert "the same story as game qiqi_000" in requests[4]["messages"][-1]["content"]

    root = tmp_path / "bench"
    index = json.loads((root / "benchmark.json").read_text())
    assert "secret" not in json.dumps(index) and index["generator"]["backend"]["model"] == "writer"
    assert [g["attempts"] for g in index["games"]] == [2, 3, 1]
    assert list(index["failed"]) == ["sam_000"] and not (root / "sam_000").exists()
    games = load_benchmark(root)
    assert [g.game_id for g in games] == ["qiqi_000", "qiqi_001", "sam_001"]
    assert [g.character for g in games] == ["Qiqi", "Qiqi", "Sam"]
    assert games[1].shots == tuple(parse_story(story("Qiqi", 1), "Qiqi", 10))
    assert games[2].values[0] == StateValues(2, 0, 0, 0)
    assert read_game_file(str(root / "qiqi_000" / "game.txt")) == games[0].instructions
    assert len(load_benchmark(root, max_games=1)) == 1

    # a rerun keeps the stored games and only retries the failed one; the script reports success
    script = import_module("scripts.make_benchmark")
    with FakeChatServer([story("Sam", 0)]) as server:
        argv = ["--config", str(ROOT / "configs" / "benchmark_gen.yaml"), f"output_dir={root}",
                "characters=[Qiqi,Sam]", "games_per_character=2", f"backend.base_url={server.base_url}"]
        assert script.main(argv) == 0
        assert len(server.requests) == 1
    index = json.loads((root / "benchmark.json").read_text())
    assert [g["game_id"] for g in index["games"]] == ["qiqi_000", "qiqi_001", "sam_000", "sam_001"]
    assert index["failed"] == {}
    assert [g.game_id for g in load_benchmark(root)] == ["qiqi_000", "qiqi_001", "sam_000", "sam_001"]

    # a run whose games all fail exits with status 1 and stores nothing new
    with FakeChatServer(lambda body: "no tags here") as server:
        argv = ["--config", str(ROOT / "configs" / "benchmark_gen.yaml"), f"output_dir={root}",
                "characters=[Mia]", "games_per_character=1", "max_attempts=2", f"backend.base_url={server.base_url}"]
        assert script.main(argv) == 1
        assert len(server.requests) == 2
    assert "mia_000" in json.loads((root / "benchmark.json").read_text())["failed"]


def test_loader_rejects_corrupt_files(tmp_path):
    with pytest.raises(BenchmarkError, match="benchmark index not found"):
        load_benchmark(tmp_path)
    with FakeChatServer([story("Qiqi")]) as server:
        generate_benchmark(_config(tmp_path, server, characters=["Qiqi"], games_per_character=1), progress=False)
    root = tmp_path / "bench"
    truth = root / "qiqi_000" / "ground_truth.jsonl"
    good = truth.read_text()
    truth.write_text(good.replace("<ML>3</ML>", "<ML>9</ML>", 1))
    with pytest.raises(TagError, match=r"ground_truth.jsonl:3: field 'motion_level'"):
        load_benchmark(root)
    truth.write_text(good.replace('"motion_level": 3', '"motion_level": 4', 1))
    with pytest.raises(BenchmarkError, match="ground_truth.jsonl:3: fields or turn disagree"):
        load_benchmark(root)
    truth.write_text(good)
    game = root / "qiqi_000" / "game.txt"
    game.write_text(game.read_text().replace("Motion: gently run", "Motion: gently walk"))
    with pytest.raises(BenchmarkError, match="turn 3 .* does not match its ground truth"):
        load_benchmark(root)
    with pytest.raises(BenchmarkError, match="cannot be used"):
        generate_benchmark(BenchmarkGenConfig(output_dir=str(root), characters=["A;B"]), backend=object())


def test_configs_and_templates():
    cfg = load_config(ROOT / "configs" / "benchmark_gen.yaml")
    assert isinstance(cfg, BenchmarkGenConfig) and cfg.turns == 10 and cfg.characters
    filled = fill_template(cfg.prompt, character="Qiqi", turns=10, number=3)
    assert "{character}" not in filled and "story 3" in filled and "<S>Qiqi</S>" in filled
    judge = load_config(None, ["judge.frames_per_turn=3"], schema=EvalConfig).judge
    assert isinstance(judge, JudgeConfig) and judge.frames_per_turn == 3 and not judge.backend
    # the JSON example in the judge prompt keeps its braces
    assert '{"overall": 6' in fill_template(judge.prompt, character="Qiqi")


VALID = '{"overall": 7, "instruction_following": 8, "contextual_coherence": 6, "character_consistency": 9}'


def test_parse_judgement_is_strict():
    assert parse_judgement(VALID) == JudgeScores(7, 8, 6, 9)
    assert parse_judgement("```json\n" + VALID + "\n```") == JudgeScores(7, 8, 6, 9)
    malformed = {
        "not a JSON object": "Overall: 7\nInstruction following: 8",
        "not a JSON object ": "Here are my scores: " + VALID,
        "expected a JSON object": "[7, 8, 6, 9]",
        "missing \\['character_consistency'\\]": VALID.replace(', "character_consistency": 9', ""),
        "unexpected \\['comment'\\]": VALID[:-1] + ', "comment": "nice"}',
        "overall=7.5": VALID.replace('"overall": 7', '"overall": 7.5'),
        "overall='7'": VALID.replace('"overall": 7', '"overall": "7"'),
        "overall=11": VALID.replace('"overall": 7', '"overall": 11'),
        "overall=0": VALID.replace('"overall": 7', '"overall": 0'),
        "overall=True": VALID.replace('"overall": 7', '"overall": true'),
        "unterminated code fence": "```json\n" + VALID,
    }
    for needle, answer in malformed.items():
        with pytest.raises(JudgeFormatError, match=needle.strip()):
            parse_judgement(answer)


def _decode_png(url: str) -> tuple[int, int]:
    from PIL import Image

    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1]))).size


def test_judge_retries_then_scores_or_fails():
    rng = np.random.default_rng(0)
    clips = [rng.integers(0, 256, (9, 40, 48, 3), dtype=np.uint8) for _ in range(3)]
    instructions = [f"Character: Qiqi; Motion: {m}; Background: park." for m in MOTIONS[:3]]
    references = rng.integers(0, 256, (1, 40, 48, 3), dtype=np.uint8)
    answers = ["Overall: 7", VALID, "7/10", "{}", "{\"overall\": 5}"]
    with FakeChatServer(answers) as server:
        backend = make_backend({"type": "openai", "base_url": server.base_url, "retries": 0})
        judge = LLMJudge.from_config(JudgeConfig(max_image_side=24, frames_per_turn=2), backend=backend)
        good = judge.judge("qiqi_000", "Qiqi", instructions, clips, references=references)
        bad = judge.judge("qiqi_001", "Qiqi", instructions, clips)
        requests = server.requests
    assert good.scores == JudgeScores(7, 8, 6, 9) and good.attempts == 2 and len(good.errors) == 1
    assert bad.failed and bad.attempts == 3 and len(bad.errors) == 3
    first = requests[0]["messages"][-1]["content"]
    text, images = first[0]["text"], first[1:]
    assert len(images) == 1 + 3 * 2  # the reference, then two frames per turn
    assert _decode_png(images[0]["image_url"]["url"]) == (24, 20)  # downscaled to 24 px on the long side
    assert "Images 1-1 show Qiqi as a reference." in text
    assert "Turn 1 (images 2-3): Character: Qiqi; Motion: wake up; Background: park." in text
    assert "Turn 3 (images 6-7)" in text and "{instructions}" not in text
    retry_text = requests[1]["messages"][-1]["content"][0]["text"]
    assert retry_text.startswith(text) and "rejected: not a JSON object" in retry_text
    with pytest.raises(ValueError, match="one clip per instruction"):
        judge.build_request("Qiqi", instructions, clips[:2])

    settings = MetricSettings(clip_model="tiny")
    records = [good.to_record("animegamer", settings), bad.to_record("animegamer", settings)]
    summary = summarize(records)
    assert summary.means["judge_overall"] == 7.0 and summary.counts["judge_overall"] == 1
    assert records[1].values["judge_overall"] is None and "judge failed after 3 answers" in records[1].missing[
        "judge_overall"]
    assert summarize_judgements([good, bad]) == {"overall": 7.0, "instruction_following": 8.0,
                                                 "contextual_coherence": 6.0, "character_consistency": 9.0,
                                                 "judged": 1, "failed": 1}
