"""The game: one turn (turn.py: ``AnimeGamer.play_turn``), a game of turns (session.py: ``GameSession``), building
one from an inference config (build.py), the predictor and renderer it plays (results.py, renderer.py), the save
format (save.py), the results of inference_MLLM.py (results.py), and the terminal and browser games (terminal.py,
browser.py)."""
