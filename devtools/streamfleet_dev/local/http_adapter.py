"""The event router on a local HTTP port: requests become API Gateway proxy events (format 1.0).

For local mode and tests only; in AWS, API Gateway does this. Run it with the router's
environment set (``TABLE_NAME``, ``QUEUE_URL``, ``ALLOWED_UPSTREAMS``, ``AWS_ENDPOINT_URL*``)::

    python -m streamfleet_dev.local.http_adapter --port 8080
"""

from __future__ import annotations

import argparse
import base64
import threading
import time
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from streamfleet import event_router

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
# API Gateway's own payload limit; the router applies its much smaller MAX_BODY_BYTES.
MAX_REQUEST_BYTES = 10 * 1024 * 1024
TEXT_TYPES = ("application/json", "text/")


def proxy_event(
    method: str, raw_path: str, headers: dict[str, str], body: bytes | None
) -> dict[str, Any]:
    """The API Gateway REST proxy event (payload 1.0) API Gateway would send for this request.

    Bodies that are not declared as text are base64-encoded with ``isBase64Encoded`` set, as
    API Gateway does for binary media types, so the router's decoding path gets exercised.
    """
    parts = urlsplit(raw_path)
    path = parts.path or "/"
    resource, path_parameters = path, None
    segments = path.rstrip("/").split("/")
    if path.rstrip("/") == event_router.EVENTS_RESOURCE:
        resource = event_router.EVENTS_RESOURCE
    elif len(segments) == 3 and segments[1] == "connections" and segments[2]:
        resource = event_router.CONNECTION_RESOURCE
        path_parameters = {event_router.CONNECTION_ID: unquote(segments[2])}
    query = parse_qs(parts.query, keep_blank_values=True)
    content_type = next((v for k, v in headers.items() if k.lower() == "content-type"), "")
    is_text = any(content_type.startswith(kind) for kind in TEXT_TYPES)
    if not body:
        body_field: str | None = None
        is_base64 = False
    elif is_text:
        try:
            body_field, is_base64 = body.decode("utf-8"), False
        except UnicodeDecodeError:
            body_field, is_base64 = base64.b64encode(body).decode("ascii"), True
    else:
        body_field, is_base64 = base64.b64encode(body).decode("ascii"), True
    return {
        "resource": resource,
        "path": path,
        "httpMethod": method,
        "headers": headers,
        "multiValueHeaders": {name: [value] for name, value in headers.items()},
        "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
        "multiValueQueryStringParameters": query or None,
        "pathParameters": path_parameters,
        "stageVariables": None,
        "requestContext": {
            "resourcePath": resource,
            "httpMethod": method,
            "path": path,
            "stage": "local",
            "requestId": str(uuid.uuid4()),
            "requestTimeEpoch": time.time_ns() // 1_000_000,
            "identity": {"sourceIp": "127.0.0.1"},
        },
        "body": body_field,
        "isBase64Encoded": is_base64,
    }


def make_server(host: str = "127.0.0.1", port: int = 0, handler: Handler | None = None):
    """A ThreadingHTTPServer calling ``handler`` (default: the event router). Port 0: any free
    port; read it from ``server.server_address``."""
    call = handler or event_router.handler

    class RequestHandler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST_BYTES:
                self.send_error(413)
                return
            body = self.rfile.read(length) if length else None
            event = proxy_event(self.command, self.path, dict(self.headers.items()), body)
            context = SimpleNamespace(aws_request_id=event["requestContext"]["requestId"])
            result = call(event, context)
            payload = result.get("body") or ""
            data = base64.b64decode(payload) if result.get("isBase64Encoded") else payload.encode()
            self.send_response(result.get("statusCode", 500))
            for name, value in (result.get("headers") or {}).items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = _serve

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the router logs one JSON line per request already

    return ThreadingHTTPServer((host, port), RequestHandler)


def serve_in_thread(server: ThreadingHTTPServer) -> threading.Thread:
    """Run ``server`` in a daemon thread; stop it with ``server.shutdown()``."""
    thread = threading.Thread(target=server.serve_forever, name="http-adapter", daemon=True)
    thread.start()
    return thread


def main() -> None:
    """Serve the event router until interrupted."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args()
    server = make_server(args.host, args.port)
    print(f"event router on http://{args.host}:{server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
