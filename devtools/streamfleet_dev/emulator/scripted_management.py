"""A Management API on loopback whose every answer a script decides: for the fan-out's tests and
benchmarks of subscribers that are slow, throttled, refused or never answer.

``answer(method, connection_id)`` returns ``(status, delay_seconds)``: the request is held that
long, then answered with that status (429 as ``LimitExceededException``, 410 as
``GoneException``, 403 as ``ForbiddenException``, with the error type header the SDK reads).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

Answer = Callable[[str, str], tuple[int, float]]

_ERROR_TYPES = {
    403: "ForbiddenException",
    410: "GoneException",
    429: "LimitExceededException",
}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # the default backlog of 5 drops the posting threads' connects


class ScriptedManagementApi:
    """``with ScriptedManagementApi(answer) as api:`` serves at ``api.url`` (a stage URL);
    ``api.seen`` lists every ``(method, path)`` received, in order."""

    def __init__(self, answer: Answer, stage: str = "v1"):
        self.answer = answer
        self.stage = stage
        self.seen: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server: _Server | None = None

    @property
    def url(self) -> str:
        assert self._server is not None, "not started"
        return f"http://127.0.0.1:{self._server.server_address[1]}/{self.stage}"

    def __enter__(self) -> ScriptedManagementApi:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                with api._lock:
                    api.seen.append((self.command, self.path))
                connection_id = unquote(self.path.rsplit("/@connections/", 1)[-1])
                status, delay = api.answer(self.command, connection_id)
                if delay:
                    time.sleep(delay)
                error = _ERROR_TYPES.get(status)
                body = b'{"message":"scripted"}' if error else b""
                self.send_response(status)
                if error:
                    self.send_header("x-amzn-ErrorType", error)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_DELETE = do_GET = _answer

            def log_message(self, *args: Any) -> None:
                pass

        self._server = _Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
