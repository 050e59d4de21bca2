"""Play AnimeGamer in the terminal; the game itself is animegamer/game/terminal.py (``--help`` prints its rules).

    make play                                                                   # the shipped SpriteWorld world
    python -m animegamer.play --config configs/spriteworld/inference.yaml      # the same
    python -m animegamer.play --config configs/inference.yaml                  # full size (converted weights)
"""

from animegamer.game.terminal import main

if __name__ == "__main__":
    main()
