"""The retry helpers the lease store is built on, with scripted operations (no server)."""

from __future__ import annotations

import asyncio
import time

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    ParamValidationError,
    ReadTimeoutError,
)

from streamfleet.clock import SYSTEM_CLOCK
from streamfleet.lease.dynamo import hedged, is_transient
from streamfleet.lease.errors import StoreUnavailable


def throttled() -> ClientError:
    return ClientError({"Error": {"Code": "ThrottlingException"}}, "UpdateItem")


async def test_a_slow_attempt_gets_a_sibling_and_the_first_answer_wins():
    started: list[float] = []

    async def attempt() -> str:
        started.append(time.monotonic())
        if len(started) == 1:
            await asyncio.sleep(10)  # the lost (or very slow) request
        return f"answer {len(started)}"

    began = time.monotonic()
    result = await hedged(
        attempt, deadline=began + 5, clock=SYSTEM_CLOCK, what="renew", hedge_after=0.1
    )

    assert result == "answer 2"  # the sibling's, long before the slow one's
    assert len(started) == 2 and started[1] - began > 0.09  # not before the hedge interval


async def test_a_slow_attempt_that_answers_first_is_taken():
    calls = 0
    third = asyncio.Event()

    async def attempt() -> int:
        nonlocal calls
        calls += 1
        mine = calls
        if mine == 3:
            third.set()
        if mine == 1:  # answers once two siblings run, and time for a fourth has passed
            await asyncio.wait_for(third.wait(), 10)
            await asyncio.sleep(0.5)
            return mine
        await asyncio.sleep(10)
        return mine

    began = time.monotonic()
    assert (
        await hedged(attempt, deadline=began + 5, clock=SYSTEM_CLOCK, what="x", hedge_after=0.1)
        == 1
    )
    assert calls == 3  # at most one sibling per hedge interval, bounded by max_in_flight


async def test_failed_attempts_are_retried_after_a_backoff_until_one_succeeds():
    outcomes = [throttled(), ReadTimeoutError(endpoint_url="http://x"), "ok"]

    async def attempt() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    result = await hedged(
        attempt, deadline=time.monotonic() + 5, clock=SYSTEM_CLOCK, what="x", hedge_after=1
    )
    assert result == "ok" and outcomes == []


async def test_a_definite_error_is_raised_at_once():
    async def attempt() -> None:
        raise NoCredentialsError()

    began = time.monotonic()
    with pytest.raises(NoCredentialsError):
        await hedged(attempt, deadline=began + 60, clock=SYSTEM_CLOCK, what="x", hedge_after=30)
    assert time.monotonic() - began < 30  # neither retried nor hedged: raised at the first answer


async def test_the_deadline_ends_it_as_unavailable():
    async def attempt() -> None:
        raise throttled()

    began = time.monotonic()
    with pytest.raises(StoreUnavailable, match="renew: DynamoDB unavailable"):
        await hedged(attempt, deadline=began + 0.5, clock=SYSTEM_CLOCK, what="renew", hedge_after=1)
    assert 0.45 < time.monotonic() - began < 5.5  # at the deadline, not before, not long after


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (EndpointConnectionError(endpoint_url="http://127.0.0.1:1"), True),
        (ConnectTimeoutError(endpoint_url="http://127.0.0.1:1"), True),
        (ReadTimeoutError(endpoint_url="http://127.0.0.1:1"), True),
        (ConnectionClosedError(endpoint_url="http://127.0.0.1:1"), True),
        (ConnectionResetError(), True),
        (
            ClientError({"Error": {"Code": "ThrottlingException"}}, "UpdateItem"),
            True,
        ),
        (
            ClientError(
                {"Error": {"Code": "Whatever"}, "ResponseMetadata": {"HTTPStatusCode": 503}},
                "UpdateItem",
            ),
            True,
        ),
        (NoCredentialsError(), False),
        (NoRegionError(), False),
        (ParamValidationError(report="Missing required parameter"), False),
        (ClientError({"Error": {"Code": "ConditionalCheckFailedException"}}, "UpdateItem"), False),
        (ClientError({"Error": {"Code": "ValidationException"}}, "UpdateItem"), False),
    ],
)
def test_only_network_trouble_throttling_and_5xx_are_retried(error, transient):
    """Missing credentials or a malformed request fail at once with their own message instead
    of being retried until the deadline and reported as DynamoDB being unavailable."""
    assert is_transient(error) is transient


def test_the_backoff_of_a_failure_repeated_for_days_stays_at_its_cap():
    """A stream whose upstream fails on every dial counts its attempts for as long as it lasts:
    at attempt 1,030 ``2**attempt`` no longer converts to a float, and the connection failed."""
    from streamfleet.backoff import full_jitter

    assert all(0 <= full_jitter(attempt, 0.2, 10.0) <= 10.0 for attempt in (64, 1030, 10**6))
