"""A REST API on a local HTTP port: requests become API Gateway proxy events (format 1.0).

For local mode and tests only; in AWS, API Gateway does this. ``make_server(handler=...)`` calls
any handler: local mode passes the event router running from its synthesized asset (a
:class:`~streamfleet_dev.emulator.lambda_runner.LambdaProcess`) and the API's methods from the
template (:meth:`~streamfleet_dev.assembly.Stack.rest_methods`); a request for a method the
template does not declare gets API Gateway's own answer (403 ``Missing Authentication Token``)
without reaching the handler. Without a handler the router is imported from the repository
(tests of its code). IAM authorization (SigV4) is not checked here.

Run the repository's router with its environment set (``TABLE_NAME``, ``QUEUE_URL``,
``ALLOWED_UPSTREAMS``, ``AWS_ENDPOINT_URL*``)::

    python -m streamfleet_dev.emulator.http_adapter --port 8080
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

Handler = Callable[[dict[str, Any], Any], dict[str, Any]]
# API Gateway's own payload limit; the router applies its much smaller MAX_BODY_BYTES.
MAX_REQUEST_BYTES = 10 * 1024 * 1024
TEXT_TYPES = ("application/json", "text/")
# What a REST API answers for a path or method it does not have (no integration runs).
MISSING_ROUTE = (403, {"message": "Missing Authentication Token"})
INTEGRATION_FAILED = {"message": "Internal server error"}  # a Lambda proxy that raised


@dataclass(frozen=True)
class Route:
    """One method of the API: ``GET /connections/{connection_id}``."""

    method: str
    resource: str

    def match(self, path: str) -> dict[str, str] | None:
        """The path parameters if ``path`` is this resource (``None`` if it is not)."""
        pattern = "".join(
            f"(?P<{part[1:-1]}>[^/]+)" if part.startswith("{") else re.escape(part)
            for part in re.split(r"(\{[^}/]+\})", self.resource.rstrip("/") or "/")
        )
        found = re.fullmatch(pattern, path.rstrip("/") or "/")
        if found is None:
            return None
        return {name: unquote(value) for name, value in found.groupdict().items()}


def router_routes() -> tuple[Route, ...]:
    """The event router's own resources (what the template declares for it)."""
    from streamfleet import event_router

    return (
        Route("POST", event_router.EVENTS_RESOURCE),
        Route("GET", event_router.CONNECTION_RESOURCE),
    )


def _resource_of(
    method: str, path: str, routes: Iterable[Route]
) -> tuple[str, dict[str, str] | None, bool]:
    """(resource, path parameters, whether the method exists on it)."""
    for route in routes:
        parameters = route.match(path)
        if parameters is not None:
            same_resource = [r for r in routes if r.resource == route.resource]
            known = any(r.method in (method, "ANY") for r in same_resource)
            return route.resource, parameters or None, known
    return path, None, False


def proxy_event(
    method: str,
    raw_path: str,
    headers: dict[str, str],
    body: bytes | None,
    routes: Iterable[Route] | None = None,
) -> dict[str, Any]:
    """The API Gateway REST proxy event (payload 1.0) API Gateway would send for this request.

    ``routes`` (default: the router's) name the resources, so ``resource`` and
    ``pathParameters`` are what API Gateway fills in. Bodies that are not declared as text are
    base64-encoded with ``isBase64Encoded`` set, as API Gateway does for binary media types, so
    the router's decoding path gets exercised.
    """
    parts = urlsplit(raw_path)
    path = parts.path or "/"
    resource, path_parameters, _ = _resource_of(
        method, path, tuple(routes if routes is not None else router_routes())
    )
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


def make_server(
    host: str = "127.0.0.1",
    port: int = 0,
    handler: Handler | None = None,
    routes: Iterable[Route] | None = None,
):
    """A ThreadingHTTPServer calling ``handler`` (default: the repository's event router).

    ``routes``: the API's methods (from the template); a request for any other method or path is
    answered as API Gateway answers it, without calling ``handler``. Without ``routes`` every
    request reaches the handler (the router's resources name the events). Port 0: any free
    port; read it from ``server.server_address``.
    """
    if handler is None:
        from streamfleet import event_router

        handler = event_router.handler
    call = handler
    declared = tuple(routes) if routes is not None else None
    known_routes = declared if declared is not None else router_routes()

    class RequestHandler(BaseHTTPRequestHandler):
        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_REQUEST_BYTES:
                self.send_error(413)
                return
            body = self.rfile.read(length) if length else None
            path = urlsplit(self.path).path or "/"
            if declared is not None and not _resource_of(self.command, path, declared)[2]:
                status, payload = MISSING_ROUTE
                result = {"statusCode": status, "body": json.dumps(payload)}
            else:
                headers = dict(self.headers.items())
                event = proxy_event(self.command, self.path, headers, body, known_routes)
                context = SimpleNamespace(aws_request_id=event["requestContext"]["requestId"])
                try:
                    result = call(event, context)
                except Exception:  # the function failed: API Gateway answers 502, says no more
                    result = {"statusCode": 502, "body": json.dumps(INTEGRATION_FAILED)}
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
