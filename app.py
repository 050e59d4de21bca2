"""Play AnimeGamer in the browser (Gradio).

    make app                                                             # the shipped SpriteWorld world
    python app.py --config configs/spriteworld/inference.yaml --port 7861  # the same, on another port
    python app.py --config configs/inference.yaml                          # full size (converted weights)

then open http://127.0.0.1:7860. The fields offer the world's characters, adverbs, motions and backgrounds (the
checkpoint's vocabulary.json) and take any other words too. Each browser tab plays in its own folder under
``output_dir``; a loaded save is checked as untrusted input and only clips inside the tab's folder are ever served.
"""

from __future__ import annotations

from animegamer.cli import fail, no_bars_in_logs, parse_config
from animegamer.config import InferenceConfig
from animegamer.inference.session import check_play_settings
from animegamer.inference.vocabulary import load_vocabulary
from animegamer.inference.web import APP_CSS, build_app
from animegamer.official.game import build_game


def main(argv: list[str] | None = None) -> None:
    def flags(parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: every interface)")
        parser.add_argument("--port", type=int, default=7860, help="port to serve on")

    cfg, args = parse_config(InferenceConfig, __doc__, argv, extra=flags)
    no_bars_in_logs()
    if not 1 <= args.port <= 65535:
        fail(f"--port {args.port} is not a port (1..65535)")
    try:
        check_play_settings(cfg)
        vocabulary = load_vocabulary(cfg.mllm_checkpoint)
        game = build_game(cfg)
    except (FileNotFoundError, ValueError) as exc:  # a setting, a weights path or a vocabulary file, before any model
        fail(str(exc))
    app = build_app(game, cfg.output_dir, vocabulary=vocabulary)
    print(f"AnimeGamer: open http://{args.host}:{args.port} in a browser (Ctrl-C here stops the server)", flush=True)
    try:
        app.launch(server_name=args.host, server_port=args.port, css=APP_CSS, quiet=True)
    except OSError as exc:  # the port is taken, or the address is not this machine's
        fail(f"cannot serve on {args.host}:{args.port}: {exc}")


if __name__ == "__main__":
    main()
