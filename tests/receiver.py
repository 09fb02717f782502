"""A real HTTP server in a thread standing in for a webhook (Slack-compatible or an
account's): it records what it is sent; no mock."""

from __future__ import annotations

import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ServedFromThread:
    """A ThreadingHTTPServer on a free local port, serving from a thread inside `with`."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self):  # noqa: ANN204 - the subclass
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class Receiver(ServedFromThread):
    """POSTs to http://127.0.0.1:<port>/...: the first `fail` answer 500, the rest 204.

    `secret_url` carries a token in its path, as Slack's webhook URLs do: a URL that must
    never be logged.
    """

    def __init__(self, fail: int = 0) -> None:
        self.notices: list[tuple[str, dict]] = []
        self.attempts = 0
        self.fail = fail
        self.token = secrets.token_hex(12)
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server spelling
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                receiver.attempts += 1
                if receiver.attempts <= receiver.fail:
                    self.send_response(500)
                else:
                    receiver.notices.append((self.path, json.loads(body or b"{}")))
                    self.send_response(204)
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(Handler)
        self.secret_url = f"{self.url}/services/{self.token}"

    @property
    def bodies(self) -> list[dict]:
        return [body for _, body in self.notices]

    @property
    def paths(self) -> list[str]:
        return [path for path, _ in self.notices]

    def texts(self) -> list[str]:
        """The `text` of each Slack-style message received."""
        return [body.get("text", "") for body in self.bodies]
