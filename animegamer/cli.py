"""The one command-line shape: ``--config FILE`` followed by ``key=value`` overrides."""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from animegamer.config import ConfigError, config_help, load_config
from animegamer.io import LOCK_NAME, DirectoryLocked, directory_lock, remove_stale_temps

# an override example per config kind, shown in --help (tests load each one against its schema)
OVERRIDE_EXAMPLES: dict[str, str] = {
    "stage_a": "train.max_steps=100 output_dir=outputs/try_a",
    "stage_b": "train.max_steps=100 output_dir=outputs/try_b",
    "stage_c": "train.max_steps=100 output_dir=outputs/try_c",
    "stage_d": "train.max_steps=100 output_dir=outputs/try_d",
    "stage_e": "crop_size=8 output_dir=outputs/try_e",
    "inference": "sampling.steps=20 sampling.preset=fast output_dir=outputs/my_game",
    "eval": "max_games=2 systems=[animegamer,random]",
    "prepare_data": "films=[films/] output_dir=data/myanime workers=8",
    "spriteworld": "num_films=4 output_dir=outputs/tiny/data",
    "spriteworld_pretrain": "transformer.max_steps=50 vae.max_steps=50",
    "spriteworld_llm": "train.max_steps=50",
    "spriteworld_run": "steps=[data,pretrain] output_dir=/tmp/sw",
    "benchmark": "parts=[turn] repeats=3",
    "benchmark_gen": "characters=[Qiqi] games_per_character=1",
    "ablations": "skip_train=true",
}


REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout: scripts/ and research/ sit beside the package


def command_name(argv0: str | None = None) -> str:
    """How the user started this program: ``python -m animegamer.play`` or ``python app.py``, for ``usage:``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if argv0 is None and spec is not None and spec.name and not spec.name.endswith("__main__"):
        return f"python -m {spec.name}"
    script = Path(argv0 if argv0 is not None else sys.argv[0])
    try:
        script = script.resolve().relative_to(Path.cwd())
    except ValueError:
        pass
    return f"python {script}"


def parse_config(
    schema: type, doc: str | None, argv: list[str] | None = None, extra=None
) -> tuple[Any, argparse.Namespace]:
    """Parse ``--config FILE key=value ...``; ``--help`` shows ``doc`` and every config key with its default and
    description (the field's comment in animegamer/config/).

    ``extra`` may add script-specific flags to the parser. Config errors exit with one readable line.
    """
    example = OVERRIDE_EXAMPLES.get(getattr(schema(), "kind", ""), "output_dir=outputs/try")
    parser = argparse.ArgumentParser(
        prog=command_name(),
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (override with key=value):\n" + config_help(schema),
    )
    parser.add_argument("--config", help="YAML run config (values only; 'base:' may name a parent file)")
    parser.add_argument("overrides", nargs="*", help=f"key=value overrides of config keys, e.g. {example}")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, schema=schema)
    except ConfigError as exc:
        fail(str(exc))
    return cfg, args


def no_bars_in_logs() -> None:
    """Where stderr goes to a file (a log, CI), switch transformers' loading bars off, so that the log holds the
    results line by line with no bar fragments between them. The entry points' own tqdm bars take
    ``disable=None`` (off when not on a terminal) for the same reason."""
    if not sys.stderr.isatty():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()


def fail(message: str) -> NoReturn:
    """A user's mistake: one ``error: ...`` line on stderr and exit code 2, never a traceback. For programs (their
    ``main``); library code raises :class:`UsageError` instead, and the program reports it."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


class UsageError(Exception):
    """A user's mistake found inside the library (a setting, a file, a launch that cannot work): the program that
    called it reports it as one ``error:`` line, exit 2 (:func:`reports_usage_errors`)."""


def reports_usage_errors(main: Callable) -> Callable:
    """Decorate a program's ``main``: a :class:`UsageError` from anything it calls ends the process with one
    ``error:`` line (exit 2, :func:`fail`) instead of a traceback."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UsageError as exc:
            fail(str(exc))

    return wrapped


@contextmanager
def hold_output_dir(directory: str | Path, temp_depth: int = 0) -> Iterator[None]:
    """Run the block as the only program writing into ``directory``: a second one is refused with one ``error:``
    line naming the holder's PID and command (exit 2); a lock left by a dead process is taken over. Temp files a
    killed earlier run left there (and ``temp_depth`` folders down) are removed once the lock is held."""
    command = " ".join([command_name(), *sys.argv[1:]])
    try:
        lock = directory_lock(directory, command)
        lock.__enter__()
    except DirectoryLocked as exc:
        fail(str(exc))
    except OSError as exc:  # e.g. the lock file's name taken by a link or a folder
        fail(f"{directory}: cannot take the lock {LOCK_NAME} ({exc.strerror or exc})")
    try:
        remove_stale_temps(directory, temp_depth)
        yield
    finally:
        lock.__exit__(None, None, None)
