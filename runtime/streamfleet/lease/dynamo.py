"""DynamoDB plumbing shared by the lease classes: item codec, error triage, retries."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, TypeVar

from boto3.dynamodb.types import TypeDeserializer, TypeSerializer
from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotocoreConnectionError

from ..backoff import full_jitter
from ..clock import Clock
from .errors import StoreUnavailable

T = TypeVar("T")

_serializer = TypeSerializer()
_deserializer = TypeDeserializer()

CONDITION_FAILED = "ConditionalCheckFailedException"
_TRANSIENT_CODES = frozenset(
    {
        "ProvisionedThroughputExceededException",
        "ThrottlingException",
        "RequestLimitExceeded",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
        "ServiceUnavailableException",
        "LimitExceededException",
        "TransactionConflictException",
    }
)

BACKOFF_BASE_SECONDS = 0.05
BACKOFF_CAP_SECONDS = 1.0


def to_attr(value: Any) -> dict[str, Any]:
    """A Python value as a DynamoDB attribute value."""
    return _serializer.serialize(value)


def to_item(values: dict[str, Any]) -> dict[str, Any]:
    return {name: to_attr(value) for name, value in values.items()}


def from_item(item: dict[str, Any] | None) -> dict[str, Any] | None:
    """A DynamoDB item as plain Python, whole numbers as ``int``."""
    if item is None:
        return None
    plain = {name: _deserializer.deserialize(value) for name, value in item.items()}
    return {
        name: int(value) if isinstance(value, Decimal) and value == value.to_integral() else value
        for name, value in plain.items()
    }


def error_code(exc: BaseException) -> str | None:
    return exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None


def is_condition_failure(exc: BaseException) -> bool:
    return error_code(exc) == CONDITION_FAILED


def old_item_of(exc: ClientError) -> dict[str, Any] | None:
    """The item DynamoDB returned with a failed condition (``ALL_OLD``); dynalite returns none."""
    return from_item(exc.response.get("Item"))


def is_transient(exc: BaseException) -> bool:
    """Slow or unreachable DynamoDB (retry), as opposed to a definite answer (do not).

    Only network trouble (connect/read timeouts, refused or reset connections, a cut answer:
    botocore's ``ConnectionError`` and ``HTTPClientError`` families, ``IncompleteReadError``, a
    bare ``OSError``) and throttling or 5xx answers are
    transient. Anything else botocore raises is a mistake that no retry can mend: missing
    credentials or region, a malformed request (``ParamValidationError``). Those fail at once
    with their own message instead of being retried until the deadline as "unavailable".
    """
    if isinstance(exc, ClientError):
        code = error_code(exc) or ""
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return code in _TRANSIENT_CODES or status >= 500
    return isinstance(exc, (BotocoreConnectionError, HTTPClientError, IncompleteReadError, OSError))


async def retry_until(
    operation: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    clock: Clock,
    what: str,
) -> T:
    """Run ``operation``, retrying transient failures with backoff and jitter until ``deadline``.

    Definite answers (a failed condition, a validation error) are raised at once. When the
    deadline (monotonic seconds) passes, :class:`StoreUnavailable` says what could not be done.
    """
    attempt = 0
    while True:
        if clock.monotonic() >= deadline:
            raise StoreUnavailable(f"{what}: deadline passed before DynamoDB answered")
        try:
            return await operation()
        except Exception as exc:
            if not is_transient(exc):
                raise
            last = exc
        delay = full_jitter(attempt, BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)
        remaining = deadline - clock.monotonic()
        if remaining <= delay:
            raise StoreUnavailable(f"{what}: DynamoDB unavailable until the deadline ({last})")
        await asyncio.sleep(delay)
        attempt += 1


async def hedged(
    operation: Callable[[], Awaitable[T]],
    *,
    deadline: float,
    clock: Clock,
    what: str,
    hedge_after: float,
    max_in_flight: int = 3,
) -> T:
    """Like :func:`retry_until`, but an attempt that has not answered within ``hedge_after`` is
    not waited for alone: another is sent beside it, and the first answer wins.

    For an operation whose attempts are safe to apply in any order and any number of times (a
    renewal that never lowers the expiry). A slow DynamoDB then costs a little latency instead of
    a timeout, and a lost request costs ``hedge_after`` instead of a whole read timeout. Attempts
    still in flight when one answers are left to finish; their answers are ignored.
    """
    pending: set[asyncio.Task[T]] = set()
    sent: list[asyncio.Task[T]] = []
    attempt = 0
    next_send = clock.monotonic()
    last: BaseException | None = None
    try:
        while True:
            now = clock.monotonic()
            if now >= deadline:
                reason = f" ({last})" if last else ""
                raise StoreUnavailable(f"{what}: DynamoDB unavailable until the deadline{reason}")
            if now >= next_send and len(pending) < max_in_flight:
                sent.append(asyncio.ensure_future(operation()))
                pending.add(sent[-1])
                next_send = now + hedge_after
            wake = max(min(deadline, next_send) - now, 0.001)
            if not pending:  # backing off after a failed attempt
                await asyncio.sleep(wake)
                continue
            done, _ = await asyncio.wait(pending, timeout=wake, return_when=asyncio.FIRST_COMPLETED)
            # Oldest attempt first: a set iterates in its tasks' hash order, which differs from
            # run to run, and then so would which of two answers wins and the backoff drawn.
            for task in sorted(done, key=sent.index):
                pending.discard(task)
                exc = task.exception()
                if exc is None:
                    return task.result()
                if not is_transient(exc):
                    raise exc
                last = exc
                # A failed attempt is retried after a backoff, not at once (throttling).
                retry_at = now + full_jitter(attempt, BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)
                next_send = min(next_send, retry_at) if pending else retry_at
                attempt += 1
    finally:
        for task in pending:
            task.add_done_callback(_consume)


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        task.exception()  # an abandoned attempt's error is not worth a warning


async def conditional_write(
    client: Any, operation: str, *, clock: Clock, deadline: float, what: str, **params: Any
) -> bool:
    """One conditional write, transient failures retried until ``deadline``.

    ``True`` if it was applied, ``False`` if its condition did not hold (an answer, not an
    error); anything else is raised.
    """
    try:
        await retry_until(
            lambda: client.call(operation, **params), deadline=deadline, clock=clock, what=what
        )
    except Exception as exc:
        if is_condition_failure(exc):
            return False
        raise
    return True


MAX_BATCH_GET_KEYS = 100  # DynamoDB's limit per BatchGetItem request


def names(*attributes: str) -> dict[str, str]:
    """``ExpressionAttributeNames`` for attributes referred to as ``#<attribute>``.

    Every attribute goes through a placeholder, so no name ever collides with one of DynamoDB's
    several hundred reserved words (``data``, ``region`` and ``load`` among them).
    """
    return {f"#{attribute}": attribute for attribute in attributes}


async def batch_get(
    client: Any,
    *,
    table_name: str,
    keys: list[dict[str, Any]],
    consistent: bool,
    clock: Clock,
    deadline: float,
    what: str,
) -> list[dict[str, Any]]:
    """Read ``keys`` in requests of 100, retrying ``UnprocessedKeys`` with backoff until done."""
    items: list[dict[str, Any]] = []
    for start in range(0, len(keys), MAX_BATCH_GET_KEYS):
        pending = keys[start : start + MAX_BATCH_GET_KEYS]
        attempt = 0
        while pending:
            request = {table_name: {"Keys": pending, "ConsistentRead": consistent}}
            response = await retry_until(
                lambda request=request: client.call("batch_get_item", RequestItems=request),
                deadline=deadline,
                clock=clock,
                what=what,
            )
            items.extend(
                from_item(raw) for raw in response.get("Responses", {}).get(table_name, [])
            )
            pending = response.get("UnprocessedKeys", {}).get(table_name, {}).get("Keys", [])
            if pending:
                delay = full_jitter(attempt, BACKOFF_BASE_SECONDS, BACKOFF_CAP_SECONDS)
                if clock.monotonic() + delay >= deadline:
                    raise StoreUnavailable(f"{what}: keys left unprocessed until the deadline")
                await asyncio.sleep(delay)
                attempt += 1
    return items


async def query_all(
    client: Any, *, clock: Clock, deadline: float, what: str, **params: Any
) -> list[dict[str, Any]]:
    """Every item of a query, following ``LastEvaluatedKey`` pages."""
    items: list[dict[str, Any]] = []
    while True:
        response = await retry_until(
            lambda params=dict(params): client.call("query", **params),
            deadline=deadline,
            clock=clock,
            what=what,
        )
        items.extend(from_item(raw) for raw in response.get("Items", []))
        last = response.get("LastEvaluatedKey")
        if not last or ("Limit" in params and len(items) >= params["Limit"]):
            return items
        params["ExclusiveStartKey"] = last
