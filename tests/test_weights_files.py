"""Checkpoint files that are not what they claim (animegamer.models.weights, AnimeGamerMLLM.load_trained): a named
pipe, a device, a link to itself, a damaged layout. Each is one line naming the file, never a hang, a read without
end or a library's traceback."""

import json
import os
import stat

import pytest
import torch

from animegamer.config import MLLMConfig
from animegamer.data.manifest import ManifestError, read_manifest
from animegamer.models.mllm import LAYOUT_FILE, AnimeGamerMLLM
from animegamer.models.weights import DamagedFileError, check_safetensors, load_state_dict_file, save_state_dict_file
from animegamer.official.release_io import ReleaseFileError, load_release_pickle, read_release_yaml

ROOT_USER = os.geteuid() == 0


def not_a_file(path, kind: str) -> str:
    """Put a ``kind`` thing at ``path``; returns the words the refusal must hold."""
    if kind == "pipe":
        os.mkfifo(path)
        return "named pipe"
    if kind == "device":
        if ROOT_USER:  # a real device node, as a file someone handed over could be
            os.mknod(path, stat.S_IFCHR | 0o644, os.makedev(1, 5))  # /dev/zero: reads without end
        else:
            os.symlink("/dev/zero", path)
        return "character device"
    if kind == "self link":
        os.symlink(path.name, path)
        return "symbolic links"
    path.mkdir()
    return "a directory"


KINDS = ["pipe", "device", "self link", "directory"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["model.safetensors", "model.bin"])
def test_weights_that_are_not_a_regular_file_are_one_line(tmp_path, kind, name):
    path = tmp_path / name
    words = not_a_file(path, kind)
    for load in (load_state_dict_file, check_safetensors):
        with pytest.raises(ValueError, match=words) as exc:
            load(path)
        assert str(exc.value).startswith(str(path)) and "\n" not in str(exc.value)


def test_a_safetensors_header_past_its_bound_is_damaged(tmp_path):
    path = tmp_path / "big_header.safetensors"
    with open(path, "wb") as fh:  # a header length of 2 GB over a small file: never read
        fh.write((2 << 30).to_bytes(8, "little") + b"{}" * 10)
    with pytest.raises(DamagedFileError, match="no complete header"):
        load_state_dict_file(path)
    save_state_dict_file({"w": torch.ones(2)}, tmp_path / "ok.safetensors")
    assert torch.equal(load_state_dict_file(tmp_path / "ok.safetensors")["w"], torch.ones(2))


@pytest.mark.parametrize("kind", KINDS)
def test_manifests_that_are_not_a_regular_file_are_one_line(tmp_path, kind):
    path = tmp_path / "clips.jsonl"
    words = not_a_file(path, kind)
    with pytest.raises(ManifestError, match=words):
        read_manifest(path)


def test_a_manifest_meta_that_is_a_pipe_or_damaged_is_one_line(tmp_path):
    (tmp_path / "clips.jsonl").write_text(json.dumps({"clip_id": "a_00000", "video": "a.mp4", "film_id": "a",
                                                      "clip_index": 0, "start": 0.0, "end": 2.0}) + "\n")
    os.mkfifo(tmp_path / "clips.meta.json")
    with pytest.raises(ValueError, match="named pipe"):
        read_manifest(tmp_path / "clips.jsonl")
    os.unlink(tmp_path / "clips.meta.json")
    (tmp_path / "clips.meta.json").write_text('{"edges": [1, 2')
    with pytest.raises(ValueError, match=r"clips.meta.json: not valid JSON"):
        read_manifest(tmp_path / "clips.jsonl")


@pytest.fixture
def checkpoint(tmp_path, tiny_mistral_dir, one_thread):
    cfg = MLLMConfig(pretrained=str(tiny_mistral_dir), num_slots=8, shot_dim=16, lora_rank=4, lora_alpha=8,
                     lora_dropout=0.0, gradient_checkpointing=False, dtype="fp32")
    model = AnimeGamerMLLM.from_config(cfg)
    return model, model.save_trained(tmp_path / "ckpt")


@pytest.mark.parametrize("damage", ["cut short", "not an object", "not UTF-8", "a pipe", "a huge number"])
def test_a_damaged_layout_names_its_file(checkpoint, damage):
    model, out = checkpoint
    layout = out / LAYOUT_FILE
    text = layout.read_text()
    if damage == "cut short":
        layout.write_text(text[: len(text) // 2])
    elif damage == "not an object":
        layout.write_text("[1, 2, 3]")
    elif damage == "not UTF-8":
        layout.write_bytes(b'{"vocabulary": "\xff"}')
    elif damage == "a pipe":  # never opened (it would block): refused by what it is
        layout.unlink()
        os.mkfifo(layout)
    else:
        record = json.dumps({**json.loads(text), "num_slots": 0})
        layout.write_text(record.replace('"num_slots": 0', '"num_slots": 1' + "0" * 5000))  # past Python's 4300 digits
    with pytest.raises(ValueError) as exc:
        model.load_trained(out)
    message = str(exc.value)
    assert str(layout) in message and "\n" not in message and len(message) < 600, message


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["agent.pt", "config.yaml"])
def test_release_files_that_are_not_a_regular_file_are_one_line(tmp_path, kind, name):
    path = tmp_path / name
    words = not_a_file(path, kind)
    with pytest.raises(ReleaseFileError, match=words) as exc:
        load_release_pickle(path) if name.endswith(".pt") else read_release_yaml(path, "the release config")
    assert str(exc.value).startswith(str(path)) and "\n" not in str(exc.value)


def test_adapter_configs_list_their_target_modules_sorted(tmp_path):
    """peft writes target_modules as a set (its order follows string hashing): saved sorted, two equal LoRAs write
    the same adapter_config.json; every other key is kept."""
    import json

    from peft import LoraConfig

    from animegamer.models.weights import sort_adapter_targets

    targets = ["to_v", "norm1.linear", "to_out.0", "to_q", "norm_out.linear", "to_k"]
    LoraConfig(r=4, lora_alpha=4, target_modules=targets).save_pretrained(str(tmp_path))
    before = json.loads((tmp_path / "adapter_config.json").read_text())
    sort_adapter_targets(tmp_path)
    after = json.loads((tmp_path / "adapter_config.json").read_text())
    assert after["target_modules"] == sorted(targets)
    assert {k: v for k, v in after.items() if k != "target_modules"} == \
        {k: v for k, v in before.items() if k != "target_modules"}
    text = (tmp_path / "adapter_config.json").read_text()
    sort_adapter_targets(tmp_path)
    assert (tmp_path / "adapter_config.json").read_text() == text  # stable
