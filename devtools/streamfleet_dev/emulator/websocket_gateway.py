"""A local stand-in for one region's API Gateway WebSocket API: routing plus Management API.

What it reproduces, because the handlers, the authorizer, the canary and the client depend on it:

* ``$connect``: the REQUEST authorizer runs first, with the query string and headers of the
  handshake. ``Unauthorized`` raised means HTTP 401, a Deny policy HTTP 403, any other failure
  HTTP 500; then the ``$connect`` handler runs with the authorizer's context, and a non-2xx
  answer rejects the handshake with that status. The subprotocol the handler selects (its
  ``Sec-WebSocket-Protocol`` response header) is the one the handshake returns.
* Route selection ``$request.body.action``: a JSON object whose ``action`` names a configured
  route goes to that route, anything else to ``$default``. Each message is a separate,
  concurrent "invocation" in a bounded thread pool (Lambda's concurrency), with the authorizer
  context attached, as API Gateway does.
* ``$disconnect`` after the socket closes (best effort, as in AWS).
* API Gateway's limits: 32 KB frames, 128 KB messages (larger ones close the connection with
  1009), and an idle timeout.
* The Management API on a second loopback port: ``POST /<stage>/@connections/<id>`` delivers
  ``Data`` to the socket, ``GET`` describes the connection, ``DELETE`` closes it; an unknown id
  answers 410 ``GoneException``. The handlers reach it with the *same* boto3 code as in AWS,
  through ``endpoint_url`` (:attr:`LocalGateway.management_endpoint`).
* Failure modes, switched at run time: ``THROTTLED`` is a handler Lambda whose reserved
  concurrency is set to 0: sockets stay open and protocol pings are answered, but no handler
  runs: every message gets API Gateway's ``Internal server error`` frame instead of a reply, and
  new handshakes fail with HTTP 500. ``DOWN`` drops every socket and refuses new handshakes with
  HTTP 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import itertools
import json
import logging
import random
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import SimpleNamespace
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.http11 import Request, Response

from streamfleet import model
from streamfleet_dev.emulator.aws_proxy import DEFAULT_THROTTLE_RATE

logger = logging.getLogger(__name__)

LambdaFunction = Callable[[dict[str, Any], Any], Any]
HOST = "127.0.0.1"
MAX_MANAGEMENT_BODY_BYTES = model.WS_MAX_MESSAGE_BYTES
MANAGEMENT_READ_TIMEOUT_SECONDS = 30.0
STOP_GRACE_SECONDS = 5.0


# The frames API Gateway sends a client itself when a message's integration fails.
INTERNAL_SERVER_ERROR = "Internal server error"
ENDPOINT_TIMED_OUT = "Endpoint request timed out"


class LambdaTimedOut(Exception):
    """The function ran past its timeout: Lambda ends it and reports a failure."""


class IntegrationTimedOut(Exception):
    """API Gateway stopped waiting for the integration."""


class FailureMode(StrEnum):
    """How the region is (not) working."""

    HEALTHY = "healthy"
    THROTTLED = "throttled"  # handlers do not run; sockets stay open
    DOWN = "down"  # sockets dropped, handshakes refused


@dataclass(frozen=True)
class GatewaySettings:
    """One local API's identity and limits."""

    region: str
    api_id: str = "local"
    stage: str = "local"
    host: str = HOST
    port: int = 0  # 0: any free port; read LocalGateway.url
    management_port: int = 0
    routes: tuple[str, ...] = model.WS_ROUTES
    lambda_concurrency: int = 16
    max_message_bytes: int = model.WS_MAX_MESSAGE_BYTES
    max_frame_bytes: int = model.WS_MAX_FRAME_BYTES
    idle_timeout_seconds: float = model.WS_IDLE_TIMEOUT_SECONDS
    # API Gateway closes every connection at this age, however active it is.
    max_connection_seconds: float = model.WS_MAX_CONNECTION_SECONDS
    # API Gateway stops waiting for a route's integration after this long.
    integration_timeout_seconds: float = model.WS_INTEGRATION_TIMEOUT_SECONDS
    # The route handler's and the authorizer's Lambda timeouts (the constructs' defaults unless
    # the template's are given): an invocation that runs longer failed, whatever it returns
    # afterwards. Its thread cannot be stopped, so what it still does after its timeout (a
    # write, a post) happens here where Lambda would have ended it: looser than AWS there.
    handler_timeout_seconds: float = model.WS_HANDLER_TIMEOUT_SECONDS
    authorizer_timeout_seconds: float = model.WS_AUTHORIZER_TIMEOUT_SECONDS
    account_id: str = "000000000000"
    # A seeded fraction of the Management API's calls answered with an error, by status
    # ((429, 0.01): one in a hundred throttled): the callers meet these in every run, not only
    # where a test asks for one (fail_management).
    management_fault_rates: tuple[tuple[int, float], ...] = ()
    fault_seed: int | None = None

    def __post_init__(self) -> None:
        for status, rate in self.management_fault_rates:
            if status not in _MANAGEMENT_ERRORS or not 0 <= rate <= 1:
                raise ValueError(
                    f"management_fault_rates: ({status}, {rate}) is not a status of "
                    f"{sorted(_MANAGEMENT_ERRORS)} with a rate between 0 and 1"
                )


def management_fault_rates(throttle_rate: float) -> tuple[tuple[int, float], ...]:
    """Throttling (429) at ``throttle_rate``, and a refusal (403) a tenth as often. API
    Gateway refuses a call for a reason that holds for every call (another stage's connection,
    a missing permission); a rare refusal of one call is stricter than that, so that the
    one-off failure of a post is met in every run too."""
    return ((429, throttle_rate), (403, throttle_rate / 10))


# What the local worlds inject by default, at the rate DynamoDB's requests are throttled.
DEFAULT_MANAGEMENT_FAULT_RATES = management_fault_rates(DEFAULT_THROTTLE_RATE)


@dataclass
class GatewayStats:
    """Counters a test or the drill reads."""

    connects: int = 0
    rejected: dict[int, int] = field(default_factory=dict)
    messages: int = 0
    invocations: dict[str, int] = field(default_factory=dict)
    posts: int = 0
    gone: int = 0
    failed_messages: int = 0
    binary_refused: int = 0  # binary frames: the client disconnected with 1003
    integration_errors: int = 0  # messages answered with an error frame (handler raised, timed out)
    aged_out: int = 0  # connections closed at the maximum connection duration
    management_faults: int = 0  # Management API calls answered with an injected error

    def count_rejection(self, status: int) -> None:
        self.rejected[status] = self.rejected.get(status, 0) + 1

    def count_invocation(self, route: str) -> None:
        self.invocations[route] = self.invocations.get(route, 0) + 1


@dataclass(eq=False)
class _Connection:
    connection_id: str
    socket: ServerConnection
    authorizer: dict[str, Any]
    connected_at_ms: int
    source_ip: str
    user_agent: str
    last_active_ms: int


@dataclass
class _Pending:
    """What the handshake decided, for select_subprotocol and the connection handler."""

    connection_id: str
    authorizer: dict[str, Any]
    subprotocol: str | None


class LocalGateway:
    """One region's WebSocket API on loopback. Use as ``async with LocalGateway(...) as gw``.

    ``handler`` is either a Lambda-style callable ``(event, context) -> response`` (for example
    :class:`~streamfleet.wsapi.handlers.WsApiHandlers`) or, when ``handler_factory`` is used, built
    once the Management API's endpoint is known (the handler needs it to reply).
    """

    def __init__(
        self,
        settings: GatewaySettings,
        *,
        authorizer: LambdaFunction | None,
        handler: LambdaFunction | None = None,
        handler_factory: Callable[[str], LambdaFunction] | None = None,
    ):
        if (handler is None) == (handler_factory is None):
            raise ValueError("handler, handler_factory: give exactly one")
        self.settings = settings
        self.authorizer = authorizer
        self.handler = handler
        self._handler_factory = handler_factory
        self.mode = FailureMode.HEALTHY
        self.stats = GatewayStats()
        self._connections: dict[str, _Connection] = {}
        self._pending: dict[uuid.UUID, _Pending] = {}
        self._executor = ThreadPoolExecutor(
            max_workers=settings.lambda_concurrency, thread_name_prefix=f"lambda-{settings.region}"
        )
        self._server: Server | None = None
        self._management: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._management_writers: set[asyncio.StreamWriter] = set()
        # Management API answers a test asked for: (method, connection id or None for any,
        # status) per call to come, in order (see fail_management); tests call from threads.
        self._management_faults: list[tuple[str, str | None, int]] = []
        self._faults_lock = threading.Lock()
        self._fault_random = random.Random(settings.fault_seed)
        self._management_tasks: set[asyncio.Task[Any]] = set()
        self._request_ids = itertools.count(1)
        self._url: str | None = None

    # Lifecycle -------------------------------------------------------------------------------

    async def start(self) -> LocalGateway:
        """Bind both ports; build the handler if a factory was given."""
        s = self.settings
        self._management = await asyncio.start_server(
            self._serve_management, s.host, s.management_port
        )
        if self._handler_factory is not None:
            self.handler = self._handler_factory(self.management_endpoint)
        self._server = await serve(
            self._serve_socket,
            s.host,
            s.port,
            process_request=self._process_request,
            process_response=self._process_response,
            select_subprotocol=self._select_subprotocol,
            max_size=(s.max_message_bytes, s.max_frame_bytes),
            compression=None,
            server_header=None,
            # The handshake waits for the authorizer and $connect, each within its own timeout:
            # the socket's own opening deadline must not cut them short first.
            open_timeout=2 * s.integration_timeout_seconds + 5,
        )
        _ = self.url
        return self

    async def stop(self) -> None:
        """Close every socket and both servers; let in-flight invocations (the ``$disconnect``
        of every closed socket among them) finish, for at most ``STOP_GRACE_SECONDS``."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        if self._tasks:
            _, late = await asyncio.wait(set(self._tasks), timeout=STOP_GRACE_SECONDS)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
        if self._management is not None:
            self._management.close()
            # Python 3.11's wait_closed() does not wait for open keep-alive connections: close
            # them, so their handlers end before the event loop does.
            for writer in list(self._management_writers):
                writer.close()
            if self._management_tasks:
                await asyncio.wait(set(self._management_tasks), timeout=STOP_GRACE_SECONDS)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def __aenter__(self) -> LocalGateway:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """``ws://127.0.0.1:<port>``: what clients and the canary dial."""
        assert self._server is not None, "start() first"
        if self._url is None:  # kept: a $disconnect after stop() still names the API
            port = self._server.sockets[0].getsockname()[1]
            self._url = f"ws://{self.settings.host}:{port}"
        return self._url

    @property
    def management_endpoint(self) -> str:
        """The Management API endpoint (``endpoint_url`` of ``apigatewaymanagementapi``)."""
        assert self._management is not None, "start() first"
        port = self._management.sockets[0].getsockname()[1]
        return f"http://{self.settings.host}:{port}/{self.settings.stage}"

    @property
    def domain_name(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def connection_ids(self) -> list[str]:
        return list(self._connections)

    # Failure switch --------------------------------------------------------------------------

    def fail(self, mode: FailureMode = FailureMode.THROTTLED) -> None:
        """Make the region fail the way ``mode`` says (see the module docstring)."""
        self.mode = mode
        if mode is FailureMode.DOWN:
            for connection in list(self._connections.values()):
                # An abort, not a close handshake: the region is gone, nobody says goodbye.
                transport = connection.socket.transport
                if transport is not None:
                    transport.abort()

    def recover(self) -> None:
        """Back to normal."""
        self.mode = FailureMode.HEALTHY
        with self._faults_lock:
            self._management_faults.clear()

    def fail_management(
        self,
        status: int,
        *,
        times: int = 1,
        connection_id: str | None = None,
        method: str = "POST",
    ) -> None:
        """Answer the next ``times`` Management API calls of ``method`` (for ``connection_id``,
        or any) with ``status`` as API Gateway does: 429 ``LimitExceededException``
        (throttled), 403 ``ForbiddenException`` (refused), 400 ``BadRequestException``."""
        if status not in _MANAGEMENT_ERRORS:
            raise ValueError(f"status: one of {sorted(_MANAGEMENT_ERRORS)}")
        with self._faults_lock:
            self._management_faults += [(method, connection_id, status)] * times

    def _management_fault(self, method: str, connection_id: str) -> int | None:
        with self._faults_lock:
            for index, (wanted, target, status) in enumerate(self._management_faults):
                if wanted == method and target in (None, connection_id):
                    del self._management_faults[index]
                    return status
            for status, rate in self.settings.management_fault_rates:
                if self._fault_random.random() < rate:
                    return status
        return None

    # Events ----------------------------------------------------------------------------------

    def _request_context(
        self, route: str, event_type: str, connection_id: str, **extra: Any
    ) -> dict[str, Any]:
        now_ms = time.time_ns() // 1_000_000
        return {
            "routeKey": route,
            "eventType": event_type,
            "messageDirection": "IN",
            "connectionId": connection_id,
            "requestId": f"{self.settings.region}-{next(self._request_ids)}",
            "extendedRequestId": uuid.uuid4().hex,
            "requestTimeEpoch": now_ms,
            "stage": self.settings.stage,
            "domainName": self.domain_name,
            "apiId": self.settings.api_id,
            **extra,
        }

    async def _invoke(self, function: LambdaFunction, event: dict[str, Any]) -> Any:
        """Run ``function`` as Lambda would behind API Gateway: its context counts down from its
        timeout once it starts, an invocation that outlives that timeout failed
        (:class:`LambdaTimedOut`), and API Gateway gives up on one it has waited for longer
        than the integration timeout, queueing included (:class:`IntegrationTimedOut`)."""
        if event.get("type") == "REQUEST":
            route = "authorizer"
        else:
            route = str(event.get("requestContext", {}).get("routeKey"))
        self.stats.count_invocation(route)
        timeout = (
            self.settings.authorizer_timeout_seconds
            if route == "authorizer"
            else self.settings.handler_timeout_seconds
        )
        started: list[float] = []

        def run() -> Any:
            started.append(time.monotonic())
            deadline = started[0] + timeout
            context = SimpleNamespace(
                aws_request_id=uuid.uuid4().hex,
                function_name=f"local-{self.settings.region}",
                get_remaining_time_in_millis=lambda: max(
                    0, int((deadline - time.monotonic()) * 1000)
                ),
            )
            return function(event, context)

        # The thread cannot be stopped; its answer, if it ever comes, is discarded.
        future = asyncio.get_running_loop().run_in_executor(self._executor, run)
        give_up_at = time.monotonic() + self.settings.integration_timeout_seconds
        while True:
            now = time.monotonic()
            # Until the function starts (a free thread), look again shortly.
            end = min(give_up_at, started[0] + timeout if started else now + 0.05)
            try:
                return await asyncio.wait_for(asyncio.shield(future), max(0.0, end - now))
            except TimeoutError:
                if future.done():  # the function's own TimeoutError, not the wait's
                    return future.result()
                now = time.monotonic()
                if started and now >= started[0] + timeout:
                    raise LambdaTimedOut(
                        f"{route}: Task timed out after {timeout:g} seconds"
                    ) from None
                if now >= give_up_at:
                    raise IntegrationTimedOut(
                        f"{route}: no answer within {self.settings.integration_timeout_seconds:g} s"
                    ) from None

    # Handshake -------------------------------------------------------------------------------

    async def _process_request(self, socket: ServerConnection, request: Request) -> Response | None:
        if self.mode is FailureMode.DOWN:
            return self._reject(socket, http.HTTPStatus.SERVICE_UNAVAILABLE, "Service Unavailable")
        connection_id = secrets.token_urlsafe(12)
        headers = {name: value for name, value in request.headers.raw_items()}
        multi_headers: dict[str, list[str]] = {}
        for name, value in request.headers.raw_items():
            multi_headers.setdefault(name, []).append(value)
        query = parse_qs(urlsplit(request.path).query, keep_blank_values=True)
        request_context = self._request_context(
            "$connect",
            "CONNECT",
            connection_id,
            identity={
                "sourceIp": _peer_ip(socket),
                "userAgent": request.headers.get("User-Agent", ""),
            },
        )
        context: dict[str, Any] = {}
        if self.authorizer is not None:
            authorizer_event = {
                "type": "REQUEST",
                "methodArn": (
                    f"arn:aws:execute-api:{self.settings.region}:{self.settings.account_id}:"
                    f"{self.settings.api_id}/{self.settings.stage}/$connect"
                ),
                "headers": headers,
                "multiValueHeaders": multi_headers,
                "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
                "multiValueQueryStringParameters": query or None,
                "stageVariables": {},
                "requestContext": request_context,
            }
            try:
                decision = await self._invoke(self.authorizer, authorizer_event)
            except Exception as exc:
                if str(exc) == "Unauthorized":
                    return self._reject(socket, http.HTTPStatus.UNAUTHORIZED, "Unauthorized")
                logger.warning("authorizer failed: %s: %s", type(exc).__name__, exc)
                return self._reject(
                    socket, http.HTTPStatus.INTERNAL_SERVER_ERROR, "Internal server error"
                )
            if not _allows(decision):
                return self._reject(socket, http.HTTPStatus.FORBIDDEN, "Forbidden")
            context = {**(decision.get("context") or {}), "principalId": decision["principalId"]}
        if self.mode is FailureMode.THROTTLED:
            return self._reject(
                socket, http.HTTPStatus.INTERNAL_SERVER_ERROR, "Internal server error"
            )
        connect_event = {
            "headers": headers,
            "multiValueHeaders": multi_headers,
            "queryStringParameters": {k: v[-1] for k, v in query.items()} or None,
            "multiValueQueryStringParameters": query or None,
            "requestContext": {**request_context, "authorizer": context or None},
            "isBase64Encoded": False,
        }
        try:
            result = await self._invoke(self._require_handler(), connect_event) or {}
        except Exception as exc:
            logger.warning("$connect failed: %s: %s", type(exc).__name__, exc)
            return self._reject(
                socket, http.HTTPStatus.INTERNAL_SERVER_ERROR, "Internal server error"
            )
        status = int(result.get("statusCode", 200))
        if not 200 <= status < 300:
            return self._reject(socket, http.HTTPStatus(status), "Connection refused")
        selected = None
        for name, value in (result.get("headers") or {}).items():
            if name.lower() == "sec-websocket-protocol":
                selected = value
        self._pending[socket.id] = _Pending(connection_id, context, selected)
        return None

    def _process_response(
        self, socket: ServerConnection, request: Request, response: Response
    ) -> None:
        # A handshake that fails after $connect accepted it (e.g. the client offered no
        # subprotocol we could select) never reaches _serve_socket: forget it here.
        if response.status_code != http.HTTPStatus.SWITCHING_PROTOCOLS:
            self._pending.pop(socket.id, None)

    def _reject(self, socket: ServerConnection, status: http.HTTPStatus, text: str) -> Response:
        self.stats.count_rejection(int(status))
        return socket.respond(status, text + "\n")

    def _select_subprotocol(self, socket: ServerConnection, offered: Any) -> Any:
        pending = self._pending.get(socket.id)
        if pending is None or pending.subprotocol is None:
            return None
        return pending.subprotocol if pending.subprotocol in offered else None

    def _require_handler(self) -> LambdaFunction:
        assert self.handler is not None, "start() builds the handler"
        return self.handler

    # Connections -----------------------------------------------------------------------------

    async def _serve_socket(self, socket: ServerConnection) -> None:
        pending = self._pending.pop(socket.id, None)
        if pending is None:  # cannot happen: process_request accepted it
            return
        now_ms = time.time_ns() // 1_000_000
        connection = _Connection(
            connection_id=pending.connection_id,
            socket=socket,
            authorizer=pending.authorizer,
            connected_at_ms=now_ms,
            source_ip=_peer_ip(socket),
            user_agent=socket.request.headers.get("User-Agent", "") if socket.request else "",
            last_active_ms=now_ms,
        )
        self._connections[connection.connection_id] = connection
        self.stats.connects += 1
        close_code: int | None = None
        aged_out_at = time.monotonic() + self.settings.max_connection_seconds
        try:
            while True:
                left = aged_out_at - time.monotonic()
                try:
                    message = await asyncio.wait_for(
                        socket.recv(), min(self.settings.idle_timeout_seconds, max(0.0, left))
                    )
                except TimeoutError:
                    if time.monotonic() >= aged_out_at:
                        # API Gateway documents the limit, not the close code; 1001 is what a
                        # server going away sends, and clients must reconnect on any close.
                        self.stats.aged_out += 1
                        await socket.close(1001, "Going away (maximum connection duration)")
                    else:
                        await socket.close(1001, "Going away (idle timeout)")
                    close_code = 1001
                    break
                connection.last_active_ms = time.time_ns() // 1_000_000
                if isinstance(message, bytes):
                    # API Gateway's documented answer: no binary frames in incoming messages,
                    # the client is disconnected with 1003 (the integration never sees it).
                    self.stats.binary_refused += 1
                    await socket.close(1003, "Binary frames are not supported")
                    close_code = 1003
                    break
                self.stats.messages += 1
                self._spawn(self._route_message(connection, message))
        except ConnectionClosed as closed:
            close_code = closed.rcvd.code if closed.rcvd else None
        finally:
            self._connections.pop(connection.connection_id, None)
            if self.mode is FailureMode.HEALTHY:
                self._spawn(self._disconnect(connection, close_code))

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def route_of(self, message: str) -> str:
        """Route selection ``$request.body.action``: a configured route, else ``$default``."""
        try:
            payload = json.loads(message)
        except (ValueError, RecursionError):
            return "$default"
        action = payload.get(model.WS_ROUTE_SELECTION_FIELD) if isinstance(payload, dict) else None
        return action if isinstance(action, str) and action in self.settings.routes else "$default"

    async def _route_message(self, connection: _Connection, message: str) -> None:
        route = self.route_of(message)
        request_context = self._request_context(
            route,
            "MESSAGE",
            connection.connection_id,
            connectedAt=connection.connected_at_ms,
            identity={"sourceIp": connection.source_ip, "userAgent": connection.user_agent},
            authorizer=connection.authorizer or None,
        )
        if self.mode is not FailureMode.HEALTHY:
            # What API Gateway sends when the integration fails (a throttled Lambda).
            self.stats.failed_messages += 1
            await self._send_error_frame(connection, request_context, INTERNAL_SERVER_ERROR)
            return
        event = {"requestContext": request_context, "body": message, "isBase64Encoded": False}
        try:
            await self._invoke(self._require_handler(), event)
        except IntegrationTimedOut as exc:
            logger.warning("route %s: %s", route, exc)
            self.stats.integration_errors += 1
            await self._send_error_frame(connection, request_context, ENDPOINT_TIMED_OUT)
        except Exception as exc:
            # The function raised or ran out of time: API Gateway answers the message itself.
            logger.warning("route %s failed: %s: %s", route, type(exc).__name__, exc)
            self.stats.integration_errors += 1
            await self._send_error_frame(connection, request_context, INTERNAL_SERVER_ERROR)

    @staticmethod
    async def _send_error_frame(
        connection: _Connection, request_context: Mapping[str, Any], message: str
    ) -> None:
        with contextlib.suppress(ConnectionClosed):
            await connection.socket.send(
                json.dumps(
                    {
                        "message": message,
                        "connectionId": connection.connection_id,
                        "requestId": request_context["requestId"],
                    }
                )
            )

    async def _disconnect(self, connection: _Connection, close_code: int | None) -> None:
        request_context = self._request_context(
            "$disconnect",
            "DISCONNECT",
            connection.connection_id,
            connectedAt=connection.connected_at_ms,
            disconnectStatusCode=close_code if close_code is not None else 1006,
            disconnectReason="",
            authorizer=connection.authorizer or None,
        )
        with contextlib.suppress(Exception):
            await self._invoke(
                self._require_handler(),
                {"requestContext": request_context, "isBase64Encoded": False},
            )

    # Management API --------------------------------------------------------------------------

    async def _serve_management(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        """A minimal HTTP/1.1 server (keep-alive, Content-Length bodies) for botocore."""
        task = asyncio.current_task()
        if task is not None:
            self._management_tasks.add(task)
        self._management_writers.add(writer)
        try:
            while True:
                try:
                    request_line = await asyncio.wait_for(
                        reader.readline(), MANAGEMENT_READ_TIMEOUT_SECONDS
                    )
                except TimeoutError:
                    return
                if not request_line:
                    return
                method, _, rest = request_line.decode("latin-1").strip().partition(" ")
                target = rest.rpartition(" ")[0] or rest
                headers: dict[str, str] = {}
                while True:
                    line = await reader.readline()
                    if line in (b"\r\n", b"\n", b""):
                        break
                    name, _, value = line.decode("latin-1").partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", "0") or 0)
                if length > MAX_MANAGEMENT_BODY_BYTES:
                    await self._respond(writer, 413, _error_body("PayloadTooLargeException"), True)
                    return
                body = await reader.readexactly(length) if length else b""
                status, payload = await self._management_call(method, target, body)
                close = headers.get("connection", "").lower() == "close"
                await self._respond(writer, status, payload, close)
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            self._management_writers.discard(writer)
            if task is not None:
                self._management_tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _management_call(
        self, method: str, target: str, body: bytes
    ) -> tuple[int, dict[str, Any] | None]:
        path = unquote(urlsplit(target).path)
        prefix = f"/{self.settings.stage}/@connections/"
        if not path.startswith(prefix) or "/" in path[len(prefix) :]:
            return 404, _error_body("NotFoundException", f"no route for {method} {path}")
        connection_id = path[len(prefix) :]
        fault = self._management_fault(method, connection_id)
        if fault is not None:
            self.stats.management_faults += 1
            return fault, _error_body(_MANAGEMENT_ERRORS[fault])
        connection = self._connections.get(connection_id)
        if connection is None:
            self.stats.gone += 1
            return 410, _error_body("GoneException")
        if method == "POST":
            self.stats.posts += 1
            try:
                text = body.decode("utf-8")
            except UnicodeDecodeError:
                text = None
            try:
                await connection.socket.send(text if text is not None else body)
            except ConnectionClosed:
                self.stats.gone += 1
                return 410, _error_body("GoneException")
            return 200, None
        if method == "DELETE":
            await connection.socket.close(1000, "Deleted by the Management API")
            return 204, None
        if method == "GET":
            return 200, {
                "connectedAt": _iso(connection.connected_at_ms),
                "lastActiveAt": _iso(connection.last_active_ms),
                "identity": {
                    "sourceIp": connection.source_ip,
                    "userAgent": connection.user_agent,
                },
            }
        return 405, _error_body("MethodNotAllowedException")

    @staticmethod
    async def _respond(
        writer: asyncio.StreamWriter, status: int, payload: dict[str, Any] | None, close: bool
    ) -> None:
        data = json.dumps(payload).encode() if payload is not None else b""
        reason = http.HTTPStatus(status).phrase
        lines = [
            f"HTTP/1.1 {status} {reason}",
            "Content-Type: application/json",
            f"Content-Length: {len(data)}",
            f"x-amzn-RequestId: {uuid.uuid4()}",
        ]
        if payload is not None and status >= 400:
            lines.append(f"x-amzn-ErrorType: {payload['__type']}")
        if close:
            lines.append("Connection: close")
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data)
        await writer.drain()


_MANAGEMENT_ERRORS = {
    400: "BadRequestException",
    403: "ForbiddenException",
    429: "LimitExceededException",
}


def _error_body(error_type: str, message: str = "") -> dict[str, Any]:
    return {"__type": error_type, "message": message or error_type}


def _iso(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms / 1000)) + f".{ms % 1000:03d}Z"


def _peer_ip(socket: ServerConnection) -> str:
    address = socket.remote_address
    return str(address[0]) if address else ""


def _allows(decision: object) -> bool:
    """Whether an authorizer response allows ``execute-api:Invoke`` (and nothing denies it)."""
    if not isinstance(decision, Mapping) or not decision.get("principalId"):
        return False
    statements = (decision.get("policyDocument") or {}).get("Statement") or []
    if isinstance(statements, Mapping):
        statements = [statements]
    effects = [str(s.get("Effect", "")).lower() for s in statements if isinstance(s, Mapping)]
    return "allow" in effects and "deny" not in effects


def wsapi_gateway(
    settings: GatewaySettings,
    *,
    authorizer: LambdaFunction | None,
    state_table: str,
    connections_table: str,
    dynamodb: Any | None = None,
    live: Any | None = None,
    extensions: tuple[Any, ...] = (),
) -> LocalGateway:
    """A (not yet started) gateway serving the real handlers, which reply through its own
    Management API with the same boto3 code as in AWS. ``live``: the handlers'
    :class:`~streamfleet.wsapi.handlers.config.LiveTables` (subscribe), if any;
    ``extensions``: the routes they add
    (:class:`~streamfleet.wsapi.handlers.extensions.RouteExtension`), whose route keys the
    gateway selects as the deployed API does."""
    from streamfleet.wsapi.handlers import WsApiHandlers
    from streamfleet.wsapi.handlers.config import HandlerConfig

    routes = (
        *settings.routes,
        *(r for e in extensions for r in e.routes if r not in settings.routes),
    )
    settings = replace(settings, routes=routes)

    def factory(endpoint: str) -> LambdaFunction:
        config = HandlerConfig(state_table, connections_table, settings.region, endpoint, live=live)
        return WsApiHandlers(config, dynamodb=dynamodb, extensions=extensions)

    return LocalGateway(settings, authorizer=authorizer, handler_factory=factory)
