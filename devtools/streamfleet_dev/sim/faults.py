"""A fault layer at the transport: between the real lease code and a real DynamoDB server.

:class:`FaultyClient` stands where the code's :class:`~streamfleet.aws.AsyncClient` stands and
decides, per request, what the network does with it (a :class:`FaultPlan` says what):

* ``pass``; ``delay`` (a slow server: if the delay exceeds the client's read timeout, the caller
  sees the timeout and the request is still applied when it arrives, as with a real server);
* ``lose_answer``: applied, and the caller sees a timeout;
* ``late``: the caller sees a timeout now; the request reaches the server later, after requests
  sent after it (a retry overtaken by the original);
* ``duplicate``: applied now, and once more a little later;
* ``throttle`` / ``server_error``: refused (``ThrottlingException``, HTTP 500), not applied;
* ``timeout``: not applied, and the caller sees a timeout;
* ``stale_index``: a query on a secondary index answered from an earlier view of that index
  (DynamoDB's GSIs are eventually consistent; dynalite and moto update theirs synchronously, so
  only a test shows what the lag does: a row missing after it was written, or still there after
  it was removed).

Late and duplicate deliveries are made by the :class:`Network` from a thread of its own, like a
network that goes on delivering while the sender is frozen or dead. The guard of a request
(``AsyncClient.call(guard=...)``, the holder's deadline checked at the send) runs when the caller
sends it, as in the real client: what the network does afterwards is beyond the sender.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from botocore.exceptions import ClientError, ReadTimeoutError

from streamfleet.aws import AsyncClient
from streamfleet.lease.errors import StoreUnavailable

WRITES = frozenset(
    {"put_item", "update_item", "delete_item", "batch_write_item", "transact_write_items"}
)


class Fault(StrEnum):
    PASS = "pass"
    DELAY = "delay"
    LOSE_ANSWER = "lose_answer"
    LATE = "late"
    DUPLICATE = "duplicate"
    THROTTLE = "throttle"
    SERVER_ERROR = "server_error"
    TIMEOUT = "timeout"
    STALE_INDEX = "stale_index"


@dataclass(frozen=True)
class Decision:
    """What happens to one request. ``seconds``: the delay, how late, or how stale.
    ``before``: a coroutine run before the request is sent (a scripted interleaving: a START
    landing between two writes of one operation)."""

    fault: Fault = Fault.PASS
    seconds: float = 0.0
    before: Callable[[], Awaitable[Any]] | None = None


PASS = Decision()


class FaultPlan(Protocol):
    def decide(self, client: str, operation: str, params: dict[str, Any]) -> Decision:
        """What the network does with this request."""


@dataclass
class Rule:
    """One scripted fault: the ``nth`` (1-based, counting only requests that ``matches``)
    request for which ``matches(client, operation, params)`` holds gets ``decision``."""

    matches: Callable[[str, str, dict[str, Any]], bool]
    decision: Decision
    nth: int = 1
    seen: int = 0
    used: bool = False


class Script:
    """A fault plan written by a test: rules, each applied once, in order of their ``nth``."""

    def __init__(self, *rules: Rule):
        self.rules = list(rules)

    def add(self, rule: Rule) -> Rule:
        self.rules.append(rule)
        return rule

    def decide(self, client: str, operation: str, params: dict[str, Any]) -> Decision:
        for rule in self.rules:
            if rule.used or not rule.matches(client, operation, params):
                continue
            rule.seen += 1
            if rule.seen == rule.nth:
                rule.used = True
                return rule.decision
        return PASS


def on(operation: str, *, client: str | None = None, where: Callable[[dict], bool] | None = None):
    """A rule predicate: this operation (of this client), optionally with params matching."""

    def matches(name: str, op: str, params: dict[str, Any]) -> bool:
        return (
            op == operation
            and (client is None or name == client)
            and (where is None or bool(where(params)))
        )

    return matches


@dataclass
class RandomFaults:
    """Seeded random faults: while ``active``, each request is faulty with probability ``rate``,
    the kind drawn from ``kinds`` (weights); during an outage every request is refused or times
    out. One random stream per plan, so a schedule replays its draws in request order."""

    rng: random.Random
    rate: float = 0.1
    kinds: dict[Fault, float] = field(
        default_factory=lambda: {
            Fault.DELAY: 3,
            Fault.LOSE_ANSWER: 2,
            Fault.LATE: 2,
            Fault.DUPLICATE: 1,
            Fault.THROTTLE: 1,
            Fault.SERVER_ERROR: 1,
            Fault.TIMEOUT: 1,
            Fault.STALE_INDEX: 2,
        }
    )
    max_seconds: float = 0.5  # how long a delay, how late a late delivery, how stale an index
    active: bool = True
    outage: bool = False
    injected: Counter[str] = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def decide(self, client: str, operation: str, params: dict[str, Any]) -> Decision:
        with self._lock:
            if self.outage:
                fault = self.rng.choice((Fault.TIMEOUT, Fault.SERVER_ERROR))
                self.injected[f"outage_{fault}"] += 1
                return Decision(fault, 0.05)
            if not self.active or self.rng.random() >= self.rate:
                return PASS
            kinds = [k for k in self.kinds if k is not Fault.STALE_INDEX or "IndexName" in params]
            fault = self.rng.choices(kinds, weights=[self.kinds[k] for k in kinds])[0]
            self.injected[str(fault)] += 1
            if operation == "batch_write_item" and fault in (Fault.LATE, Fault.DUPLICATE):
                # Message writes are not fenced: the design assumes one that was sent before the
                # holder's deadline reaches DynamoDB within the safety margin
                # (docs/lease-model.md). Model that bound here; unbounded late delivery is
                # exercised on fenced writes.
                return Decision(fault, self.rng.uniform(0.0, 0.05))
            return Decision(fault, self.rng.uniform(0.01, self.max_seconds))


def index_key(params: dict[str, Any]) -> str | None:
    """What identifies "the same question" to a secondary index, or ``None`` for other reads."""
    if "IndexName" not in params:
        return None
    return json.dumps(
        [
            params.get("TableName"),
            params.get("IndexName"),
            params.get("KeyConditionExpression"),
            params.get("FilterExpression"),
            params.get("ExpressionAttributeValues"),
            params.get("ExclusiveStartKey"),
        ],
        sort_keys=True,
        default=str,
    )


class Network:
    """Delivers late and duplicated requests from its own thread, and remembers what every index
    query was answered, so a stale answer is one the index really gave a moment ago."""

    def __init__(self) -> None:
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()
        self._answers: dict[str, list[tuple[float, dict[str, Any]]]] = {}
        self.delivered_late = 0

    def deliver_later(self, client: Any, operation: str, params: dict[str, Any], delay: float):
        def deliver() -> None:
            # The sender gave up on it long ago: nobody hears the answer.
            with contextlib.suppress(Exception):
                getattr(client, operation)(**params)
            with self._lock:
                self.delivered_late += 1
                self._timers.discard(timer)

        timer = threading.Timer(delay, deliver)
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
        timer.start()

    def remember(self, key: str, answer: dict[str, Any]) -> None:
        now = time.monotonic()
        with self._lock:
            answers = self._answers.setdefault(key, [])
            answers.append((now, answer))
            del answers[:-50]

    def earlier_answer(self, key: str, within: float) -> dict[str, Any] | None:
        """The oldest answer given to this query in the last ``within`` seconds."""
        cutoff = time.monotonic() - within
        with self._lock:
            for at, answer in self._answers.get(key, []):
                if at >= cutoff:
                    return answer
        return None

    def quiesce(self, timeout: float = 10.0) -> None:
        """Wait until every late delivery has been made."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._timers:
                    return
            time.sleep(0.01)


def _timeout(client: AsyncClient) -> ReadTimeoutError:
    return ReadTimeoutError(endpoint_url=client.client.meta.endpoint_url)


def _refusal(operation: str, fault: Fault) -> ClientError:
    if fault is Fault.THROTTLE:
        error = {"Code": "ThrottlingException", "Message": "Rate exceeded (injected)"}
        return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 400}}, operation)
    error = {"Code": "InternalServerError", "Message": "Internal server error (injected)"}
    return ClientError({"Error": error, "ResponseMetadata": {"HTTPStatusCode": 500}}, operation)


@dataclass
class Sent:
    """One request as it left the caller (what the checkers read)."""

    at: float
    client: str
    operation: str
    fault: Fault
    params: dict[str, Any]


class Dead(StoreUnavailable):
    """The process is gone: nothing it calls leaves the machine. (Only the harness's clean-up
    of a killed worker ever sees this: a killed worker runs no code.)"""


class FaultyClient:
    """An :class:`~streamfleet.aws.AsyncClient` look-alike that passes each request through the
    network's faults. ``dead``: the process was killed; every call fails and sends nothing."""

    def __init__(
        self,
        inner: AsyncClient,
        *,
        name: str,
        plan: FaultPlan,
        network: Network,
        record: Callable[[Sent], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.inner = inner
        self.name = name
        self.plan = plan
        self.network = network
        self.settings = inner.settings
        self.requests: Counter[str] = Counter()
        self.dead = False
        self._record = record
        self._clock = clock

    async def call(
        self, operation: str, *, guard: Callable[[], object] | None = None, **params: Any
    ) -> dict[str, Any]:
        if self.dead:
            raise Dead(f"{self.name}: the process is gone")
        decision = self.plan.decide(self.name, operation, params)
        if decision.before is not None:
            await decision.before()
        fault, seconds = decision.fault, decision.seconds
        read_timeout = self.settings.read_timeout_seconds

        def sending() -> None:
            # Run where the real client runs its guard, at the send (in the pool thread): a
            # process frozen between the call and the send is caught there, as in production.
            if self.dead:  # killed while this attempt waited: it never leaves
                raise Dead(f"{self.name}: the process is gone")
            if guard is not None:
                guard()
            self.requests[operation] += 1
            if self._record is not None:
                self._record(Sent(self._clock(), self.name, operation, fault, params))

        if fault is Fault.DELAY and seconds >= read_timeout:
            # A server slower than the read timeout: the caller gives up, the server applies it.
            sending()
            self.network.deliver_later(self.inner.client, operation, params, seconds)
            await asyncio.sleep(read_timeout)
            raise _timeout(self.inner)
        if fault is Fault.DELAY:
            await asyncio.sleep(seconds)
            return await self._send(operation, params, sending)
        if fault is Fault.LOSE_ANSWER:
            await self._send(operation, params, sending)
            await asyncio.sleep(min(seconds, read_timeout))
            raise _timeout(self.inner)
        if fault is Fault.LATE:
            sending()
            self.network.deliver_later(self.inner.client, operation, params, seconds)
            await asyncio.sleep(min(seconds / 4, read_timeout))
            raise _timeout(self.inner)
        if fault is Fault.DUPLICATE:
            answer = await self._send(operation, params, sending)
            self.network.deliver_later(self.inner.client, operation, params, seconds)
            return answer
        if fault in (Fault.THROTTLE, Fault.SERVER_ERROR):
            raise _refusal(operation, fault)
        if fault is Fault.TIMEOUT:
            await asyncio.sleep(min(seconds, read_timeout))
            raise _timeout(self.inner)
        if fault is Fault.STALE_INDEX and operation == "query":
            key = index_key(params)
            earlier = None if key is None else self.network.earlier_answer(key, seconds)
            if earlier is not None:
                return earlier
        return await self._send(operation, params, sending)

    async def _send(
        self, operation: str, params: dict[str, Any], sending: Callable[[], None]
    ) -> dict[str, Any]:
        answer = await self.inner.call(operation, guard=sending, **params)
        key = index_key(params) if operation == "query" else None
        if key is not None:
            self.network.remember(key, answer)
        return answer

    def close(self) -> None:
        self.inner.close()
