"""Play converted official weights in the terminal, the release's way or ours (``compat``):

    python -m animegamer.official.play --config converted/inference.yaml compat=released

The terminal game of :mod:`animegamer.game.terminal` with the parts :mod:`animegamer.official.game` picks (the
core's game plays ``compat: fixed`` only).
"""

from __future__ import annotations

from animegamer import play
from animegamer.official.game import build_session


def main(argv: list[str] | None = None) -> None:
    play.main(argv, build=build_session)


if __name__ == "__main__":
    main()
