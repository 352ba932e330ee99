"""The simulations' in-process DynamoDB behind DynamoDB's own wire protocol, on loopback.

``python -m streamfleet_dev.dsim.dynamodb_server [--host H] [--port P]`` serves
:class:`~streamfleet_dev.dsim.dynamodb_model.DynamoDBModel` over HTTP as DynamoDB does (a POST
whose ``X-Amz-Target`` names the operation, JSON in and out, errors as ``__type`` and
``message``), so that the conformance tests that hold moto and dynalite to the runtime's
contract hold the simulations' store to it too, through botocore, reached by
``AWS_ENDPOINT_URL_DYNAMODB`` like any other backend. It prints the address it listens on, as
the other local servers do (port 0 binds a free one).

Requests run one at a time under a lock: each is atomic, as each DynamoDB request is on its item.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from botocore.exceptions import ClientError

from streamfleet_dev.dsim.dynamodb_model import DynamoDBModel

TARGET_PREFIX = "DynamoDB_20120810."
ERROR_TYPE_PREFIX = "com.amazonaws.dynamodb.v20120810#"
CONTENT_TYPE = "application/x-amz-json-1.0"
# A request body larger than DynamoDB's own limit (16 MB for a batch) is refused unread.
MAX_BODY_BYTES = 16 * 1024 * 1024


def snake_case(operation: str) -> str:
    """``PutItem`` -> ``put_item``: the model's name for a wire operation."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", operation).lower()


class DynamoDBServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], region: str = "us-east-1"):
        super().__init__(address, _Handler)
        self.model = DynamoDBModel(region)
        self.lock = threading.Lock()

    def answer(self, target: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """The status and JSON body DynamoDB would answer ``target`` with."""
        if not target.startswith(TARGET_PREFIX):
            return _error(HTTPStatus.BAD_REQUEST, "UnknownOperationException", target or "none")
        try:
            params = json.loads(body or b"{}")
        except ValueError:
            return _error(HTTPStatus.BAD_REQUEST, "SerializationException", "not JSON")
        if not isinstance(params, dict):
            return _error(HTTPStatus.BAD_REQUEST, "SerializationException", "not an object")
        operation = snake_case(target[len(TARGET_PREFIX) :])
        try:
            with self.lock:
                return HTTPStatus.OK, self.model.call(operation, params)
        except ClientError as exc:
            response = exc.response
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode", 400)
            error = response["Error"]
            answer = {"__type": ERROR_TYPE_PREFIX + error["Code"], "message": error["Message"]}
            for extra in ("Item", "CancellationReasons"):
                if extra in response:
                    answer[extra] = response[extra]
            return status, answer


class _Handler(BaseHTTPRequestHandler):
    server: DynamoDBServer
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore's connection pool expects

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._send(*_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "ValidationException", "body"))
            self.close_connection = True
            return
        body = self.rfile.read(length)
        self._send(*self.server.answer(self.headers.get("X-Amz-Target", ""), body))

    def do_GET(self) -> None:
        # Readiness probes (LocalServer) ask with a GET; DynamoDB answers those with an error.
        self._send(*_error(HTTPStatus.BAD_REQUEST, "MissingAuthenticationTokenException", "GET"))

    def _send(self, status: int, answer: dict[str, Any]) -> None:
        payload = json.dumps(answer, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # a line per request would be the whole log


def _error(status: int, code: str, message: str) -> tuple[int, dict[str, Any]]:
    return status, {"__type": ERROR_TYPE_PREFIX + code, "message": message}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--region", default="us-east-1")
    args = parser.parse_args(argv)
    server = DynamoDBServer((args.host, args.port), args.region)
    host, port = server.server_address[:2]
    print(f"listening at http://{host}:{port}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
