"""Play AnimeGamer in the browser (Gradio).

    make app                                                             # the shipped SpriteWorld world
    python app.py --config configs/spriteworld/inference.yaml --port 7861  # the same, on another port
    python app.py --config configs/inference.yaml                          # full size (converted weights)

then open http://127.0.0.1:7860. The fields offer the world's characters, adverbs, motions and backgrounds (the
checkpoint's vocabulary.json) and take any other words too. Each browser tab plays in its own folder under
``output_dir``; a loaded save is checked as untrusted input and only clips inside the tab's folder are ever served.
A tab's game is freed (its folder removed) when the tab closes. Stopping the server (Ctrl-C, or SIGTERM from docker
or systemd) saves every open game's unsaved turns to ``game.save`` in its folder, removes its temp files and exits 0.
"""

from __future__ import annotations

import signal
import threading

from animegamer.cli import fail, no_bars_in_logs, parse_config, reports_usage_errors
from animegamer.config import InferenceConfig
from animegamer.game.browser import APP_CSS, MAX_UPLOAD_BYTES, build_app
from animegamer.game.build import prepare_play
from animegamer.game.session import shielded
from animegamer.official.game import build_game


@reports_usage_errors
def main(argv: list[str] | None = None) -> None:
    def flags(parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to serve on (0.0.0.0: every interface)")
        parser.add_argument("--port", type=int, default=7860, help="port to serve on")
        parser.add_argument("--max-upload-mb", type=int, default=MAX_UPLOAD_BYTES >> 20,
                            help="largest saved game a browser may upload, in MiB (larger ones are refused unread)")

    cfg, args = parse_config(InferenceConfig, __doc__, argv, extra=flags)
    no_bars_in_logs()
    if not 1 <= args.port <= 65535:
        fail(f"--port {args.port} is not a port (1..65535)")
    if args.max_upload_mb < 1:
        fail(f"--max-upload-mb {args.max_upload_mb} must be at least 1")
    vocabulary, game = prepare_play(cfg, build_game)  # a bad setting, weights path or vocabulary: one line, no model
    app = build_app(game, cfg.output_dir, vocabulary=vocabulary, max_upload_bytes=args.max_upload_mb << 20)
    stop = threading.Event()
    # a file size limit fails the write that reaches it; Ctrl-C, SIGTERM (docker, systemd), a hang-up stop the server
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    for number in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(number, lambda signum, frame: stop.set())
    try:
        app.launch(server_name=args.host, server_port=args.port, css=APP_CSS, quiet=True, prevent_thread_lock=True,
                   max_file_size=args.max_upload_mb << 20)
    except (OSError, ValueError) as exc:  # the port is taken, the address is not this machine's, or Gradio cannot
        fail(f"cannot serve on {args.host}:{args.port}: {exc}")  # reach it (ValueError: "localhost is not accessible")
    print(f"AnimeGamer: open http://{args.host}:{args.port} in a browser (Ctrl-C here stops the server)", flush=True)
    while not stop.wait(0.5):  # a short wait: the signal handlers run between them
        pass
    with shielded():  # a second Ctrl-C or SIGTERM must not cut the saves short
        print("stopping: saving the open games", flush=True)
        app.web.stopping = True  # the tabs Gradio drops as it closes keep their games, to be saved
        app.close(verbose=False)  # no new actions; Gradio deletes its cached files (delete_cache)
        for line in app.web.shutdown():
            print(line, flush=True)


if __name__ == "__main__":
    main()
