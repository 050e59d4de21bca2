"""A tiny OpenAI-compatible chat server on loopback for tests: answers come from a queue (or a function)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class FakeChatServer:
    """``with FakeChatServer(answers) as server: backend = OpenAICompatibleBackend(server.base_url)``.

    ``answers`` is a list (popped in order) or a function ``request_json -> str``. Every request body is kept in
    ``server.requests``. An answer equal to ``"HTTP500"`` makes the server fail that request with status 500.
    """

    def __init__(self, answers: list[str] | Callable[[dict], str]):
        self.answers = answers
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append(body)
                answer = outer.answers(body) if callable(outer.answers) else outer.answers.pop(0)
                if answer == "HTTP500":
                    self.send_response(500)
                    self.end_headers()
                    return
                data = json.dumps({"choices": [{"message": {"role": "assistant", "content": answer}}]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
