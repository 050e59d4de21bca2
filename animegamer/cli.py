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


def add_split_flags(parser: argparse.ArgumentParser, count: int, what: str, count_flag: str = "--clips") -> None:
    """``--manifest``, ``--split`` and a clip count: the flags of scripts that sample a manifest's train/test films."""
    parser.add_argument("--manifest", required=True, help="clips.jsonl with train/test films in its meta splits")
    parser.add_argument("--split", default="test", choices=("test", "train"), help="films to take the clips from")
    parser.add_argument(count_flag, type=int, default=count, help=f"{what} (evenly spread over the split)")


def split_clips(manifest_path: str, split: str, count: int) -> tuple[Any, list]:
    """The manifest and up to ``count`` evenly spread tagged clips of its ``split`` films
    (:meth:`Manifest.sample_split`); an unreadable manifest or an empty split exits with one readable line."""
    from animegamer.data.manifest import read_manifest

    try:
        manifest = read_manifest(manifest_path)
        return manifest, manifest.sample_split(split, count)
    except (ValueError, FileNotFoundError) as exc:  # ManifestError is a ValueError
        raise SystemExit(f"error: {exc}") from None
