import dataclasses
import re
from importlib import import_module
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


# ---- a shipped YAML writes only what differs: the defaults (the dataclasses: the paper's settings) live in one place

_LEAF = re.compile(r"^(\s*)([A-Za-z_]\w*)\s*:\s*([^#\s|>].*)$")  # `key: value` on one line
_HEADER = re.compile(r"^(\s*)([A-Za-z_]\w*)\s*:\s*(#.*)?$")  # `section:`


def _resolved_without(path: Path, lines: list[str], drop: set[int], tmp: Path):
    """What ``path`` resolves to without the lines ``drop`` (its ``base`` made absolute, the copy in ``tmp``)."""
    import dataclasses

    kept = [line for n, line in enumerate(lines) if n not in drop]
    text = "".join(re.sub(r"^base:\s*(\S+)", lambda m: f"base: {(path.parent / m.group(1)).resolve()}", line)
                   for line in kept)
    trial = tmp / path.name
    trial.write_text(text)
    try:
        return dataclasses.asdict(load_config(trial))
    except Exception as exc:  # a key the file needs (kind, a required path): not a restated default
        return ("error", type(exc).__name__)


@pytest.mark.parametrize("path", ALL_CONFIGS, ids=lambda p: str(p.relative_to(ROOT / "configs")))
def test_a_shipped_config_writes_only_what_differs_from_the_defaults(path, tmp_path):
    """Every one-line ``key: value`` of a shipped YAML changes what the file resolves to: none restates a default
    (of the dataclasses, or of its ``base`` file). A section holding only a restated default counts as one."""
    lines = path.read_text().splitlines(keepends=True)
    whole = _resolved_without(path, lines, set(), tmp_path)
    restated = []
    for n, line in enumerate(lines):
        match = _LEAF.match(line)
        if not match or match.group(2) in ("kind", "base"):
            continue
        indent = len(match.group(1))
        after = next((x for x in lines[n + 1:] if x.strip() and not x.lstrip().startswith("#")), "")
        if after and len(after) - len(after.lstrip()) > indent:
            continue  # a value continued on the next lines
        drop = {n}
        alone = n > 0 and _HEADER.match(lines[n - 1]) and len(after) - len(after.lstrip()) < indent
        if alone:
            drop.add(n - 1)  # the only key of its section: the section goes with it
        if _resolved_without(path, lines, drop, tmp_path) == whole:
            restated.append(f"line {n + 1}: {line.strip()}")
    assert not restated, f"{path.relative_to(ROOT)} restates defaults: {restated}"


# ---- the resolved shipped configs: a refactor of the schemas or the YAMLs must not move any value ----------------

SNAPSHOT = ROOT / "tests" / "data" / "resolved_configs.json"
_OUT = "<output_dir>"  # the spriteworld chains' output_dir, which a test moves to a temporary folder


def resolve_shipped_configs(tmp: Path) -> dict[str, dict]:
    """Every config under configs/ resolved through ``load_config`` (as the entry points read it), and every step
    YAML of each SpriteWorld chain (``kind: spriteworld_run``) as scripts/spriteworld/train.py resolves it, with its
    per-step overrides applied (``<file>::<step>``, the overrides themselves left out of ``<file>``); the chains'
    output_dir is ``<output_dir>``."""
    import dataclasses
    import json

    resolve_configs = import_module("scripts.spriteworld.train").resolve_configs
    resolved: dict[str, dict] = {}
    for path in ALL_CONFIGS:
        name = path.relative_to(ROOT).as_posix()
        cfg = load_config(path)
        resolved[name] = dataclasses.asdict(cfg)
        if cfg.kind != "spriteworld_run":
            continue
        del resolved[name]["overrides"]  # how they are written; what they resolve to is each step's entry
        out = tmp / path.stem
        cfg = load_config(path, [f"output_dir={out}"])
        cfg.configs = str(ROOT / cfg.configs)
        for step, step_path in resolve_configs(cfg).items():
            values = json.loads(json.dumps(dataclasses.asdict(load_config(step_path))).replace(str(out), _OUT))
            resolved[f"{name}::{step}"] = values
    return resolved


def test_resolved_shipped_configs_match_the_snapshot(tmp_path, monkeypatch):
    """The snapshot is rewritten only on purpose, by ``python tests/test_config.py``, in a commit that says why.
    A checkpoint of this machine's own (``outputs/...``, which full-size configs name) is not a shipped record:
    the configs resolve as on a fresh clone."""
    import json

    from animegamer.config import recorded

    for name in ("mllm_record", "decoder_record"):
        read = getattr(recorded, name)
        monkeypatch.setattr(recorded, name, lambda c, read=read: None if str(c).startswith("outputs/") else read(c))
    expected = json.loads(SNAPSHOT.read_text())
    resolved = resolve_shipped_configs(tmp_path)
    assert sorted(resolved) == sorted(expected)
    for name, values in resolved.items():
        assert values == expected[name], name


if __name__ == "__main__":  # rewrite the snapshot
    import json
    import sys
    import tempfile

    sys.path.insert(0, str(ROOT))
    from animegamer.io import atomic_write_text

    with tempfile.TemporaryDirectory() as tmp:
        atomic_write_text(SNAPSHOT, json.dumps(resolve_shipped_configs(Path(tmp)), indent=1, sort_keys=True) + "\n")
    print(f"wrote {SNAPSHOT}")


def _resolve_chain(config: str, out: Path, overrides: list[str] = ()) -> dict[str, dict]:
    """The step configs of a SpriteWorld chain as scripts/spriteworld/train.py resolves them, with the chain's
    output_dir moved back to its default (outputs/spriteworld), so they compare with a recorded run's."""
    import dataclasses
    import json

    cfg = load_config(ROOT / config, [f"output_dir={out}", *overrides])
    cfg.configs = str(ROOT / cfg.configs)
    steps = import_module("scripts.spriteworld.train").resolve_configs(cfg)
    text = {name: json.dumps(dataclasses.asdict(load_config(path))) for name, path in steps.items()}
    return {name: json.loads(values.replace(str(out), "outputs/spriteworld")) for name, values in text.items()}


def test_run_yaml_resolves_to_the_shipped_checkpoints_configs(tmp_path):
    """The recipe is what trained checkpoints/spriteworld/: every step config it resolves to equals the one the
    shipped run recorded (checkpoints/spriteworld/configs/)."""
    import dataclasses

    resolved = _resolve_chain("configs/spriteworld/run.yaml", tmp_path / "spriteworld")
    # the shipped small decoder was trained afterwards on the shipped VAE, by the command in the header of
    # configs/spriteworld/stage_e.yaml: run.yaml with these stage (e) overrides
    resolved["stage_e"] = _resolve_chain("configs/spriteworld/run.yaml", tmp_path / "spriteworld", [
        "overrides.stage_e=[vae=checkpoints/spriteworld/CogVideoX,data.features_dir=outputs/spriteworld/stage_e_latents,"
        "data.split=train,data.test_fraction=0.75]"])["stage_e"]
    # every other step (the 2- and 1-step students included) and every table row were run by the shipped recipe
    for name, values in resolved.items():
        recorded = dataclasses.asdict(load_config(ROOT / "checkpoints/spriteworld/configs" / f"{name}.yaml"))
        assert values == recorded, name
    rows = {row["name"] for row in resolved["ablations"]["rows"]}
    assert {"main", "paper", "reconstruction", "distilled4", "distilled1"} <= rows
    assert resolved["stage_b"]["mse_weight"] == 8.0 and resolved["stage_b"]["history_noise"] == 0.1
    assert resolved["stage_b"]["identity_weight"] == 1.0  # the identity term; the row `paper` trains without it
    assert resolved["stage_b"]["data"]["history_turns"] == resolved["inference"]["history_turns"] == 3


def test_seed_yaml_differs_from_run_yaml_only_in_the_seed(tmp_path):
    run = _resolve_chain("configs/spriteworld/run.yaml", tmp_path / "spriteworld")
    seed = _resolve_chain("configs/spriteworld/seed.yaml", tmp_path / "spriteworld")
    assert run.keys() == seed.keys()
    assert {name for name in run if run[name] != seed[name]} == {"stage_b"}
    assert (run["stage_b"]["seed"], seed["stage_b"]["seed"]) == (42, 7)
    assert {**seed["stage_b"], "seed": 42} == run["stage_b"]
    top = [load_config(ROOT / "configs/spriteworld" / name) for name in ("run.yaml", "seed.yaml")]
    assert top[1].overrides == {**top[0].overrides, "stage_b": {"seed": 7}}
    assert [dataclasses_without(cfg, "overrides") for cfg in top][0] == dataclasses_without(top[1], "overrides")


def dataclasses_without(cfg, key: str) -> dict:
    import dataclasses

    return {k: v for k, v in dataclasses.asdict(cfg).items() if k != key}


def test_chain_overrides_are_mappings_or_key_values_and_bad_keys_exit_2(tmp_path, capsys):
    mapping = _resolve_chain("configs/spriteworld/mini.yaml", tmp_path / "a", ["overrides.stage_b.mse_weight=2.0"])
    listed = _resolve_chain("configs/spriteworld/mini.yaml", tmp_path / "b",
                            ["overrides.inference=[sampling.steps=5,history_turns=1]"])
    assert mapping["stage_b"]["mse_weight"] == 2.0 and mapping["stage_b"]["train"]["max_steps"] == 6
    assert listed["inference"]["sampling"]["steps"] == 5 and listed["inference"]["history_turns"] == 1
    with pytest.raises(ConfigError, match="overrides.stage_c"):  # a list cannot replace the file's mapping
        load_config(ROOT / "configs/spriteworld/mini.yaml", ["overrides.stage_c=[train.max_steps=5]"])
    with pytest.raises(SystemExit) as err:
        _resolve_chain("configs/spriteworld/mini.yaml", tmp_path / "c", ["overrides.stage_b.nope=1"])
    assert err.value.code == 2 and "overrides.stage_b" in capsys.readouterr().err


def test_loss_weights_have_one_default():
    """The stage (b) loss weights' defaults live in StageBConfig only; code takes them from there."""
    import re

    written = re.compile(r"\b(mse_weight|cosine_weight)\s*:\s*float\s*=\s*(knob\()?[-\d.]")
    places = [f"{path.relative_to(ROOT)}:{n}" for folder in ("animegamer", "scripts") for path in
              sorted((ROOT / folder).rglob("*.py")) for n, line in enumerate(path.read_text().splitlines(), 1)
              if written.search(line)]
    assert [p.split(":")[0] for p in places] == ["animegamer/config/stages.py"] * 2, places
    assert "mse_weight" not in (ROOT / "configs/ablations/cosine_loss.yaml").read_text()  # its base says it


def _documented_data_command(path: Path) -> list[str] | None:
    """The ``key=value`` overrides of the ``scripts/spriteworld/make.py --config configs/spriteworld/data.yaml``
    command a config's header gives for the data it reads, or None when it gives none."""
    for line in path.read_text().splitlines():
        if line.startswith("#") and "scripts/spriteworld/make.py --config configs/spriteworld/data.yaml" in line:
            return line.split("data.yaml", 1)[1].split()
    return None


def test_the_tiny_chain_reads_the_clips_its_header_makes():
    """The data command in configs/tiny/'s headers makes clips of the frame count (and size) the tiny stages read:
    a stage asking for more frames than the clips have fails ("too short: 9 frames, need 17")."""
    checked = []
    for path in sorted((ROOT / "configs" / "tiny").glob("*.yaml")):
        command = _documented_data_command(path)
        if command is None:
            continue
        data = load_config(ROOT / "configs/spriteworld/data.yaml", command)
        assert data.output_dir == "outputs/tiny/data", path
        for name in ("stage_a", "stage_c", "stage_d"):
            stage = load_config(ROOT / "configs" / "tiny" / f"{name}.yaml")
            assert stage.data.manifest.startswith(data.output_dir + "/"), name
            if name != "stage_d":  # stage (d) reads the manifest's levels only; its clips are the teacher's
                assert (stage.data.num_frames, stage.data.height, stage.data.width, stage.data.fps) == (
                    data.num_frames, data.height, data.width, data.fps), name
            else:
                assert (stage.teacher.num_frames, stage.teacher.height, stage.teacher.width) == (
                    data.num_frames, data.height, data.width)
        evaluation = load_config(ROOT / "configs" / "tiny" / "eval.yaml")
        assert evaluation.inference.sampling.num_frames == data.num_frames
        checked.append(path.name)
    assert checked == ["ablations.yaml", "eval.yaml", "stage_a.yaml"]


def test_choices_belong_to_the_field_not_its_name():
    """A field's choices are its Literal type: a new field that shares a name (preset, dtype, device) with a field
    of another schema takes its own values, not the other's."""
    from dataclasses import dataclass

    from animegamer.config import BenchmarkConfig, InferenceConfig

    @dataclass
    class Fresh:
        kind: str = "fresh"
        preset: str = "my_own"
        dtype: str = "int4"
        device: str = "tpu"
        history_turns: int = -1

    cfg = load_config(None, ["preset=other"], schema=Fresh)
    assert (cfg.preset, cfg.dtype, cfg.device, cfg.history_turns) == ("other", "int4", "tpu", -1)
    assert load_config(None, ["preset=full"], schema=BenchmarkConfig).preset == "full"
    with pytest.raises(ConfigError, match=r"^override 'preset=standard': preset='standard' is not one of \['full'"):
        load_config(None, ["preset=standard"], schema=BenchmarkConfig)
    with pytest.raises(ConfigError, match=r"sampling.preset='full' is not one of \['standard', 'fast', 'distilled'\]"):
        load_config(None, ["sampling.preset=full"], schema=InferenceConfig)
    with pytest.raises(ConfigError, match="mllm.dtype='int4' is not one of"):
        load_config(None, ["mllm.dtype=int4"], schema=InferenceConfig)
    with pytest.raises(ConfigError, match="device='tpu' is not a device"):
        load_config(None, ["device=tpu"], schema=InferenceConfig)
    assert load_config(None, ["device=cuda:1"], schema=InferenceConfig).device == "cuda:1"
    with pytest.raises(ConfigError, match="history_turns=-1 must be >= 0"):
        load_config(None, ["history_turns=-1"], schema=BenchmarkConfig)


def test_choices_are_literal_types():
    """Every field whose help lists choices (``a | b``) is a Literal of them, in the order the help gives."""
    import dataclasses
    import typing

    from animegamer.config import EvalConfig, InferenceConfig, PrepareDataConfig, StageBConfig

    def literals(schema, prefix=""):
        hints = typing.get_type_hints(schema)
        for f in dataclasses.fields(schema):
            hint = hints[f.name]
            if dataclasses.is_dataclass(hint):
                yield from literals(hint, f"{prefix}{f.name}.")
            elif typing.get_origin(hint) is typing.Literal:
                yield f"{prefix}{f.name}", typing.get_args(hint)

    found = (dict(literals(InferenceConfig)) | dict(literals(EvalConfig)) | dict(literals(StageBConfig))
             | dict(literals(PrepareDataConfig)))
    assert found["encoder.fusion"] == ("concat", "add", "cross_attn")
    assert found["sampling.preset"] == ("standard", "fast", "distilled")
    assert found["mllm.dtype"] == found["decoder.dtype"] == ("fp32", "bf16", "fp16")
    assert found["train.mixed_precision"] == ("no", "bf16", "fp16") and found["data.feature_dtype"][0] == "fp32"
    assert found["flow"] == ("dis", "raft") and found["compat"] == ("released", "fixed")


# ---- the MLLM's shape and K come from what its checkpoint records --------------------------------------------

def test_full_size_configs_play_the_k_they_train_and_evaluate_with():
    from animegamer.config import EvalConfig, InferenceConfig

    trained = load_config(ROOT / "configs/stage_b.yaml").data.history_turns
    assert load_config(ROOT / "configs/stage_c.yaml").data.history_turns == trained == 3
    assert load_config(ROOT / "configs/inference.yaml").history_turns == trained
    assert load_config(ROOT / "configs/eval.yaml").inference.history_turns == trained
    assert InferenceConfig().history_turns == EvalConfig().inference.history_turns == -1  # as trained, until loaded


def test_shipped_inference_reads_both_models_shapes_and_k_from_their_checkpoints():
    import yaml

    from animegamer.config.recorded import DECODER_SHAPE, MLLM_SHAPE

    record = load_config(ROOT / "checkpoints/spriteworld/configs/stage_b.yaml")
    decoder_record = load_config(ROOT / "checkpoints/spriteworld/configs/stage_c.yaml")
    for name in ("inference.yaml", "eval.yaml"):
        written = yaml.safe_load((ROOT / "configs/spriteworld" / name).read_text())
        written = written.get("inference") or written
        assert not set(written["mllm"]) & set(MLLM_SHAPE), name  # not restated
        assert not set(written["decoder"]) & set(DECODER_SHAPE), name
        cfg = load_config(ROOT / "configs/spriteworld" / name)
        inference = cfg if cfg.kind == "inference" else cfg.inference
        assert {k: getattr(inference.mllm, k) for k in MLLM_SHAPE} == {k: getattr(record.mllm, k) for k in MLLM_SHAPE}
        assert inference.mllm.num_slots == 48 and inference.history_turns == record.data.history_turns == 3
        assert ({k: getattr(inference.decoder, k) for k in DECODER_SHAPE}
                == {k: getattr(decoder_record.decoder, k) for k in DECODER_SHAPE})
        assert (inference.decoder.lora_rank, inference.decoder.motion_embed_dim) == (16, 32)


def _stage_b_run(tmp_path: Path, history_turns: int | None, num_slots: int) -> Path:
    """A stage (b) run directory as training leaves it (checkpoints/step_N, checkpoints/latest), its step holding
    the two files that record the MLLM's shape: mllm_layout.json and peft's adapter_config.json."""
    import json

    run = tmp_path / "stage_b"
    step = run / "checkpoints" / "step_0000010"
    step.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text("step_0000010\n")
    layout = {"vocabulary": "paper", "num_slots": num_slots, "shot_dim": 64, "resampler_layers": 1}
    if history_turns is not None:
        layout["history_turns"] = history_turns
    (step / "mllm_layout.json").write_text(json.dumps(layout))
    (step / "adapter_config.json").write_text(json.dumps(
        {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0, "target_modules": ["v_proj", "q_proj"]}))
    return run


def test_k_is_the_trained_k_unless_the_config_sets_it(tmp_path):
    run = _stage_b_run(tmp_path, history_turns=2, num_slots=8)
    for checkpoint in (run, run / "checkpoints" / "latest", run / "checkpoints" / "step_0000010"):
        cfg = load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={checkpoint}"])
        assert (cfg.history_turns, cfg.mllm.num_slots, cfg.mllm.lora_rank) == (2, 8, 4), checkpoint
        assert (cfg.mllm.shot_dim, cfg.mllm.resampler_layers, cfg.mllm.lora_alpha, cfg.mllm.lora_dropout,
                sorted(cfg.mllm.lora_targets)) == (64, 1, 8, 0.0, ["q_proj", "v_proj"])
        assert cfg.mllm.pretrained == "checkpoints/Mistral-7B-v0.1"  # where the base weights are is this run's
    chosen = load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={run}", "history_turns=1"])
    assert (chosen.history_turns, chosen.mllm.num_slots) == (1, 8)
    bare = load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={tmp_path / 'elsewhere'}"])
    assert (bare.history_turns, bare.mllm.num_slots) == (3, 226)  # no checkpoint: DataConfig's K, the YAML's shape
    unrecorded = load_config(ROOT / "configs/inference.yaml",
                             [f"mllm_checkpoint={_stage_b_run(tmp_path / 'old', None, 8)}"])
    assert (unrecorded.history_turns, unrecorded.mllm.num_slots) == (3, 8)  # a shape without K: DataConfig's K
    with pytest.raises(ConfigError, match="history_turns=-2 must be >= -1"):
        load_config(ROOT / "configs/inference.yaml", ["history_turns=-2"])


def test_a_config_that_restates_another_shape_is_refused_naming_key_and_file(tmp_path):
    run = _stage_b_run(tmp_path, history_turns=2, num_slots=8)
    layout = run / "checkpoints" / "step_0000010" / "mllm_layout.json"
    same = load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={run}", "mllm.num_slots=8",
                                                          "mllm.lora_targets=[q_proj,v_proj]"])
    assert same.mllm.num_slots == 8  # restating the same value is allowed (the LoRA targets as a set)
    with pytest.raises(ConfigError, match=rf"mllm\.num_slots=16, but {layout} records 8"):
        load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={run}", "mllm.num_slots=16"])
    with pytest.raises(ConfigError, match=r"mllm\.lora_rank=16, but .*adapter_config\.json records 4"):
        load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={run}", "mllm.lora_rank=16"])
    with pytest.raises(ConfigError, match=r"decoder\.lora_rank=8, but .*stage_c/decoder/decoder_config\.json "
                                          r"records 16"):
        load_config(ROOT / "configs/spriteworld/inference.yaml", ["decoder.lora_rank=8"])


@pytest.mark.parametrize("file, text, what", [
    ("mllm_layout.json", '{"num_slots": "many"}', "num_slots='many' is not a valid value"),
    ("mllm_layout.json", '{"num_slots": true}', "num_slots='True' is not a valid value"),
    ("mllm_layout.json", '{"vocabulary": "klingon"}', "vocabulary='klingon' is not a valid value"),
    ("mllm_layout.json", '{"history_turns": -1}', "history_turns='-1' is not a valid value"),
    ("mllm_layout.json", "[1, 2]", "a JSON object expected"),
    ("mllm_layout.json", "{not json", "mllm_layout.json"),
    ("adapter_config.json", '{"target_modules": "q_proj"}', "lora_targets='q_proj' is not a valid value"),
    ("adapter_config.json", '{"lora_dropout": NaN}', "lora_dropout"),
])
def test_a_damaged_shape_record_is_one_config_error_naming_the_file(tmp_path, file, text, what):
    run = _stage_b_run(tmp_path, history_turns=2, num_slots=8)
    (run / "checkpoints" / "step_0000010" / file).write_text(text)
    with pytest.raises(ConfigError, match=re.escape(what)) as caught:
        load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={run}"])
    assert file in str(caught.value) and "\n" not in str(caught.value)


def test_a_decoder_checkpoint_gives_its_shape_wherever_it_is_loaded(tmp_path):
    """The inference config takes the shape decoder_checkpoint records; a decoder loaded from another checkpoint
    after the config (the evaluation's stage (a) decoder) takes that checkpoint's (models.trained.load_decoder)."""
    import json
    import shutil

    from animegamer.config.recorded import adopt, decoder_record, with_decoder_checkpoint

    stage_a = tmp_path / "stage_a"
    shutil.copytree(ROOT / "checkpoints/spriteworld/stage_a/decoder", stage_a / "decoder")
    settings = json.loads((stage_a / "decoder" / "decoder_config.json").read_text())
    (stage_a / "decoder" / "decoder_config.json").write_text(json.dumps({**settings, "motion_embed_dim": 48}))
    cfg = load_config(ROOT / "configs/spriteworld/inference.yaml", [f"decoder_checkpoint={stage_a}"])
    assert (cfg.decoder.motion_embed_dim, cfg.decoder.lora_rank) == (48, 16)
    bare = load_config(ROOT / "configs/inference.yaml")
    assert bare.decoder.lora_rank == 64  # no checkpoint there: the config's (default) shape
    record = decoder_record(stage_a)
    assert record.source == stage_a / "decoder" / "decoder_config.json"
    assert adopt(bare.decoder, record, "decoder").motion_embed_dim == 48
    shipped = load_config(ROOT / "configs/spriteworld/inference.yaml")
    with pytest.raises(ValueError, match=r"decoder\.motion_embed_dim=32, but .* records 48"):
        adopt(dataclasses.replace(shipped.decoder, motion_embed_dim=32), record, "decoder")
    # the evaluation's stage (a) decoder, another checkpoint than the config's: the shape stage_c gave is let go
    switched = with_decoder_checkpoint(shipped, stage_a)
    assert (switched.decoder_checkpoint, switched.decoder.motion_embed_dim) == (str(stage_a), 48)
    assert (switched.decoder.lora_rank, switched.decoder.dtype, shipped.decoder.motion_embed_dim) == (16, "fp32", 32)
    flat = tmp_path / "flat"
    shutil.copytree(stage_a, flat)
    (flat / "decoder" / "decoder_config.json").write_text(json.dumps({**settings, "motion_scope": False}))
    assert with_decoder_checkpoint(shipped, flat).decoder.motion_scope is False
    asked = load_config(ROOT / "configs/inference.yaml", ["decoder.motion_embed_dim=40"])
    with pytest.raises(ValueError, match=r"decoder\.motion_embed_dim=40, but .* records 48"):
        with_decoder_checkpoint(asked, stage_a)  # a value the config sets itself is checked, not let go


def test_start_up_says_which_k_and_why(tmp_path):
    from animegamer.config.recorded import history_turns_note

    run = _stage_b_run(tmp_path, history_turns=2, num_slots=8)
    layout = run / "checkpoints" / "step_0000010" / "mllm_layout.json"
    cfg = load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={run}"])
    assert history_turns_note(cfg) == f"K = 2 history turns, as the MLLM was trained ({layout})"
    cfg = load_config(ROOT / "configs/inference.yaml", [f"mllm_checkpoint={run}", "history_turns=1"])
    note = history_turns_note(cfg)
    assert note.startswith("K = 1 history turns, set by the config: the MLLM was trained with K = 2 "), note
    cfg = load_config(ROOT / "configs/spriteworld/eval.yaml").inference
    assert history_turns_note(cfg) == ("K = 3 history turns, as the MLLM was trained "
                                       "(checkpoints/spriteworld/stage_b/mllm_layout.json)")
    cfg = load_config(ROOT / "configs/tiny/inference.yaml", ["mllm_checkpoint="])
    assert history_turns_note(cfg) == "K = 1 history turns (no K recorded with mllm_checkpoint='')"
