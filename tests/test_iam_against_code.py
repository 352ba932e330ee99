"""Least privilege against behaviour: every role allows what its component calls, and no more.

Each component runs as deployed and calls AWS through the recording proxy with an access key id
of its own: the event router, the WebSocket handler, the authorizer and the canary from their
asset directories (:mod:`streamfleet_dev.local.lambda_runner`), and real worker processes from
the task definition's command and environment (:mod:`streamfleet_dev.local.container`), driven
through what exercises every path that calls AWS: START notifications, messages and
checkpoints, a STOP, a ``kill -9`` and the takeover of the dead worker's streams, a SIGTERM
handoff and the claim of what it handed over. Then each recorded request becomes an IAM
question (action, resource ARN in the template's own terms, condition values) and the
component's synthesized role must answer yes to each, while every action and resource it
grants must have been used. A failure names the component, the role and the permission.

This reflects what the code does when the test runs: change what a component calls and this
test says which permission to add or remove.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest
from websockets.asyncio.client import connect

from streamfleet import model
from streamfleet_dev.iam import NameMap, calls_of, check, statements_of
from streamfleet_dev.local.container import container_launch, image_python
from streamfleet_dev.local.lambda_runner import rest_proxy_event, scheduled_event
from streamfleet_dev.local.servers import free_port
from streamfleet_dev.upstream.process import UpstreamProcess
from streamfleet_dev.wsapi.local_gateway import FailureMode
from tests.assembly_support import (
    CANARY_ENTRY,
    ROUTER_ENTRY,
    SECRET_NAME,
    build_world,
    client,
    eventually,
    function_with_handler,
    user_token,
    websocket_region,
)

pytestmark = pytest.mark.slow
ROLE = "primary"  # the secondary's roles are built by the same constructs
WORKER_KEY = f"worker-{ROLE}"
REPO = Path(__file__).resolve().parent.parent


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
                # Local only: the servers behind the proxy; one host, so a port per worker.
                "AWS_ENDPOINT_URL": self.proxy,
                "HEALTH_PORT": str(free_port()),
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


def _owners(world, table: str, stream_ids: list[str]) -> dict[str, str | None]:
    dynamodb = client("dynamodb", world.dynalite, world.regions[ROLE].name)
    owners = {}
    for stream_id in stream_ids:
        item = dynamodb.get_item(
            TableName=table,
            Key={model.PK: {"S": model.connection_pk(stream_id)}},
            ConsistentRead=True,
        ).get("Item", {})
        owners[stream_id] = item.get(model.LEASE_OWNER, {}).get("S")
    return owners


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
            await asyncio.sleep(1.5)  # messages stored and checkpointed (CHECKPOINT_EVERY: 1 s)
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
            await asyncio.sleep(1.0)  # the second worker's session exists
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
            await asyncio.sleep(1.0)
            third.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(third.wait, 30) == 0, workers.logs()
        finally:
            workers.stop_all()


async def _drive_live_delivery(world, api, socket) -> None:
    """subscribe (a replay after a seq, then the newest), unsubscribe, and a subscription
    left for $disconnect to remove, on a stream STARTed for this user with one stored message."""
    env = api.region.websocket.environment(
        {
            name: api.handler_function.environment[name]
            for name in (model.ENV_STREAMS_TABLE_NAME, model.ENV_MESSAGES_TABLE_NAME)
        }
    )
    stream = f"iam-live-{uuid.uuid4().hex[:6]}"
    setup = client("dynamodb", world.proxy.endpoint, api.region.name)  # not a component's key
    setup.put_item(
        TableName=env[model.ENV_STREAMS_TABLE_NAME],
        Item={
            model.PK: {"S": model.connection_pk(stream)},
            model.DESIRED_STATE: {"S": model.DesiredState.STARTED.value},
            model.READERS: {"SS": ["user:user-1"]},
        },
    )
    setup.put_item(
        TableName=env[model.ENV_MESSAGES_TABLE_NAME],
        Item={
            model.PK: {"S": model.connection_pk(stream)},
            model.SEQ: {"N": "1"},
            model.MESSAGE_DATA: {"S": "hello"},
        },
    )

    async def ask(message: dict, wanted: str) -> dict:
        await socket.send(json.dumps(message))
        while True:  # replayed frames may come first; the reply carries the requestId
            reply = json.loads(await asyncio.wait_for(socket.recv(), 10))
            if reply.get("requestId") == message["requestId"]:
                assert reply.get("type") == wanted, reply
                return reply

    subscribe = {"action": model.WS_ROUTE_SUBSCRIBE, "stream": stream}
    await ask({**subscribe, "requestId": "sub-after", "after": 0}, model.WS_REPLY_SUBSCRIBED)
    await ask({**subscribe, "requestId": "sub-newest", "after": None}, model.WS_REPLY_SUBSCRIBED)
    await ask(
        {"action": model.WS_ROUTE_UNSUBSCRIBE, "stream": stream, "requestId": "unsub"},
        model.WS_REPLY_UNSUBSCRIBED,
    )
    await ask({**subscribe, "requestId": "sub-kept", "after": 1}, model.WS_REPLY_SUBSCRIBED)


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
                {"action": model.WS_ROUTE_BID, "requestId": "b", "auction": "iam", "amount": 5},
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
        event = scheduled_event(
            region.name, region.websocket.stack.account, "arn:aws:events:::rule/x"
        )
        for _ in range(2):  # a second run reads the hysteresis state the first one saved
            result = await asyncio.to_thread(canary.invoke, event)
            assert result["healthy"] is True, result
        # The Region degrades with a client connected: the canary's probes fail, it trips, and
        # (when its code does that) it closes the Region's client connections so they fail over.
        async with connect(
            api.url, subprotocols=[model.WS_APP_SUBPROTOCOL, f"bearer.{token}"], open_timeout=10
        ) as client_socket:
            api.gateway.fail(FailureMode.THROTTLED)
            try:
                for _ in range(3):
                    result = await asyncio.to_thread(canary.invoke, event)
                    assert result["healthy"] is False, result
            finally:
                api.gateway.recover()
            del client_socket


@pytest.fixture(scope="module")
def recorded(world, tmp_path_factory):
    """Drive every component once; the proxy keeps what each one called."""
    tmp = tmp_path_factory.mktemp("iam-run")

    async def drive() -> None:
        await _drive_fleet(world, tmp)
        await _drive_websocket(world)

    with pytest.MonkeyPatch.context() as patch:
        # The fake upstream is a dev tool started as `python -m streamfleet_dev.upstream.fake`.
        patch.setenv(
            "PYTHONPATH", os.pathsep.join(str(REPO / p) for p in ("runtime", "devtools", "."))
        )
        asyncio.run(drive())
    return world


# Functions whose roles other tests check (a new handler must be added here or above).
CHECKED_ELSEWHERE = {
    # against its recorded calls, from its asset
    "streamfleet.task_events.handler": "tests/test_task_events.py",
    # against the exact grants their code's calls need (a fixed list, not recorded calls)
    "streamfleet.wsapi.fanout.handler": "tests/test_fanout_infra.py",
    "streamfleet.wsapi.stream_lookup.handler": "tests/test_fanout_infra.py",
}


def _components(world):
    """``(access key id, label, stack, role logical id)`` of every component of the Region."""
    region = world.regions[ROLE]
    found = [
        (
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
            kind = {
                "streamfleet.event_router.handler": "router",
                "streamfleet.wsapi.handlers.handler": "handler",
                "streamfleet.wsapi.authorizer.handler": "authorizer",
                "streamfleet.wsapi.canary.handler": "canary",
            }[function.handler]
            found.append((f"{kind}-{ROLE}", function.label, local.stack, function.role))
    return found


COMPONENTS = ["worker", "router", "handler", "authorizer", "canary"]


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
    matching = [c for c in _components(world) if c[0] == f"{component}-{ROLE}"]
    assert matching, f"{component}: no such component in the assembly"
    ((key, label, stack, role),) = matching
    assert not stack.managed_policies(role), f"{label}: managed policies cannot be checked"
    records = [r for r in world.proxy.records() if r.access_key_id == key]
    failed = [r for r in records if r.status >= 500 or r.status == 0]
    assert not failed, f"{label}: requests the servers failed: {failed[:5]}"
    calls = calls_of(records, stack.account, names)
    findings = check(calls, statements_of(stack, role), describe=lambda s: f"{role} {s.source}")
    assert not findings, f"{label} (role {role}):\n" + "\n".join(map(str, findings))


def test_every_component_was_driven(recorded):
    """A component that made no call at all is one this test forgot, unless it needs none."""
    keys = {r.access_key_id for r in recorded.proxy.records()}
    silent = [label for key, label, _, _ in _components(recorded) if key not in keys]
    # The authorizer verifies tokens against a JWKS URL over HTTPS and calls no AWS API.
    assert silent == [
        label for key, label, _, _ in _components(recorded) if key.startswith("authorizer")
    ]


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
