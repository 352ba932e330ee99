"""Least privilege against behaviour: every role allows what its component calls, and no more.

Each component runs as deployed and calls AWS through the recording proxy with an access key id
of its own: the event router, the WebSocket handler, the authorizer, the canary, the live
fan-out and the stream lookup from their asset directories
(:mod:`streamfleet_dev.emulator.lambda_runner`), and real worker processes from the task
definition's command and environment (:mod:`streamfleet_dev.emulator.container`), driven through
what exercises every path that calls AWS: START notifications, messages and checkpoints, a
STOP, a ``kill -9`` and the takeover of the dead worker's streams, a SIGTERM handoff and the
claim of what it handed over; for the fan-out, a batch of stream records posted to a live
subscriber, one gone without a ``$disconnect``, one whose posts are refused (closed) and one
refused and already gone; for the lookup, CloudFormation's Create, Update and Delete. Then each
recorded request becomes an IAM question (action, resource ARN in the template's own terms,
condition values) and the component's synthesized role must answer yes to each, while every
action and resource it grants must have been used. A failure names the component, the role and
the permission.

What AWS itself does with a role cannot be recorded here: Lambda's writes to the function's log
stream are never expected in the calls (:data:`~streamfleet_dev.iam.PLATFORM_ACTIONS`), and for
a function behind an event source mapping, the mapping's reads of its stream and its sends to
its on-failure destination are added to the recorded calls from the synthesized mapping, with
the permissions AWS documents for them (:func:`_event_source_calls`).

This reflects what the code does when the test runs: change what a component calls and this
test says which permission to add or remove.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import signal
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from streamfleet import model
from streamfleet_auction import names as auction_names
from streamfleet_dev.assembly import LOCAL_ACCOUNT, Bindings, Stack, reference_of, resolve
from streamfleet_dev.checks import stored_log
from streamfleet_dev.emulator.container import container_launch, image_python
from streamfleet_dev.emulator.lambda_runner import rest_proxy_event, scheduled_event
from streamfleet_dev.emulator.websocket_gateway import FailureMode
from streamfleet_dev.iam import Call, NameMap, calls_of, check, statements_of
from streamfleet_dev.tables import create_table
from streamfleet_dev.upstream.process import UpstreamProcess
from tests.assembly_support import (
    CANARY_ENTRY,
    HANDLER_ENTRY,
    ROUTER_ENTRY,
    SECRET_NAME,
    CloudFormationResponses,
    build_world,
    client,
    eventually,
    function_with_handler,
    user_token,
    websocket_region,
)
from tests.management_faults import RefusingManagementApi

pytestmark = pytest.mark.slow
ROLE = "primary"  # the secondary's roles are built by the same constructs
WORKER_KEY = f"worker-{ROLE}"
REPO = Path(__file__).resolve().parents[2]
FANOUT_ENTRY = "streamfleet.wsapi.fanout.handler"
LOOKUP_ENTRY = "streamfleet.wsapi.stream_lookup.handler"


@pytest.fixture(scope="module")
def world(servers, tmp_path_factory):
    yield from build_world(servers, tmp_path_factory.mktemp("iam"))


def _router_call(router, method: str, resource: str, body=None, connection_id: str = "") -> int:
    parameters = {"connection_id": connection_id} if "{connection_id}" in resource else None
    event = rest_proxy_event(
        method, resource, path_parameters=parameters, body=json.dumps(body) if body else None
    )
    return router.invoke(event)["statusCode"]


class Workers:
    """Worker processes started as ECS would start the task definition's container."""

    def __init__(self, world, tmp):
        region = world.regions[ROLE]
        (self.container,) = region.fleet.stack.containers()
        self.environment = region.fleet.environment(self.container.environment)
        self.region = region.name
        self.image_bin = image_python(self.container.image_dir)
        self.proxy = world.proxy.endpoint
        self.tmp = tmp
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        launch = container_launch(
            self.container,
            self.environment,
            image_bin=self.image_bin,
            overrides={
                # What Fargate gives the task: its Region and the task role's credentials.
                "AWS_REGION": self.region,
                "AWS_DEFAULT_REGION": self.region,
                "AWS_ACCESS_KEY_ID": WORKER_KEY,
                "AWS_SECRET_ACCESS_KEY": "local",
                # Local only: the servers behind the proxy; one host, so a port per worker,
                # which each binds itself.
                "AWS_ENDPOINT_URL": self.proxy,
                "HEALTH_PORT": "0",
            },
        )
        log = open(self.tmp / f"worker-{len(self.processes)}.log", "wb")  # noqa: SIM115
        process = subprocess.Popen(
            launch.argv, env=dict(launch.env), cwd=launch.cwd, stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()

    def logs(self) -> str:
        return "\n".join(
            (self.tmp / f"worker-{i}.log").read_text(errors="replace")[-3000:]
            for i in range(len(self.processes))
        )


def _rows(world, table: str, stream_ids: list[str]) -> dict[str, dict]:
    dynamodb = client("dynamodb", world.dynalite, world.regions[ROLE].name)
    return {
        stream_id: dynamodb.get_item(
            TableName=table,
            Key={model.PK: {"S": model.connection_pk(stream_id)}},
            ConsistentRead=True,
        ).get("Item", {})
        for stream_id in stream_ids
    }


def _owners(world, table: str, stream_ids: list[str]) -> dict[str, str | None]:
    rows = _rows(world, table, stream_ids)
    return {s: row.get(model.LEASE_OWNER, {}).get("S") for s, row in rows.items()}


def _stored(world, workers: Workers, stream_ids: list[str]) -> bool:
    """Each stream has messages in the messages table: its owner stored what it received."""
    reader = client("dynamodb", world.proxy.endpoint, workers.region)  # not a component's key
    table = workers.environment[model.ENV_MESSAGES_TABLE_NAME]
    return all(stored_log(reader, table, stream_id) for stream_id in stream_ids)


def _live_sessions(world, table: str) -> set[str]:
    dynamodb = client("dynamodb", world.dynalite, world.regions[ROLE].name)
    pages = dynamodb.get_paginator("scan").paginate(TableName=table, ConsistentRead=True)
    return {
        item[model.SESSION_OWNER]["S"]
        for page in pages
        for item in page["Items"]
        if item[model.PK]["S"].startswith(model.SESSION_PREFIX)
        and item.get(model.SESSION_STATE, {}).get("S") == model.SessionState.LIVE.value
    }


async def _drive_fleet(world, tmp) -> None:
    region = world.regions[ROLE]
    router_function = function_with_handler(region.fleet.stack, ROUTER_ENTRY)
    router = world.start_function(region.fleet, router_function, access_key=f"router-{ROLE}")
    lease_table = region.fleet.environment({"t": router_function.environment["TABLE_NAME"]})["t"]
    workers = Workers(world, tmp)
    suffix = uuid.uuid4().hex[:6]
    streams = [f"iam-{suffix}-{n}" for n in range(4)]
    with UpstreamProcess(rate=20, log_path=tmp / "upstream.log") as upstream:
        try:
            first = workers.start()

            def start(stream_id: str) -> int:
                body = {
                    "event_type": "START",
                    "connection_id": stream_id,
                    "ws_url": upstream.url_for(stream_id),
                }
                return _router_call(router, "POST", "/events", body)

            for stream_id in streams[:3]:
                assert start(stream_id) == 201
            owners = await eventually(
                lambda: (o := _owners(world, lease_table, streams[:3])) and all(o.values()) and o,
                timeout=30,
                what=f"the first worker owns the STARTed streams\n{workers.logs()}",
            )
            first_id = owners[streams[0]]
            await eventually(
                lambda: all(upstream.stats()["connected"].get(s) for s in streams[:3]),
                timeout=15,
                what="the worker is connected to every stream",
            )
            await eventually(
                lambda: _stored(world, workers, streams[:3]),
                timeout=30,
                what=f"messages stored\n{workers.logs()}",
            )
            assert (
                _router_call(
                    router, "GET", "/connections/{connection_id}", connection_id=streams[0]
                )
                == 200
            )
            stop = {"event_type": "STOP", "connection_id": streams[0]}
            assert _router_call(router, "POST", "/events", stop) == 200
            await eventually(
                lambda: not upstream.stats()["connected"].get(streams[0]),
                timeout=15,
                what="the STOPped stream is closed",
            )
            workers.start()
            await eventually(
                lambda: len(_live_sessions(world, lease_table)) == 2,
                timeout=30,
                what=f"the second worker's session exists\n{workers.logs()}",
            )
            first.send_signal(signal.SIGKILL)
            first.wait()
            await eventually(
                lambda: all(
                    owner not in (None, first_id)
                    for owner in _owners(world, lease_table, streams[1:3]).values()
                ),
                timeout=30,
                what=f"the dead worker's streams taken over\n{workers.logs()}",
            )
            assert start(streams[3]) == 201
            await eventually(
                lambda: _owners(world, lease_table, [streams[3]])[streams[3]],
                timeout=30,
                what="a START while a worker runs is claimed",
            )
            second = workers.processes[1]
            second.send_signal(signal.SIGTERM)  # handoff: release and notify each stream
            assert await asyncio.to_thread(second.wait, 30) == 0, workers.logs()
            third = workers.start()
            await eventually(
                lambda: all(_owners(world, lease_table, streams[1:]).values()),
                timeout=30,
                what=f"the handed-over streams claimed again\n{workers.logs()}",
            )
            await eventually(
                lambda: all(upstream.stats()["connected"].get(s) for s in streams[1:]),
                timeout=15,
                what="the third worker is connected to every stream it holds",
            )
            third.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(third.wait, 30) == 0, workers.logs()
        finally:
            workers.stop_all()


def _live_tables(api) -> dict[str, str]:
    """The local names of the tables live delivery reads (from the handler's template)."""
    return api.region.websocket.environment(
        {
            name: api.handler_function.environment[name]
            for name in (model.ENV_STREAMS_TABLE_NAME, model.ENV_MESSAGES_TABLE_NAME)
        }
    )


def _start_stream(world, api, stream: str, *, message: bool) -> None:
    """``stream`` STARTed for user-1 (as the router writes it), with ``message``: one stored."""
    env = _live_tables(api)
    setup = client("dynamodb", world.proxy.endpoint, api.region.name)  # not a component's key
    setup.put_item(
        TableName=env[model.ENV_STREAMS_TABLE_NAME],
        Item={
            model.PK: {"S": model.connection_pk(stream)},
            model.DESIRED_STATE: {"S": model.DesiredState.STARTED.value},
            model.READERS: {"SS": ["user:user-1"]},
        },
    )
    if message:
        setup.put_item(
            TableName=env[model.ENV_MESSAGES_TABLE_NAME],
            Item={
                model.PK: {"S": model.connection_pk(stream)},
                model.SEQ: {"N": "1"},
                model.MESSAGE_DATA: {"S": "hello"},
            },
        )


async def _ask(socket, message: dict, wanted: str) -> dict:
    await socket.send(json.dumps(message))
    while True:  # replayed frames may come first; the reply carries the requestId
        reply = json.loads(await asyncio.wait_for(socket.recv(), 10))
        if reply.get("requestId") == message["requestId"]:
            assert reply.get("type") == wanted, reply
            return reply


async def _drive_live_delivery(world, api, socket) -> None:
    """subscribe (a replay after a seq, then the newest), unsubscribe, and a subscription
    left for $disconnect to remove, on a stream STARTed for this user with one stored message."""
    stream = f"iam-live-{uuid.uuid4().hex[:6]}"
    _start_stream(world, api, stream, message=True)
    subscribe = {"action": model.WS_ROUTE_SUBSCRIBE, "stream": stream}
    await _ask(
        socket, {**subscribe, "requestId": "sub-after", "after": 0}, model.WS_REPLY_SUBSCRIBED
    )
    await _ask(
        socket, {**subscribe, "requestId": "sub-newest", "after": None}, model.WS_REPLY_SUBSCRIBED
    )
    await _ask(
        socket,
        {"action": model.WS_ROUTE_UNSUBSCRIBE, "stream": stream, "requestId": "unsub"},
        model.WS_REPLY_UNSUBSCRIBED,
    )
    await _ask(
        socket, {**subscribe, "requestId": "sub-kept", "after": 1}, model.WS_REPLY_SUBSCRIBED
    )


def _stream_record(event_name: str, item: dict[str, Any], *, region: str, table: str) -> dict:
    """One record of the messages table's stream as Lambda's event source mapping hands it
    to the function (DynamoDB JSON; the table's stream view is NEW_IMAGE)."""
    payload: dict[str, Any] = {
        "ApproximateCreationDateTime": time.time(),
        "Keys": {name: item[name] for name in (model.PK, model.SEQ)},
        "SequenceNumber": str(time.time_ns()),
        "SizeBytes": len(json.dumps(item)),
        "StreamViewType": "NEW_IMAGE",
    }
    if event_name != "REMOVE":
        payload["NewImage"] = item
    return {
        "eventID": uuid.uuid4().hex,
        "eventName": event_name,
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": region,
        "dynamodb": payload,
        "eventSourceARN": f"arn:aws:dynamodb:{region}:{LOCAL_ACCOUNT}:table/{table}/stream/local",
    }


async def _new_connection(api, known: set[str]) -> str:
    ids = await eventually(
        lambda: set(api.gateway.connection_ids) - known,
        timeout=10,
        what="the gateway registers the new connection",
    )
    (connection_id,) = ids
    known.add(connection_id)
    return connection_id


async def _drive_fanout(world, api, token: str) -> None:
    """The fan-out from its asset on one batch of stream records (inserts, a rewrite, a
    removal) of a stream with four subscribers and of a stream nobody subscribed to: a
    connected subscriber gets the messages; one gone without a ``$disconnect`` (410) is
    forgotten; one whose posts are refused is closed (DELETE); one refused and gone by the
    time it is closed is forgotten."""
    region = api.region
    stack = region.websocket.stack
    function = function_with_handler(stack, FANOUT_ENTRY)
    subscriptions = region.websocket.environment(
        {"t": function.environment[model.ENV_SUBSCRIPTIONS_TABLE_NAME]}
    )["t"]
    messages_table = _live_tables(api)[model.ENV_MESSAGES_TABLE_NAME]
    suffix = uuid.uuid4().hex[:6]
    stream, quiet = f"iam-fan-{suffix}", f"iam-quiet-{suffix}"
    fanout = await asyncio.to_thread(
        world.start_function,
        region.websocket,
        function,
        access_key=f"fanout-{ROLE}",
        # The stage's Management API through the recording proxy.
        extra_env={model.ENV_APIGW_MANAGEMENT_ENDPOINT: api.management_url},
    )
    _start_stream(world, api, stream, message=False)
    gone, refused_gone = f"gone-{suffix}=", f"refused-gone-{suffix}="
    setup = client("dynamodb", world.proxy.endpoint, region.name)  # not a component's key
    known = set(api.gateway.connection_ids)
    disconnects = api.gateway.stats.invocations.get("$disconnect", 0)
    subprotocols = [model.WS_APP_SUBPROTOCOL, f"bearer.{token}"]
    async with contextlib.AsyncExitStack() as sockets:
        receiver = await sockets.enter_async_context(
            connect(api.url, subprotocols=subprotocols, open_timeout=10)
        )
        await _new_connection(api, known)
        refused = await sockets.enter_async_context(
            connect(api.url, subprotocols=subprotocols, open_timeout=10)
        )
        refused_id = await _new_connection(api, known)
        subscribe = {"action": model.WS_ROUTE_SUBSCRIBE, "stream": stream, "after": None}
        for n, socket in enumerate((receiver, refused)):
            await _ask(socket, {**subscribe, "requestId": f"f{n}"}, model.WS_REPLY_SUBSCRIBED)
        # Subscriptions of clients that left without a $disconnect (as subscribe wrote them).
        for connection_id in (gone, refused_gone):
            setup.put_item(
                TableName=subscriptions,
                Item={
                    model.PK: {"S": model.stream_subscribers_pk(stream)},
                    model.SUB_CONNECTION: {"S": connection_id},
                    model.SUB_USER_ID: {"S": "user-1"},
                    model.SUB_EXPIRES_AT: {"N": str(int(time.time()) + 3600)},
                },
            )
        now_ms = int(time.time() * 1000)

        def stored(stream_id: str, seq: int, data: str) -> dict[str, Any]:
            return {
                model.PK: {"S": model.connection_pk(stream_id)},
                model.SEQ: {"N": str(seq)},
                model.MESSAGE_DATA: {"S": data},
                model.MESSAGE_RECEIVED_AT_MS: {"N": str(now_ms)},
            }

        records = [
            ("INSERT", stored(stream, 1, "one")),
            ("INSERT", stored(stream, 2, "two")),
            ("MODIFY", stored(stream, 2, "two")),  # a resumed worker's rewrite
            ("REMOVE", stored(stream, 3, "")),  # an unsealed tail removed: nothing to send
            ("INSERT", stored(quiet, 1, "nobody listens")),
        ]
        event = {
            "Records": [
                _stream_record(name, item, region=region.name, table=messages_table)
                for name, item in records
            ]
        }
        gateway_management = world.proxy.service_backends["execute-api"]
        with RefusingManagementApi(gateway_management, {refused_id, refused_gone}) as faults:
            world.proxy.service_backends["execute-api"] = faults.endpoint
            try:
                result = await asyncio.to_thread(fanout.invoke, event)
            finally:
                world.proxy.service_backends["execute-api"] = gateway_management
        assert result == {"batchItemFailures": []}, fanout.log_text()[-2000:]
        frame = json.loads(await asyncio.wait_for(receiver.recv(), 10))
        assert (frame["type"], frame["stream"], frame["source"]) == (
            model.WS_REPLY_MESSAGES,
            stream,
            "live",
        ), frame
        assert [m["seq"] for m in frame["messages"]] == [1, 2], frame
        await asyncio.wait_for(refused.wait_closed(), 10)  # closed through the Management API
        assert faults.refusals == 2, faults.refusals  # one post each, not retried
        left = setup.query(
            TableName=subscriptions,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": model.PK},
            ExpressionAttributeValues={":pk": {"S": model.stream_subscribers_pk(stream)}},
            ConsistentRead=True,
        )["Items"]
        remaining = {item[model.SUB_CONNECTION]["S"] for item in left}
        assert not remaining & {gone, refused_gone}, remaining  # forgotten
        (metrics,) = fanout.emf_documents()
        assert (
            metrics[model.METRIC_FANOUT_POSTS],
            metrics[model.METRIC_FANOUT_GONE],
            metrics[model.METRIC_FANOUT_FAILED_POSTS],
            metrics[model.METRIC_FANOUT_DISCONNECTED],
        ) == (1, 1, 2, 1), metrics
    await eventually(
        lambda: api.gateway.stats.invocations.get("$disconnect", 0) >= disconnects + 2,
        timeout=10,
        what="$disconnect of the fan-out's two subscribers",
    )


async def _drive_websocket(world) -> None:
    region = world.regions[ROLE]
    async with websocket_region(world, ROLE) as api:
        issuer = api.authorizer_function.environment["JWT_ISSUER"]
        audience = api.authorizer_function.environment["JWT_AUDIENCE"]
        token = user_token(world.idp_key, issuer=issuer, audience=audience)
        async with connect(
            api.url, subprotocols=[model.WS_APP_SUBPROTOCOL, f"bearer.{token}"], open_timeout=10
        ) as socket:
            for message in (
                {"action": model.WS_ROUTE_HEARTBEAT, "requestId": "h"},
                {"action": model.WS_ROUTE_GET_STATE, "requestId": "s", "auction": "iam"},
                {
                    "action": auction_names.WS_ROUTE_BID,
                    "requestId": "b",
                    "auction": "iam",
                    "amount": 5,
                },
                {"action": "nothing", "requestId": "d"},
            ):
                await socket.send(json.dumps(message))
            for _ in range(4):
                await asyncio.wait_for(socket.recv(), 10)
            await _drive_live_delivery(world, api, socket)
            # A message event without the authorizer's context: the handler falls back on the
            # connection record $connect wrote (a path API Gateway's events may take).
            (connection_id,) = api.gateway.connection_ids
            bare = {
                "requestContext": {
                    "routeKey": model.WS_ROUTE_GET_STATE,
                    "eventType": "MESSAGE",
                    "connectionId": connection_id,
                    "requestId": "bare",
                    "stage": api.stage,
                    "domainName": api.gateway.domain_name,
                    "apiId": region.api_id,
                },
                "body": json.dumps({"action": model.WS_ROUTE_GET_STATE, "requestId": "bare"}),
                "isBase64Encoded": False,
            }
            await asyncio.to_thread(api.handler.invoke, bare)
            reply = json.loads(await asyncio.wait_for(socket.recv(), 10))
            assert reply.get("type") == model.WS_REPLY_STATE, reply
        await eventually(
            lambda: api.gateway.stats.invocations.get("$disconnect"),
            timeout=10,
            what="$disconnect invoked",
        )
        canary_function = function_with_handler(region.websocket.stack, CANARY_ENTRY)
        canary = await asyncio.to_thread(api.start_canary, world, canary_function, f"canary-{ROLE}")
        minutes = itertools.count(int(time.time() // 60) - 10)  # one tick a minute, as scheduled

        def tick() -> dict[str, Any]:
            return scheduled_event(
                region.name,
                region.websocket.stack.account,
                "arn:aws:events:::rule/x",
                at=next(minutes) * 60,
            )

        for _ in range(2):  # a second run reads the hysteresis state the first one saved
            result = await asyncio.to_thread(canary.invoke, tick())
            assert result["healthy"] is True, result
        # The Region degrades with a client connected: the canary's probes fail, it trips, and
        # (when its code does that) it closes the Region's client connections so they fail over.
        async with connect(
            api.url, subprotocols=[model.WS_APP_SUBPROTOCOL, f"bearer.{token}"], open_timeout=10
        ) as client_socket:
            api.gateway.fail(FailureMode.THROTTLED)
            try:
                for _ in range(3):
                    result = await asyncio.to_thread(canary.invoke, tick())
                    assert result["healthy"] is False, result
            finally:
                api.gateway.recover()
            del client_socket
        await _drive_fanout(world, api, token)


def _drive_stream_lookup(world) -> None:
    """The stream lookup from its asset, as CloudFormation calls its custom resource: Create
    and Update read the stream of the table the resource names, Delete reads nothing."""
    region = world.regions[ROLE]
    stack = region.websocket.stack
    function = function_with_handler(stack, LOOKUP_ENTRY)
    (properties,) = [
        r["Properties"]
        for r in stack.resources.values()
        if reference_of(r.get("Properties", {}).get("ServiceToken")) == function.logical_id
    ]
    # The table's local name (the template names it: a table of the fleet's stack).
    table = region.websocket.environment({"t": properties["TableName"]})["t"]
    # The fleet's tables live on dynalite, which has no streams: for the lookup, the table of
    # that name is a twin on moto (same definition, so with its stream), then dynalite again.
    (created,) = [t for t in region.fleet.tables.values() if t.name == table]
    moto_dynamodb = client("dynamodb", world.moto, region.name)
    create_table(moto_dynamodb, created.definition, table)
    world.proxy.route_table(table, world.moto)
    lookup = world.start_function(region.websocket, function, access_key=f"lookup-{ROLE}")
    responses = CloudFormationResponses()
    try:
        for request_type in ("Create", "Update", "Delete"):
            lookup.invoke(
                {
                    "RequestType": request_type,
                    "ResponseURL": responses.url,
                    "StackId": f"arn:aws:cloudformation:{region.name}:{stack.account}:stack/s/1",
                    "RequestId": f"iam-{request_type}",
                    "LogicalResourceId": "MessagesStream",
                    "ResourceType": "Custom::StreamFleetTableStream",
                    "ResourceProperties": {
                        "ServiceToken": "arn:aws:lambda:::function:lookup",
                        "TableName": table,
                    },
                }
            )
    finally:
        responses.close()
        world.proxy.route_table(table, world.dynalite)
        moto_dynamodb.delete_table(TableName=table)
    statuses = [(b["RequestId"], b["Status"]) for b in responses.bodies]
    assert statuses == [
        ("iam-Create", "SUCCESS"),
        ("iam-Update", "SUCCESS"),
        ("iam-Delete", "SUCCESS"),
    ], responses.bodies


@pytest.fixture(scope="module")
def recorded(world, tmp_path_factory):
    """Drive every component once; the proxy keeps what each one called."""
    tmp = tmp_path_factory.mktemp("iam-run")

    async def drive() -> None:
        await _drive_fleet(world, tmp)
        await _drive_websocket(world)
        await asyncio.to_thread(_drive_stream_lookup, world)

    with pytest.MonkeyPatch.context() as patch:
        # The fake upstream is a dev tool started as `python -m streamfleet_dev.upstream.fake`.
        patch.setenv(
            "PYTHONPATH", os.pathsep.join(str(REPO / p) for p in ("runtime", "devtools", "."))
        )
        asyncio.run(drive())
    return world


# Functions whose roles other tests check (a new handler must be added here or below).
CHECKED_ELSEWHERE = {
    # against its recorded calls, from its asset
    "streamfleet.task_events.handler": "tests/artifact/test_task_events.py",
}
KINDS = {
    "streamfleet.event_router.handler": "router",
    HANDLER_ENTRY: "handler",  # the core's routes and the demo auction's
    "streamfleet.wsapi.authorizer.handler": "authorizer",
    "streamfleet.wsapi.canary.handler": "canary",
    FANOUT_ENTRY: "fanout",
    LOOKUP_ENTRY: "lookup",
}


@dataclass(frozen=True)
class Component:
    """One role-holder of the Region: its access key id and what the template says of it."""

    key: str
    label: str
    stack: Stack
    role: str
    function: str | None = None  # its function's logical id (None: the worker task)


def _components(world) -> list[Component]:
    """Every component of the Region."""
    region = world.regions[ROLE]
    found = [
        Component(
            WORKER_KEY,
            "worker task",
            region.fleet.stack,
            region.fleet.stack.containers()[0].task_role,
        )
    ]
    for local in (region.fleet, region.websocket):
        for function in local.stack.functions():
            if not function.is_python:
                continue
            if function.handler in CHECKED_ELSEWHERE:
                continue
            kind = KINDS[function.handler]
            key = f"{kind}-{ROLE}"
            found.append(
                Component(key, function.label, local.stack, function.role, function.logical_id)
            )
    return found


def _template_terms(stack: Stack) -> Bindings:
    """The template's own terms (:meth:`Stack.template_bindings`), and the stream ARN a
    stream-lookup custom resource returns at deploy time: the stream of the table it names
    (its label is only known then)."""
    terms = stack.template_bindings()
    attributes = dict(terms.attributes)
    for logical_id, resource in stack.resources.items():
        table = resource.get("Properties", {}).get("TableName")
        if resource.get("Type", "").startswith("Custom::") and isinstance(table, str):
            attributes[(logical_id, "StreamArn")] = (
                f"arn:aws:dynamodb:{stack.region}:{stack.account}:table/{table}/stream/<label>"
            )
    return Bindings(terms.refs, attributes, terms.pseudo, terms.values)


# What Lambda's event source mapping does with the function's role: AWS's poller reads the
# stream and, when it gives up on a batch, sends a record of it to the on-failure destination.
# No local run can record that (the local event source is a stand-in, not AWS's poller), so
# these calls come from the synthesized mapping itself, with the permissions AWS documents
# for them: the Lambda Developer Guide's DynamoDB execution-role permissions (DescribeStream,
# GetRecords, GetShardIterator, ListStreams) and, for an SQS on-failure destination,
# sqs:SendMessage ("Retain discarded records for a DynamoDB event source in Lambda").
STREAM_READS = ("dynamodb:DescribeStream", "dynamodb:GetRecords", "dynamodb:GetShardIterator")
_STREAM_ARN = re.compile(r"^arn:aws:dynamodb:[^:]+:[^:]+:table/[^/]+/stream/")


def _event_source_calls(stack: Stack, function: str | None, terms: Bindings) -> set[Call]:
    """The calls Lambda makes with ``function``'s role for its event source mappings."""
    calls: set[Call] = set()
    for logical_id, mapping in stack.of_type("AWS::Lambda::EventSourceMapping").items():
        props = mapping.get("Properties", {})
        if function is None or reference_of(props.get("FunctionName")) != function:
            continue
        source = str(resolve(props["EventSourceArn"], terms))
        assert _STREAM_ARN.match(source), (
            f"{logical_id}: this test knows what a DynamoDB stream mapping does, not {source}"
        )
        calls |= {Call(action, source) for action in STREAM_READS}
        calls.add(Call("dynamodb:ListStreams", "*"))  # an action without a resource type
        destination = props.get("DestinationConfig", {}).get("OnFailure", {}).get("Destination")
        if destination is not None:
            arn = str(resolve(destination, terms))
            assert arn.startswith("arn:aws:sqs:"), f"{logical_id}: on-failure {arn} is no queue"
            calls.add(Call("sqs:SendMessage", arn))
    return calls


COMPONENTS = ["worker", "router", "handler", "authorizer", "canary", "fanout", "lookup"]


@pytest.mark.parametrize("component", COMPONENTS)
def test_role_allows_exactly_what_the_component_calls(recorded, component):
    world = recorded
    region = world.regions[ROLE]
    secrets = client("secretsmanager", world.moto, region.name)
    secret_arn = secrets.describe_secret(SecretId=SECRET_NAME)["ARN"]
    (api,) = region.websocket.stack.websocket_apis()
    names = NameMap(
        tables={**region.fleet.names.tables, **region.websocket.names.tables},
        queues={**region.fleet.names.queues, **region.websocket.names.queues},
        secrets={SECRET_NAME: secret_arn},
        api_id=api.logical_id,
    )
    matching = [c for c in _components(world) if c.key == f"{component}-{ROLE}"]
    assert matching, f"{component}: no such component in the assembly"
    (found,) = matching
    stack, role, label = found.stack, found.role, found.label
    assert not stack.managed_policies(role), f"{label}: managed policies cannot be checked"
    records = [r for r in world.proxy.records() if r.access_key_id == found.key]
    failed = [r for r in records if r.status >= 500 or r.status == 0]
    assert not failed, f"{label}: requests the servers failed: {failed[:5]}"
    terms = _template_terms(stack)
    by_lambda = _event_source_calls(stack, found.function, terms)
    calls = calls_of(records, stack.account, names) | by_lambda
    findings = check(
        calls, statements_of(stack, role, terms), describe=lambda s: f"{role} {s.source}"
    )
    note = "".join(
        f"\n(not recorded: Lambda's event source mapping calls {call})"
        for call in sorted(by_lambda, key=str)
    )
    assert not findings, f"{label} (role {role}):\n" + "\n".join(map(str, findings)) + note


def test_every_component_was_driven(recorded):
    """A component that made no call at all is one this test forgot, unless it needs none."""
    keys = {r.access_key_id for r in recorded.proxy.records()}
    components = _components(recorded)
    assert sorted({c.key.removesuffix(f"-{ROLE}") for c in components}) == sorted(COMPONENTS)
    silent = [c.label for c in components if c.key not in keys]
    # The authorizer verifies tokens against a JWKS URL over HTTPS and calls no AWS API.
    assert silent == [c.label for c in components if c.key.startswith("authorizer")]
    # And the fleet did its work against indexes that lag, as DynamoDB's do.
    assert recorded.proxy.state()["stale_index_answers"] > 0


def test_the_check_names_a_missing_and_an_unused_permission():
    """The comparison itself: a call no statement grants, and a grant no call used."""
    from streamfleet_dev.iam import Call, ResolvedStatement

    table = "arn:aws:dynamodb:us-east-1:123456789012:table/leases"
    granted = [
        ResolvedStatement("Allow", ("dynamodb:GetItem", "dynamodb:DeleteItem"), (table,), {}, "P"),
        ResolvedStatement(
            "Allow",
            ("cloudwatch:PutMetricData",),
            ("*",),
            {"StringEquals": {"cloudwatch:namespace": "App"}},
            "P",
        ),
    ]
    calls = [
        Call("dynamodb:GetItem", table),
        Call("dynamodb:PutItem", table),
        Call("cloudwatch:PutMetricData", "*", (("cloudwatch:namespace", "Other"),)),
    ]
    findings = [str(f) for f in check(calls, granted)]
    assert f"missing: dynamodb:PutItem on {table} is not granted" in findings
    assert any(f.startswith("unused: dynamodb:DeleteItem") for f in findings)
    assert any("cloudwatch:PutMetricData" in f and f.startswith("missing") for f in findings)
    exact = ResolvedStatement("Allow", ("dynamodb:GetItem",), (table,), {}, "P")
    assert check([Call("dynamodb:GetItem", table)], [exact]) == []
