import json
from dataclasses import replace

import numpy as np
import pytest
from PIL import Image

from animegamer.config import CaptionConfig
from animegamer.data.captioning import (
    Captioner,
    CaptionInvalid,
    caption_records,
    check_templates,
    parse_characters,
    parse_description,
)
from animegamer.data.characters import RegistryError, read_character_registry
from animegamer.data.manifest import ClipRecord
from animegamer.data.video import write_mp4
from animegamer.llm import OpenAICompatibleBackend
from animegamer.states import TagError, parse_instruction, parse_tags
from tests.helpers.llm_server import FakeChatServer
from tests.helpers.synthetic_films import moving_patch_frames

GOOD = "<S>Qiqi</S><MD>run</MD><EV>park</EV><MA>quickly</MA><SC>0</SC><ET>1</ET><ST>-1</ST>"


def write_registry(tmp_path, data=None):
    refs = tmp_path / "refs"
    refs.mkdir(exist_ok=True)
    for name, color in (("qiqi_a", (250, 120, 120)), ("qiqi_b", (240, 100, 90)), ("sora", (90, 120, 250))):
        Image.new("RGB", (40, 30), color).save(refs / f"{name}.png")
    data = data or {"Qiqi": ["refs/qiqi_a.png", "refs/qiqi_b.png"], "Sora": "refs/sora.png"}
    (tmp_path / "characters.json").write_text(json.dumps(data))
    return tmp_path / "characters.json"


def test_registry_reads_and_validates(tmp_path):
    registry = read_character_registry(write_registry(tmp_path))
    assert registry.names == ["Qiqi", "Sora"]
    assert registry.canonical(" qiqi ") == "Qiqi" and registry.canonical("Momo") is None
    images = registry.load_images("Qiqi", max_side=20)
    assert len(images) == 2 and images[0].shape == (15, 20, 3) and images[0].dtype == np.uint8
    instruction = registry.check_instruction(parse_instruction("Character: sora; Motion: wave; Background: beach."))
    assert instruction.character == "Sora"
    with pytest.raises(TagError, match="unknown character 'Momo'"):
        registry.check_instruction(parse_instruction("Character: Momo; Motion: wave; Background: beach."))

    bad_cases = [
        ({"Qiqi": ["refs/missing.png"]}, "not found"),
        ({"Qi;qi": ["refs/qiqi_a.png"]}, "Qi;qi"),
        ({"Qiqi": ["refs/qiqi_a.png"], "QIQI": ["refs/sora.png"]}, "case-insensitive"),
        ({"Qiqi": []}, "non-empty list"),
        (["Qiqi"], "JSON object"),
    ]
    for data, message in bad_cases:
        with pytest.raises(RegistryError, match=message):
            read_character_registry(write_registry(tmp_path, data))
    (tmp_path / "refs" / "broken.png").write_bytes(b"not a png")
    with pytest.raises(RegistryError, match="cannot be decoded"):
        read_character_registry(write_registry(tmp_path, {"Qiqi": ["refs/broken.png"]}))
    (tmp_path / "bad.json").write_text("{oops")
    with pytest.raises(RegistryError, match="bad.json.*not valid JSON"):
        read_character_registry(tmp_path / "bad.json")


def test_parse_answers(tmp_path):
    registry = read_character_registry(write_registry(tmp_path))
    assert parse_characters("They are <C>sora, Qiqi, Sora</C>.", registry) == ["Sora", "Qiqi"]
    assert parse_characters("<C>none</C>", registry) == []
    for answer, message in (("Qiqi", "exactly one"), ("<C>Momo</C>", "Momo"), ("<C>Qiqi,</C>", "empty name")):
        with pytest.raises(CaptionInvalid, match=message):
            parse_characters(answer, registry)

    tags = parse_description(f"Here it is:\n{GOOD.replace('</EV>', '</EV><ML>5</ML>')}\nHope this helps", 2)
    assert tags.values.motion_level == 2  # the computed level wins over the model's
    assert tags.render() == parse_tags(GOOD.replace("</EV>", "</EV><ML>2</ML>")).render()
    for answer, message in (
        ("no tags at all", "no tags"),
        (GOOD.replace("<SC>0</SC>", ""), "missing tag <SC>"),
        (GOOD.replace("<SC>0</SC>", "<SC>2</SC>"), "social"),
        (GOOD.replace("</MD>", "</MD> and "), "outside tags"),
        (GOOD + GOOD, "twice"),
    ):
        with pytest.raises(CaptionInvalid, match=message):
            parse_description(answer, 3, source="clip7")


def test_templates_are_checked():
    check_templates(CaptionConfig())
    with pytest.raises(ValueError, match="captioner.describe_prompt.*speed"):
        check_templates(replace(CaptionConfig(), describe_prompt="level {speed}"))


def test_captioning_against_a_loopback_server_retries_and_marks_the_hopeless_clip(tmp_path):
    registry = read_character_registry(write_registry(tmp_path))
    records = []
    for i, level in enumerate((4, 2, 3)):
        video = f"clips/f/{i:05d}.mp4"
        write_mp4(tmp_path / video, moving_patch_frames(17, 48, 64, 1.0 + i), fps=8)
        records.append(ClipRecord(f"f_{i:05d}", video, "f", i, 2.0 * i, 2.0 * i + 2, motion_level=level))
    records.append(ClipRecord("f_00003", "clips/f/00003.mp4", "f", 3, 6.0, 8.0))  # no motion level: not captioned
    answers = [
        # clip 0: both steps right the first time, chatter around the tags
        "<C>Qiqi</C>",
        f"Sure! {GOOD}",
        # clip 1: a malformed character answer, then a bad value in the description, then fixed
        "I can see Qiqi.",
        "<C>none</C>",
        "<S>Girl</S><MD>sit</MD><EV>room</EV><MA>calmly</MA><SC>2</SC><ET>0</ET><ST>0</ST>",
        "<S>Girl</S><MD>sit</MD><EV>room</EV><MA>calmly</MA><SC>1</SC><ET>0</ET><ST>0</ST>",
        # clip 2: characters found, but the description never becomes valid
        "<C>Qiqi, Sora</C>",
        "Qiqi runs in the park.",
        "<S>Qiqi</S><MD>run</MD>",
        "<S>Qiqi</S><MD>run</MD><EV>park</EV><MA>fast</MA><SC>0</SC><ET>1</ET><ST>+2</ST>",
    ]
    cfg = CaptionConfig(backend={}, max_attempts=3, workers=1, num_frames=8)
    with FakeChatServer(answers) as server:
        backend = OpenAICompatibleBackend(server.base_url, model="vlm", retries=0)
        captioner = Captioner(cfg, backend, registry)
        seen = []
        counts = caption_records(captioner, records, tmp_path, workers=1, on_result=lambda r, res, e: seen.append(r))
    assert counts == {"ok": 2, "invalid": 1, "failed": 0}
    assert answers == [] and len(server.requests) == 10 and len(seen) == 3

    first, second, third, untouched = records
    assert first.caption_status == "ok" and first.extra["characters"] == ["Qiqi"]
    assert first.tags == GOOD.replace("</EV>", "</EV><ML>4</ML>")
    assert second.caption_status == "ok" and second.extra["characters"] == []
    assert parse_tags(second.tags).values.motion_level == 2 and parse_tags(second.tags).values.social == 1
    assert third.caption_status == "invalid" and third.tags is None  # kept, never guessed
    assert third.extra["characters"] == ["Qiqi", "Sora"] and "stamina" in third.extra["caption_error"]
    assert untouched.caption_status == "" and untouched.tags is None

    step1, step2 = server.requests[0], server.requests[1]
    assert step1["model"] == "vlm" and step1["messages"][0]["role"] == "system"
    parts = step1["messages"][-1]["content"]
    assert len([p for p in parts if p["type"] == "image_url"]) == 3 + 8  # 3 reference images, then 8 frames
    assert "images 1-2: Qiqi; image 3: Sora" in parts[0]["text"]
    prompt2 = step2["messages"][-1]["content"][0]["text"]
    assert "motion level is 4" in prompt2 and "Known characters in the clip: Qiqi." in prompt2
    assert len(step2["messages"][-1]["content"]) == 1 + 8
    retry = server.requests[3]["messages"][-1]["content"][0]["text"]  # clip 1, second try of step 1
    assert "not valid: expected exactly one <C>...</C>" in retry
    retry = server.requests[5]["messages"][-1]["content"][0]["text"]
    assert "not valid" in retry and "social" in retry


def test_backend_failure_leaves_the_clip_for_the_next_run(tmp_path):
    write_mp4(tmp_path / "c.mp4", moving_patch_frames(5, 48, 64, 1.0), fps=8)
    record = ClipRecord("c", "c.mp4", "f", 0, 0.0, 2.0, motion_level=3)
    captioner = Captioner(CaptionConfig(), OpenAICompatibleBackend("http://127.0.0.1:9/v1", retries=0, timeout=2))
    errors = []
    counts = caption_records(captioner, [record], tmp_path, on_result=lambda r, res, e: errors.append(e))
    assert counts == {"ok": 0, "invalid": 0, "failed": 1}
    assert record.caption_status == "" and "127.0.0.1:9" in errors[0]
    with pytest.raises(ValueError, match="captioner.backend is empty"):
        Captioner.from_config(CaptionConfig())
