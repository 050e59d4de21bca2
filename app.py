"""Play AnimeGamer in the browser (Gradio).

    python app.py --config configs/inference.yaml                 # then open http://127.0.0.1:7860
    python app.py --config configs/tiny/inference.yaml --port 7861  # CPU, tiny models

Each browser tab plays in its own folder under ``output_dir``; a loaded save is checked as untrusted input and
only clips inside the tab's folder are ever served.
"""

from __future__ import annotations

from animegamer.cli import fail, no_bars_in_logs, parse_config
from animegamer.config import InferenceConfig
from animegamer.inference.session import build_session
from animegamer.inference.web import build_app


def main(argv: list[str] | None = None) -> None:
    def flags(parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to serve on")
        parser.add_argument("--port", type=int, default=7860)

    cfg, args = parse_config(InferenceConfig, __doc__, argv, extra=flags)
    no_bars_in_logs()
    try:
        template = build_session(cfg)
    except FileNotFoundError as exc:  # a checkpoint path, found before any model loads
        fail(str(exc))
    app = build_app(template.predictor, template.renderer, cfg.history_turns, cfg.output_dir, seed=cfg.seed)
    app.launch(server_name=args.host, server_port=args.port)


if __name__ == "__main__":
    main()
