"""The worker's task ARN, from the ECS task metadata endpoint (v4), served by a real local HTTP
server the way ECS serves it (``GET ${ECS_CONTAINER_METADATA_URI_V4}/task``).

A session that claims the wrong task could be ended by another task's STOPPED event, so every
answer that is not a well-formed task ARN stops the worker with a message naming the variable.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from streamfleet import model
from streamfleet.worker.ecs_metadata import MAX_BODY_BYTES, check_task_arn, task_arn

TASK_ARN = (
    "arn:aws:ecs:us-east-1:123456789012:task/streamfleet-cluster/0123456789abcdef0123456789abcdef"
)
VARIABLE = model.ENV_ECS_METADATA_URI


class MetadataServer:
    """``/v4/<container>/task`` answering ``body`` (bytes) with ``status``; records the paths."""

    def __init__(self) -> None:
        self.body = json.dumps({"TaskARN": TASK_ARN, "Cluster": "streamfleet-cluster"}).encode()
        self.status = 200
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.paths.append(self.path)
                if self.path != "/v4/container-1/task":
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(server.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(server.body)))
                self.end_headers()
                self.wfile.write(server.body)

            def log_message(self, *args: object) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        self._thread.start()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}/v4/container-1"

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def metadata() -> Iterator[MetadataServer]:
    server = MetadataServer()
    yield server
    server.close()


async def test_the_task_arn_comes_from_the_task_endpoint(metadata):
    assert await task_arn({VARIABLE: metadata.uri}) == TASK_ARN
    assert metadata.paths == ["/v4/container-1/task"]


async def test_a_trailing_slash_in_the_uri_is_not_doubled(metadata):
    assert await task_arn({VARIABLE: metadata.uri + "/"}) == TASK_ARN
    assert metadata.paths == ["/v4/container-1/task"]


@pytest.mark.parametrize("value", [None, "", "   "])
async def test_outside_ecs_there_is_no_task_arn(value):
    env = {} if value is None else {VARIABLE: value}
    assert await task_arn(env) == ""


async def test_a_uri_that_is_not_http_names_the_variable():
    with pytest.raises(ValueError, match=rf"^{VARIABLE}: 'file:///etc/passwd' is not an http URL"):
        await task_arn({VARIABLE: "file:///etc/passwd"})


async def test_an_endpoint_that_does_not_answer_names_the_variable(metadata):
    uri = metadata.uri
    metadata.close()  # nothing listens there any more
    with pytest.raises(ValueError, match=rf"^{VARIABLE}: .*/task did not answer"):
        await task_arn({VARIABLE: uri})


async def test_an_error_status_names_the_variable(metadata):
    metadata.status = 500
    with pytest.raises(ValueError, match=rf"^{VARIABLE}: .*did not answer"):
        await task_arn({VARIABLE: metadata.uri})


async def test_a_wrong_path_names_the_variable(metadata):
    with pytest.raises(ValueError, match=rf"^{VARIABLE}: .*did not answer"):
        await task_arn({VARIABLE: metadata.uri.replace("container-1", "other")})


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>not json</html>", "the task metadata is not JSON"),
        (b'["TaskARN"]', "the task metadata is not a JSON object"),
        (json.dumps({"Cluster": "c"}).encode(), "TaskARN: 'None' is not an ECS task ARN"),
        (json.dumps({"TaskARN": 42}).encode(), "TaskARN: '42' is not an ECS task ARN"),
        (
            # The short (pre-2018) format names no cluster: refused, every Fargate task has
            # the long one.
            json.dumps(
                {"TaskARN": "arn:aws:ecs:us-east-1:123456789012:task/0123456789abcdef"}
            ).encode(),
            "is not an ECS task ARN",
        ),
        (
            json.dumps({"TaskARN": TASK_ARN.replace(":task/", ":service/")}).encode(),
            "is not an ECS task ARN",
        ),
        (json.dumps({"TaskARN": TASK_ARN + "\n"}).encode(), "is not an ECS task ARN"),
    ],
)
async def test_a_bad_answer_names_the_variable(metadata, body, message):
    metadata.body = body
    with pytest.raises(ValueError, match=rf"^{VARIABLE}") as raised:
        await task_arn({VARIABLE: metadata.uri})
    assert message in str(raised.value)


async def test_an_oversized_answer_is_refused(metadata):
    metadata.body = json.dumps({"TaskARN": TASK_ARN, "pad": "x" * MAX_BODY_BYTES}).encode()
    with pytest.raises(ValueError, match=rf"^{VARIABLE}: the task metadata is larger than 1 MiB"):
        await task_arn({VARIABLE: metadata.uri})


@pytest.mark.parametrize(
    "arn",
    [
        TASK_ARN,
        "arn:aws-us-gov:ecs:us-gov-west-1:123456789012:task/c_1-x/0123456789abcdef0123456789abcdef",
        "arn:aws-cn:ecs:cn-north-1:123456789012:task/c/0123456789abcdef0123456789abcdef",
    ],
)
def test_task_arns_of_every_partition_are_accepted(arn):
    assert check_task_arn("field", arn) == arn


@pytest.mark.parametrize(
    "arn",
    [
        "",
        "arn:aws:ecs:us-east-1:12345678901:task/c/0123456789abcdef0123456789abcdef",  # 11 digits
        "arn:aws:ecs:us-east-1:123456789012:task/c/0123456789ABCDEF0123456789ABCDEF",  # upper
        "arn:aws:ecs:us-east-1:123456789012:task/c/0123456789abcdef0123456789abcde",  # 31 hex
        "arn:aws:ecs:us-east-1:123456789012:task/c d/0123456789abcdef0123456789abcdef",
        "arn:aws:ec2:us-east-1:123456789012:task/c/0123456789abcdef0123456789abcdef",
    ],
)
def test_anything_else_is_refused_naming_the_field(arn):
    with pytest.raises(ValueError, match=r"^detail\.taskArn: .* is not an ECS task ARN"):
        check_task_arn("detail.taskArn", arn)
