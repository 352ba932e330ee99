"""A Management API that refuses posts to chosen connections, in front of a local gateway.

The fan-out closes a subscriber whose post fails with anything but ``GoneException``
(``DeleteConnection``: it resumes from the stored log when it reconnects). The local gateway
answers a post with 200 or 410 only, so this HTTP hop between the recording proxy and the
gateway's Management API answers ``POST /<stage>/@connections/<id>`` for the ids in
``refused`` as API Gateway answers a post it will not deliver (413
``PayloadTooLargeException``: an error the SDK does not retry, so the test waits for no
back-off; a throttled post, 429, takes the same path after two attempts), and forwards
every other request to the gateway unchanged.
"""

from __future__ import annotations

import http.client
import json
import re
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

_CONNECTION = re.compile(r"^/[^/]+/@connections/(?P<id>[^/?]+)$")
_FORWARDED_HEADERS = ("content-type", "x-amzn-requestid", "x-amzn-errortype")
REFUSAL = "PayloadTooLargeException"


class RefusingManagementApi:
    """``backend`` (``http://host:port`` of a gateway's Management API), posts to ``refused``
    answered with :data:`REFUSAL`. ``refusals`` counts them."""

    def __init__(self, backend: str, refused: Iterable[str]):
        self.refused = frozenset(refused)
        self.refusals = 0
        parts = urlsplit(backend)
        host, port = parts.hostname or "127.0.0.1", parts.port or 80
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the proxy pools its connections

            def _serve(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                match = _CONNECTION.match(urlsplit(self.path).path)
                if self.command == "POST" and match and unquote(match.group("id")) in outer.refused:
                    outer.refusals += 1
                    error = {"__type": REFUSAL, "message": "Request entity too large"}
                    self._answer(413, {"x-amzn-ErrorType": REFUSAL}, json.dumps(error).encode())
                    return
                connection = http.client.HTTPConnection(host, port, timeout=10)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    connection.request(self.command, self.path, body=body, headers=headers)
                    response = connection.getresponse()
                    data = response.read()
                    kept = {
                        k: v for k, v in response.getheaders() if k.lower() in _FORWARDED_HEADERS
                    }
                finally:
                    connection.close()
                self._answer(response.status, kept, data)

            def _answer(self, status: int, headers: dict[str, str], data: bytes) -> None:
                self.send_response(status)
                headers.setdefault("Content-Type", "application/json")
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_POST = do_DELETE = _serve

            def log_message(self, *args: object) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> RefusingManagementApi:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.shutdown()
        self._server.server_close()
