"""The one command-line shape: ``--config FILE`` followed by ``key=value`` overrides."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from animegamer.config import ConfigError, config_help, load_config


def parse_config(
    schema: type, doc: str | None, argv: list[str] | None = None, extra=None
) -> tuple[Any, argparse.Namespace]:
    """Parse ``--config FILE key=value ...``; ``--help`` shows ``doc`` and every config key with its default.

    ``extra`` may add script-specific flags to the parser. Config errors exit with one readable line.
    """
    parser = argparse.ArgumentParser(
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="config keys (override with key=value):\n" + config_help(schema),
    )
    parser.add_argument("--config", help="YAML run config (values only; 'base:' may name a parent file)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. train.max_steps=100")
    if extra is not None:
        extra(parser)
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides, schema=schema)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    return cfg, args
