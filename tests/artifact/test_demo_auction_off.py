"""The app without the demo auction (``streamfleet:demo_auction=false``), as synthesized.

The demo is added by the app's stacks; without it the deployed core carries none of it: the
handler runs the core's entry point from an asset without ``streamfleet_auction``, the API has
no ``bid`` route, the handler no ``STATE_HOME_REGION`` and no cross-Region statement. Run from
its asset, the handler answers ``bid`` as it answers any unknown action.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from streamfleet import model
from streamfleet_auction import names as auction_names
from streamfleet_cdk.websocket_api import HANDLER_ACTIONS
from streamfleet_dev.assembly import CloudAssembly, load, synthesize
from streamfleet_dev.emulator.lambda_runner import LambdaProcess, LambdaSpec, lambda_sdk_dir
from tests.assembly_support import CORE_HANDLER_ENTRY

pytestmark = pytest.mark.slow
WS_STACKS = ("StreamFleet-WebSocket-Primary", "StreamFleet-WebSocket-Secondary")


@pytest.fixture(scope="module")
def assembly() -> CloudAssembly:
    """``cdk synth -c streamfleet:demo_auction=false`` (cached by a hash of its inputs)."""
    return load(synthesize({"demo_auction": False}))


def test_the_core_handler_ships_without_the_demo(assembly: CloudAssembly) -> None:
    for name in WS_STACKS:
        stack = assembly.stack(name)
        handler = stack.function_with_handler(CORE_HANDLER_ENTRY)
        assert handler.asset_dir is not None
        top_level = {path.name for path in handler.asset_dir.iterdir()}
        assert top_level == {"streamfleet"}, (name, top_level)
        assert not list(handler.asset_dir.rglob("*auction*")), name
        handlers = {f.handler for f in stack.functions()}
        assert auction_names.HANDLER_ENTRY not in handlers
        (api,) = stack.websocket_apis()
        assert set(api.route_keys) == {"$connect", "$disconnect", "$default", *model.WS_ROUTES}
        assert auction_names.ENV_STATE_HOME_REGION not in handler.environment
        template = json.dumps(stack.template)
        for absent in ("dynamodb:LeadingKeys", auction_names.AUCTION_PREFIX, "STATE_HOME_REGION"):
            assert absent not in template, (name, absent)
        # On the state table, the handler may do what the core calls, and no more.
        (statement,) = [
            s
            for resource in stack.of_type("AWS::IAM::Policy").values()
            if {"Ref": handler.role} in resource["Properties"]["Roles"]
            for s in resource["Properties"]["PolicyDocument"]["Statement"]
            if "StateTable" in json.dumps(s["Resource"])
            or model.DEFAULT_WSAPI_STATE_TABLE_NAME in json.dumps(s["Resource"])
        ]
        assert sorted(_as_list(statement["Action"])) == sorted(HANDLER_ACTIONS["state_table"])


def _as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


class _Management(BaseHTTPRequestHandler):
    """The Management API: every post_to_connection recorded (path, JSON body)."""

    posts: list[tuple[str, Any]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.posts.append((self.path, json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def management() -> Iterator[tuple[str, list[tuple[str, Any]]]]:
    posts: list[tuple[str, Any]] = []
    handler = type("Recording", (_Management,), {"posts": posts})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", posts
    finally:
        server.shutdown()
        server.server_close()


def test_the_core_handler_from_its_asset_answers_bid_as_an_unknown_action(
    assembly: CloudAssembly, management, tmp_path: Path
) -> None:
    endpoint, posts = management
    stack = assembly.stack(WS_STACKS[0])
    function = stack.function_with_handler(CORE_HANDLER_ENTRY)
    spec = LambdaSpec.for_function(
        function,
        {
            model.ENV_STATE_TABLE_NAME: "state",
            model.ENV_CONNECTIONS_TABLE_NAME: "connections",
            model.ENV_APIGW_MANAGEMENT_ENDPOINT: endpoint,
        },
        region=stack.region,
    )
    event = {
        "requestContext": {
            "routeKey": "$default",
            "eventType": "MESSAGE",
            "connectionId": "c1",
            "authorizer": {"sub": "alice"},
        },
        "body": json.dumps({"action": "bid", "auction": "a1", "amount": 5, "requestId": "b1"}),
        "isBase64Encoded": False,
    }
    with LambdaProcess(spec, sdk_dir=lambda_sdk_dir(), log_path=tmp_path / "handler.log") as run:
        assert run.invoke(event) == {"statusCode": 200}
        assert not any("auction" in module for module in run.modules())
    ((path, reply),) = posts
    assert path.endswith("/@connections/c1"), path
    assert reply == {
        "type": model.WS_REPLY_ERROR,
        "error": "bad_request",
        "message": "action: unknown action 'bid' (expected heartbeat, getState, subscribe, "
        "unsubscribe)",
        "field": "action",
        "region": stack.region,
        "requestId": "b1",
    }
