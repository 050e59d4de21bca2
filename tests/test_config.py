from pathlib import Path

import pytest

from animegamer.config import SCHEMAS, ConfigError, StageAConfig, config_help, load_config, to_yaml

ROOT = Path(__file__).resolve().parents[1]
ALL_CONFIGS = sorted(p for p in (ROOT / "configs").rglob("*.yaml") if "accelerate" not in p.parts)


def test_there_are_configs():
    assert len(ALL_CONFIGS) >= 2


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_every_config_loads(path):
    cfg = load_config(path)
    assert type(cfg) is SCHEMAS[cfg.kind]
    assert cfg.output_dir


def test_accelerate_configs_are_yaml():
    import yaml

    files = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
    assert files
    for f in files:
        data = yaml.safe_load(f.read_text())
        assert "distributed_type" in data, f


def test_overrides_and_types(tmp_path):
    p = tmp_path / "a.yaml"
    p.write_text("kind: stage_a\noutput_dir: out\ntrain:\n  lr: 0.001\n")
    cfg = load_config(p, ["train.max_steps=7", "encoder.fusion=add", "decoder.lora_targets=[to_q,to_k]"])
    assert isinstance(cfg, StageAConfig)
    assert cfg.train.lr == 0.001 and cfg.train.max_steps == 7
    assert cfg.encoder.fusion == "add" and cfg.decoder.lora_targets == ["to_q", "to_k"]
    assert "fusion: add" in to_yaml(cfg)


def test_base_chain(tmp_path):
    (tmp_path / "base.yaml").write_text("kind: stage_a\noutput_dir: base\nwarmup_steps: 3\n")
    (tmp_path / "child.yaml").write_text("base: base.yaml\noutput_dir: child\n")
    cfg = load_config(tmp_path / "child.yaml")
    assert cfg.output_dir == "child" and cfg.warmup_steps == 3


@pytest.mark.parametrize(
    "body, overrides, needle",
    [
        ("kind: stage_a\nbogus: 1\n", [], "bogus"),
        ("kind: stage_a\ntrain:\n  nope: 1\n", [], "train.nope"),
        ("kind: stage_a\n", ["train.max_steps=many"], "train.max_steps"),
        ("kind: stage_a\n", ["encoder.fusion=multiply"], "encoder.fusion"),
        ("kind: stage_a\n", ["decoder.unknown=3"], "decoder.unknown"),
        ("kind: stage_a\n", ["noequals"], "key=value"),
        ("kind: nonsense\n", [], "kind"),
        ("output_dir: x\n", [], "kind"),
        ("- a\n- b\n", [], "mapping"),
    ],
)
def test_bad_configs_name_the_key(tmp_path, body, overrides, needle):
    p = tmp_path / "bad.yaml"
    p.write_text(body)
    with pytest.raises(ConfigError) as err:
        load_config(p, overrides)
    assert needle in str(err.value)


def test_wrong_kind_for_schema(tmp_path):
    p = tmp_path / "b.yaml"
    p.write_text("kind: stage_b\n")
    with pytest.raises(ConfigError, match="expects kind='stage_a'"):
        load_config(p, schema=StageAConfig)


def test_missing_file():
    with pytest.raises(ConfigError, match="not found"):
        load_config("does/not/exist.yaml")


def test_config_help_lists_nested_keys():
    text = config_help(StageAConfig)
    assert "train.lr=" in text and "encoder.fusion='concat'" in text


SECRET = "root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\nhunter2-token-9f8e7d\n"


@pytest.mark.parametrize(
    "content",
    [
        SECRET,  # /etc/passwd: one huge plain key
        "password: hunter2-token-9f8e7d\nkind: inference\n" + "{" * 3,  # broken YAML quoting the file
        "a b c hunter2-token-9f8e7d: 1\n",  # a key that is no config name
        "mllm:\n  hunter2-token-9f8e7d root:x:0: 1\n",  # the same, one level down
        "[hunter2-token-9f8e7d]\n",  # a list
        "hunter2-token-9f8e7d\n",  # a bare word
    ],
    ids=["passwd", "broken-yaml", "spaced-key", "nested-key", "list", "scalar"],
)
def test_a_base_that_is_not_a_config_is_refused_without_quoting_it(tmp_path, content):
    secret = tmp_path / "secret"
    secret.write_text(content)
    cfg = tmp_path / "run.yaml"
    cfg.write_text(f"base: {secret}\nkind: inference\n")
    with pytest.raises(ConfigError) as exc:
        load_config(cfg)
    message = str(exc.value)
    assert str(secret) in message and "\n" not in message
    assert "hunter2" not in message and "root:x" not in message and "daemon" not in message
