"""--help: config keys with their descriptions from config.py's comments, examples that fit the command, the
usage line as the user typed it; the missing-weights check of the play entry points."""

import subprocess
import sys
from dataclasses import dataclass, field

import pytest

from animegamer.cli import OVERRIDE_EXAMPLES, command_name, require_inference_weights
from animegamer.config import SCHEMAS, InferenceConfig, config_help, load_config
from animegamer.config_docs import config_keys_help, field_descriptions


@dataclass
class _Inner:
    steps: int = 3  # how many steps


@dataclass
class _Documented:
    plain: int = 1  # a trailing comment
    listed: list[str] = field(  # a field over
        default_factory=lambda: ["a"]  # several lines
    )
    choice: str = "x"  # x: the first, |
    # y: the second
    undocumented: float = 0.5

    # a block above a field
    # in two lines
    led: bool = True
    follower: bool = False

    inner: _Inner = field(default_factory=_Inner)


def test_field_descriptions_read_trailing_continued_and_leading_comments():
    assert field_descriptions(_Documented) == {
        "plain": "a trailing comment",
        "listed": "a field over several lines",
        "choice": "x: the first, | y: the second",
        "undocumented": "",
        "led": "a block above a field in two lines",
        "follower": "a block above a field in two lines",  # uncommented right below: the block covers it too
        "inner": "",
    }
    assert ("inner.steps=3", "how many steps") in config_keys_help(_Documented)


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


def _exit_message(cfg, capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        require_inference_weights(cfg)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_missing_base_weights_name_the_path_and_the_way_out(capsys):
    cfg = load_config("configs/inference.yaml", ["mllm.pretrained=/nonexistent/Mistral-7B-v0.1"])
    message = _exit_message(cfg, capsys)
    assert message.startswith("error: mllm.pretrained=/nonexistent/Mistral-7B-v0.1 not found")
    assert "scripts/convert_official.py" in message and "make play" in message
    assert message.count("\n") == 1


def test_missing_tiny_weights_say_make_tiny(capsys):
    cfg = load_config("configs/tiny/inference.yaml", ["decoder.pretrained=checkpoints/tiny/no_such_dir",
                                                      "mllm.pretrained=checkpoints/spriteworld/Mistral"])
    message = _exit_message(cfg, capsys)
    assert message.startswith("error: decoder.pretrained=checkpoints/tiny/no_such_dir not found: build")
    assert "`make tiny`" in message


def test_missing_trained_checkpoint_and_the_shipped_world(tmp_path, capsys):
    shipped = load_config("configs/spriteworld/inference.yaml")
    require_inference_weights(shipped)  # everything it names is in the repository
    missing = load_config("configs/spriteworld/inference.yaml", [f"mllm_checkpoint={tmp_path}/run/checkpoints/latest"])
    assert f"mllm_checkpoint={tmp_path}/run/checkpoints/latest not found: train it first" in _exit_message(missing,
                                                                                                           capsys)
