"""--help: config keys with their descriptions from the schemas' fields (knob(help=...) in animegamer/config/),
examples that fit the command, the usage line as the user typed it; missing weights are one line that says what to
do."""

import argparse
import inspect
import subprocess
import sys
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import Literal

import pytest

from animegamer.cli import OVERRIDE_EXAMPLES, command_name
from animegamer.config import SCHEMAS, InferenceConfig, config_help, load_config
from animegamer.config.parts import knob
from animegamer.config_docs import config_keys_help, field_descriptions
from animegamer.eval.research import split_clips
from animegamer.game.build import check_checkpoints


@dataclass
class _Inner:
    steps: int = knob(3, help="how many steps")


@dataclass
class _Documented:
    plain: int = knob(1, help="a help text")
    listed: list[str] = knob(factory=lambda: ["a"], help="a mutable default")
    choice: Literal["x", "y"] = knob("x", help="x: the first | y: the second")
    bare_choice: Literal["x", "y"] = knob("y", help="says no choice")
    untyped_choice: Literal["x", "y"] = "x"
    undocumented: float = 0.5  # a comment is not help text
    inner: _Inner = field(default_factory=_Inner)


def test_field_descriptions_come_from_the_fields_help_and_literal_choices():
    assert field_descriptions(_Documented) == {
        "plain": "a help text",
        "listed": "a mutable default",
        "choice": "x: the first | y: the second",  # names every choice: as written
        "bare_choice": "says no choice (x | y)",
        "untyped_choice": "x | y",
        "undocumented": "",
        "inner": "",
    }
    assert ("inner.steps=3", "how many steps") in config_keys_help(_Documented)
    assert ("listed=['a']", "a mutable default") in config_keys_help(_Documented)


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_help_lists_every_config_key_with_its_fields_help(kind):
    """--help (config_help) names every leaf key of the schema; each key's text is its field's help."""
    import dataclasses

    def leaves(schema, prefix=""):
        for f in dataclasses.fields(schema):
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if dataclasses.is_dataclass(default):
                yield from leaves(type(default), f"{prefix}{f.name}.")
            else:
                yield f"{prefix}{f.name}", f.metadata.get("help", "")

    rows = dict((key.split("=", 1)[0], text) for key, text in config_keys_help(SCHEMAS[kind]))
    expected = dict(leaves(SCHEMAS[kind]))
    assert rows.keys() == expected.keys()
    for key, text in expected.items():
        assert text in rows[key], key
    described = sum(bool(text) for text in rows.values())
    assert described >= 0.6 * len(rows), f"{kind}: {described} of {len(rows)} keys described"


def test_config_help_shows_inference_descriptions():
    text = config_help(InferenceConfig)
    lines = {line.split()[0]: line for line in text.splitlines() if line.startswith("  ") and line.strip()}
    assert "auto | cpu | cuda" in lines["device='auto'"]
    assert "random seed" in lines["seed=42"]
    assert "instruction file, one turn per line" in lines["game='game_demo/demo.txt'"]
    assert "fold the LoRA into the base weights" in lines["merge_lora=False"]
    # a long default is shortened, so the description stays on screen
    assert max(len(line.split()[0]) for line in lines.values()) <= 2 + 60 + 30


@pytest.mark.parametrize("kind", sorted(SCHEMAS))
def test_every_kind_has_an_override_example_that_loads(kind):
    cfg = load_config(None, OVERRIDE_EXAMPLES[kind].split(), schema=SCHEMAS[kind])
    assert cfg.kind == kind


def test_play_help_usage_and_examples():
    result = subprocess.run([sys.executable, "-m", "animegamer.play", "--help"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: python -m animegamer.play ")
    assert "train.max_steps" not in result.stdout
    assert "sampling.steps=20" in result.stdout
    assert "mllm_checkpoint='outputs/stage_b/checkpoints/latest'" in result.stdout


def test_command_name_of_a_script():
    assert command_name("app.py") == "python app.py"


def _missing(cfg, **parts) -> str:
    with pytest.raises(FileNotFoundError) as exc:
        check_checkpoints(cfg, **parts)
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_missing_base_weights_name_the_path_and_the_way_out():
    cfg = load_config("configs/inference.yaml", ["mllm.pretrained=/nonexistent/Mistral-7B-v0.1", "mllm_checkpoint="])
    message = _missing(cfg, decoder=False)
    assert message.startswith("not found: mllm.pretrained=/nonexistent/Mistral-7B-v0.1: convert the released")
    assert "scripts/convert_official.py" in message and "make play" in message


def test_missing_tiny_weights_say_make_tiny():
    cfg = load_config("configs/tiny/inference.yaml", ["decoder.pretrained=checkpoints/tiny/no_such_dir",
                                                      "decoder_checkpoint="])
    assert _missing(cfg, mllm=False) == ("not found: decoder.pretrained=checkpoints/tiny/no_such_dir: "
                                         "build the tiny random models with `make tiny`")


def test_missing_trained_checkpoint_and_the_shipped_world(tmp_path):
    check_checkpoints(load_config("configs/spriteworld/inference.yaml"))  # everything it names is in the repository
    run = f"{tmp_path}/run/checkpoints/latest"
    missing = load_config("configs/spriteworld/inference.yaml", [f"mllm_checkpoint={run}"])
    assert _missing(missing).startswith(f"not found: mllm_checkpoint={run}: train it first")


def test_play_on_a_config_without_weights_is_one_line(capsys):
    from animegamer.game.terminal import main

    with pytest.raises(SystemExit) as exc:
        main(["--config", "configs/inference.yaml", "mllm_checkpoint=", "decoder_checkpoint=",
              "mllm.pretrained=/nonexistent/Mistral-7B-v0.1", "decoder.pretrained=/nonexistent/CogVideoX-2b"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert err.startswith("error: not found: mllm.pretrained=/nonexistent/Mistral-7B-v0.1, "
                          "decoder.pretrained=/nonexistent/CogVideoX-2b: convert the released")


def test_split_clips_bad_manifest_exits_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        split_clips(str(tmp_path / "clips.jsonl"), "test", 4)
    assert exc.value.code == 2 and capsys.readouterr().err.startswith("error: ")


ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = [*ROOT.glob("scripts/**/*.py"), *ROOT.glob("research/**/*.py")]
ENTRY_POINTS = sorted([p.name for p in ROOT.glob("*.py")] + [p.relative_to(ROOT).as_posix() for p in PROGRAMS])


class _ParserBuilt(Exception):
    """Raised in place of argument parsing: the test only needs the parser."""


@pytest.mark.parametrize("script", ENTRY_POINTS)
def test_every_flag_of_every_entry_point_has_help(script, monkeypatch):
    built = []

    def capture(self, args=None, namespace=None):
        built.append(self)
        raise _ParserBuilt

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", capture)
    monkeypatch.setattr(sys, "argv", [script])
    module = import_module(script.removesuffix(".py").replace("/", "."))
    with pytest.raises(_ParserBuilt):
        module.main(*([[]] if inspect.signature(module.main).parameters else []))
    assert [a.option_strings or a.dest for a in built[0]._actions if not a.help] == []


def test_launch_commands_in_docstrings_keep_their_line_breaks():
    # a docstring line ending in a single backslash joins the next line into it, so --help (the docstring) showed
    # `... train_stage_b.py         --config ...` as one line; every entry point's docstring keeps its source lines
    import ast

    root = Path(__file__).resolve().parents[1]
    scripts = [*root.glob("*.py"), *root.glob("scripts/**/*.py"), *root.glob("research/**/*.py")]
    assert len(scripts) > 20
    for path in scripts:
        module = ast.parse(path.read_text())
        node = module.body[0] if module.body else None
        if not (isinstance(node, ast.Expr) and isinstance(getattr(node.value, "value", None), str)):
            continue
        source_lines = node.end_lineno - node.lineno + 1
        assert node.value.value.count("\n") + 1 == source_lines, path.relative_to(root)
