"""A local HTTP endpoint that stands for an OpenAI-compatible model server in tests and probes: it records what each
request carried and answers what it is told to."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Callable
from typing import Any

Reply = Callable[[str | None], tuple[int, dict[str, Any]]]  # the request's Authorization header -> (status, body)


def chat_completion(text: str) -> Reply:
    """A reply of HTTP 200 with one assistant message, `text`."""
    body = {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]}
    return lambda _auth: (200, body)


def echoing_refusal(_auth: str | None = None) -> tuple[int, dict[str, Any]]:
    """HTTP 401 whose error message repeats the Authorization header the request carried, as some servers do."""
    return 401, {"error": {"message": f"invalid credentials: {_auth}", "type": "auth"}}


class RecordingEndpoint:
    """An HTTP server on 127.0.0.1 (a free port) answering every POST with `reply`; `seen` holds each request's path
    and Authorization header; `url` is its base URL (`.../v1`). A context manager: it stops on exit."""

    def __init__(self, reply: Reply) -> None:
        seen: list[dict[str, str | None]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                auth = self.headers.get("Authorization")
                seen.append({"path": self.path, "authorization": auth})
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                status, body = reply(auth)
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        self.seen = seen
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> RecordingEndpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
