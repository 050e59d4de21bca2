"""Play AnimeGamer in the terminal; the game itself is animegamer/game/terminal.py (``--help`` prints its rules).

    make play                                                                   # the shipped SpriteWorld world
    python -m animegamer.play --config configs/spriteworld/inference.yaml      # the same
    python -m animegamer.play --config configs/inference.yaml                  # full size (converted weights)
    python -m animegamer.play --config checkpoints/official/Qiqi/inference.yaml compat=released   # the release's way

The parts a config plays (the core's, or under ``compat: released`` the release's own predictor and renderer) are
picked by :func:`animegamer.official.game.build_session`, as for every other entry point.
"""

from __future__ import annotations

from animegamer.game.terminal import main as play
from animegamer.official.game import build_session


def main(argv: list[str] | None = None) -> None:
    play(argv, build=build_session)


if __name__ == "__main__":
    main()
