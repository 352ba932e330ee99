"""Stand-ins of what the code under test calls: DynamoDB and the Management API as boto3
clients, and API Gateway's WebSocket side."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError, ReadTimeoutError

from streamfleet import model, readers
from streamfleet.backoff import full_jitter
from streamfleet.wsapi import handlers as handlers_module

if TYPE_CHECKING:
    from streamfleet_dev.dsim.live.client import Client
    from streamfleet_dev.dsim.live.region import Region
    from streamfleet_dev.dsim.live.world import World

# The deployed handler's timeout: an invocation still running then is ended by Lambda.
HANDLER_TIMEOUT_S = float(model.WS_HANDLER_TIMEOUT_SECONDS)


@dataclass(frozen=True)
class Sdk:
    """What botocore does around one call of one function's client: ``attempts`` in all
    (``max_attempts`` retries plus the first; ``total_max_attempts`` as it is), full-jitter
    backoff between them, and a lost answer waited for until ``read_timeout``."""

    attempts: int
    read_timeout: float


# As the deployed code configures its clients (handlers.config.BOTO_CONFIG, fanout's configs).
HANDLER_SDK = Sdk(attempts=4, read_timeout=3.0)
FANOUT_DYNAMODB_SDK = Sdk(attempts=6, read_timeout=3.0)
FANOUT_MANAGEMENT_SDK = Sdk(attempts=1, read_timeout=2.0)
FLEET_SDK = Sdk(attempts=4, read_timeout=2.0)  # the worker's sink and the control plane


def _lost(operation: str) -> ReadTimeoutError:
    return ReadTimeoutError(endpoint_url=f"sim://{operation}")


def _refused(code: str, status: int, operation: str) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": code}, "ResponseMetadata": {"HTTPStatusCode": status}},
        operation,
    )


def _call(
    world: World,
    owner: str,
    sdk: Sdk,
    operation: str,
    apply: Callable[[], dict[str, Any]],
    throttled: str,
) -> dict[str, Any]:
    """One SDK call: each attempt's request and answer take seeded times; an attempt may be
    throttled (nothing done) or have its answer lost after it was applied (a duplicated write
    or post when the SDK sends it again); the last attempt's error is raised."""
    error: Exception = _lost(operation)
    for attempt in range(sdk.attempts):
        if attempt:
            world.scheduler.sleep(full_jitter(attempt, 0.05, 1.0, world.rng))
        world.scheduler.sleep(world.latency())
        world.requests += 1
        if world.throttle():
            world.scheduler.sleep(world.latency())
            error = _refused(
                throttled, 400 if throttled.startswith("Provisioned") else 429, operation
            )
            continue
        failure: ClientError | None = None
        answer: dict[str, Any] = {}
        try:
            answer = apply()
        except ClientError as exc:
            failure = exc
        if world.lose_answer():
            world.scheduler.sleep(sdk.read_timeout)
            world.note(f"{owner} {operation}: answer lost (attempt {attempt + 1})")
            error = _lost(operation)
            continue
        world.scheduler.sleep(world.latency())
        if failure is not None:
            raise failure
        return answer
    raise error


class SimDynamoDB:
    """One function's boto3 DynamoDB client over its Region's in-process store (see
    :func:`_call`)."""

    def __init__(self, world: World, owner: str, sdk: Sdk, region: Region):
        self._world = world
        self._owner = owner
        self._sdk = sdk
        self._region = region

    def __getattr__(self, operation: str) -> Callable[..., dict[str, Any]]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        return lambda **params: self._call(operation, params)

    def _call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        world = self._world

        region = self._region

        def apply() -> dict[str, Any]:
            answer = region.store.call(operation, params)
            world.applied(region, operation, params)
            return answer

        return _call(
            world,
            self._owner,
            self._sdk,
            operation,
            apply,
            "ProvisionedThroughputExceededException",
        )


class Management:
    """One function's boto3 ``apigatewaymanagementapi`` client, over its Region's gateway."""

    def __init__(self, world: World, owner: str, sdk: Sdk, region: Region):
        self._world = world
        self._owner = owner
        self._sdk = sdk
        self._region = region

    def post_to_connection(self, ConnectionId: str, Data: bytes) -> dict[str, Any]:
        gateway = self._region.gateway
        return self._call(
            "post", ConnectionId, lambda: gateway.post(ConnectionId, Data, self._owner)
        )

    def delete_connection(self, ConnectionId: str) -> dict[str, Any]:
        gateway = self._region.gateway
        why = f"closed by {self._owner}"
        return self._call("delete", ConnectionId, lambda: gateway.delete(ConnectionId, why))

    def _call(
        self, operation: str, connection_id: str, apply: Callable[[], dict[str, Any]]
    ) -> dict[str, Any]:
        if self._owner == "fanout":  # one invocation at a time: the checker bounds each
            self._region.fanout_calls[connection_id] += 1
        return _call(
            self._world, self._owner, self._sdk, operation, apply, "LimitExceededException"
        )


# --- The gateway ----------------------------------------------------------------------------------


@dataclass(eq=False)
class Connection:
    id: str
    client: Client
    token_expires_at: int
    gateway: Gateway  # of the Region it was made to
    open: bool = True  # as API Gateway sees it
    dropped: bool = False  # the client is gone; API Gateway has not noticed yet
    delivered_until: float = 0.0  # frames reach the client in the order they were posted
    # When its Region was cut off with the connection open (the client is told nothing: only
    # its heartbeats tell it), and when the client stopped serving it.
    cut_off_at: float | None = None
    client_left_at: float | None = None


def _gone(operation: str) -> ClientError:
    return _refused("GoneException", 410, operation)


class Gateway:
    """API Gateway's WebSocket side: connections, the routes' invocations, the @connections
    API. A frame posted to an open connection reaches its client in posting order; one over
    the 32 KB frame limit closes it (1009). A client that drops its connection is noticed a
    little later: posts until then are accepted and lost."""

    def __init__(self, world: World, region: Region, connection_prefix: str):
        self._world = world
        self.region = region
        self._prefix = connection_prefix  # connection ids are unique across Regions
        self._ids = itertools.count(1)
        self.connections: dict[str, Connection] = {}

    def _event(self, connection: Connection, route: str, body: str | None = None) -> dict:
        client = connection.client
        return {
            "requestContext": {
                "routeKey": route,
                "connectionId": connection.id,
                "domainName": "sim.example",
                "stage": "live",
                "apiId": "sim",
                "authorizer": {
                    model.WS_CONTEXT_SUB: client.plan.user,
                    model.WS_CONTEXT_PRINCIPAL_KIND: model.WS_PRINCIPAL_USER,
                    model.WS_CONTEXT_READER_TAGS: readers.encode_tags([client.plan.group]),
                    model.WS_CONTEXT_TOKEN_EXPIRES_AT: connection.token_expires_at,
                },
            },
            "body": body,
            "isBase64Encoded": False,
        }

    def _invoke(self, connection: Connection, route: str, body: str | None = None) -> dict:
        ok, answer = self._world.invoke(
            self.region.handlers,
            self._event(connection, route, body),
            timeout=HANDLER_TIMEOUT_S,
            name=f"{route}-{connection.id}",
        )
        return answer if ok else {"statusCode": 500}

    def connect(self, client: Client, token_expires_at: int) -> Connection | None:
        """The handshake, ``$connect`` included (run in the client's own task)."""
        world = self._world
        connection = Connection(f"{self._prefix}{next(self._ids)}", client, token_expires_at, self)
        world.scheduler.sleep(world.latency())
        if not self.region.api_up:
            world.note(f"{client.plan.user} could not connect to {self.region.name}")
            return None
        answer = self._invoke(connection, handlers_module.CONNECT)
        world.scheduler.sleep(world.latency())
        if answer.get("statusCode") != 200:
            return None
        self.connections[connection.id] = connection
        world.connected(connection.id, client.plan.user, token_expires_at, self.region)
        world.note(f"{client.plan.user} connected {connection.id}")
        return connection

    def send(self, connection: Connection, text: str) -> None:
        """A message from the client: its own invocation, after the network's time."""
        world = self._world
        if not connection.open or connection.dropped:
            return
        world.scheduler.spawn(
            self._route,
            connection,
            text,
            name=f"route-{connection.id}",
            delay=world.latency(),
            root=True,
        )

    def _route(self, connection: Connection, text: str) -> None:
        # A Region whose API is down routes nothing: its handlers are throttled, or nothing
        # reaches it (the client's request times out).
        if connection.open and self.region.api_up:
            self._invoke(connection, _route_key(text), text)

    def post(self, connection_id: str, data: bytes, owner: str) -> dict[str, Any]:
        world = self._world
        connection = self.connections.get(connection_id)
        if connection is None or not connection.open:
            raise _gone("PostToConnection")
        if len(data) > model.WS_MAX_FRAME_BYTES:
            world.problem(f"{owner} posted a frame of {len(data)} bytes to {connection_id}")
            self._close(connection, "closed: frame over the limit (1009)")
            return {}
        if connection.dropped:
            return {}  # accepted, and lost with the connection
        message_bytes = world.on_post(connection_id, data)
        if owner == "handler":
            world.replayed_bytes[world.scheduler.current()] += message_bytes
        at = max(connection.delivered_until, world.scheduler.now + world.latency())
        connection.delivered_until = at
        world.scheduler.spawn(
            connection.client.on_frame,
            connection,
            data,
            name=f"deliver-{connection_id}",
            delay=at - world.scheduler.now,
            root=True,
        )
        return {}

    def delete(self, connection_id: str, why: str) -> dict[str, Any]:
        """``DeleteConnection``: GoneException for a connection already closed."""
        connection = self.connections.get(connection_id)
        if connection is None or not connection.open:
            raise _gone("DeleteConnection")
        self._close(connection, why)
        return {}

    def drop(self, connection: Connection, why: str) -> None:
        """The client closed its socket; API Gateway notices within a second."""
        world = self._world
        if not connection.open or connection.dropped:
            return
        connection.dropped = True
        world.note(f"{connection.id} {why}")
        world.scheduler.spawn(
            connection.client.on_closed,
            connection,
            name=f"closed-{connection.id}",
            delay=world.latency(),
            root=True,
        )
        self._notice_gone(connection)

    def cut_off(self, connection: Connection) -> None:
        """The network between the client and this Region is gone: API Gateway notices within
        a second; the client's socket looks open, and nothing it sends or is posted arrives
        (only its missed heartbeats tell it)."""
        if not connection.open or connection.dropped:
            return
        connection.dropped = True
        connection.cut_off_at = self._world.scheduler.now
        self._world.note(f"{connection.id} cut off with its Region")
        self._notice_gone(connection)

    def _notice_gone(self, connection: Connection) -> None:
        world = self._world
        world.scheduler.spawn(
            self._close,
            connection,
            "noticed gone",
            name=f"notice-{connection.id}",
            delay=world.rng.uniform(0.0, 1.0),
            root=True,
        )

    def _close(self, connection: Connection, why: str) -> None:
        world = self._world
        if not connection.open:
            return
        connection.open = False
        world.note(f"{connection.id} {why}")
        if not connection.dropped:
            at = max(connection.delivered_until, world.scheduler.now + world.latency())
            world.scheduler.spawn(
                connection.client.on_closed,
                connection,
                name=f"closed-{connection.id}",
                delay=at - world.scheduler.now,
                root=True,
            )
        if not self.region.api_up:
            return  # $disconnect is best effort: a Region whose handlers are down misses it
        world.scheduler.spawn(
            self._invoke,
            connection,
            handlers_module.DISCONNECT,
            name=f"disconnect-{connection.id}",
            delay=world.latency(),
            root=True,
        )


def _route_key(text: str) -> str:
    """The route API Gateway selects for a message (``$request.body.action``), else
    ``$default``: the deployed API has a route per action, all to the same function."""
    try:
        action = json.loads(text).get(model.WS_ROUTE_SELECTION_FIELD)
    except (ValueError, AttributeError):
        return handlers_module.DEFAULT
    return action if action in model.WS_ROUTES else handlers_module.DEFAULT
