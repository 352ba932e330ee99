"""The fan-out Lambda: the messages table's change stream, posted live to every subscriber.

Each Region's replica of the messages table has its own DynamoDB stream, with the writes made in
that Region *and* the ones replicated into it, so each Region fans out to its own clients, and a
client served by the secondary after a failover keeps receiving what the primary's fleet stores.
Lambda's event source mapping reads the stream shard by shard, in order, and invokes this
function with a batch of records. For one batch it:

1. keeps the new image of every ``INSERT``/``MODIFY`` of a ``CONN#<stream>`` item (a rewrite by
   a worker that resumed is a ``MODIFY`` of the same ``(pk, seq)``: the client drops it as a
   duplicate), grouped by stream and sorted by seq;
2. reads each stream's subscribers in this Region with one *consistent* query of the
   subscriptions table (``STREAM#<stream>``). Consistency is what closes the race with a
   subscribe: the subscribe handler registers the connection before it reads its replay, so a
   message stored after that read is processed here after the registration, and a consistent
   read sees it (an index, being eventually consistent, could miss it, and the message would be
   in neither the replay nor the live push);
3. packs each stream's messages into as few frames as API Gateway allows (32 KB each,
   :func:`~.delivery.pack_frames`) and posts them to each subscriber through the Management API
   at this Region's stage (``APIGW_MANAGEMENT_ENDPOINT``), subscribers in parallel
   (``FANOUT_POST_THREADS``), each subscriber's frames in order;
   Only to subscribers that may read the stream *now*: the stream's ``readers`` are read
   (consistently) once per stream and batch, and a subscriber whose reader tags (recorded at
   its subscribe) no longer match, or whose token has expired, gets nothing: its subscription is
   deleted and its connection closed, so that the client reconnects with a fresh token and
   subscribes again (refused if it may no longer read). A message stored after the START that
   changed ``readers`` was answered is processed after that write, so no such subscriber gets it;
4. a ``GoneException`` (the client left without a ``$disconnect``) deletes that subscription; any
   other failure to post, after one retry, closes the connection (``DeleteConnection``): a
   subscriber that cannot take its messages now resumes from the stored log when it reconnects,
   instead of holding a buffer anywhere or blocking the shard for everyone else.

How long one subscriber can hold its shard is bounded. A subscriber's frames must all be posted
within its budget (``FANOUT_SUBSCRIBER_BUDGET_MS`` plus :data:`FRAME_ALLOWANCE_MS` per frame),
counted from its first post; a throttled or failed post is retried with backoff only within
it, and past it the subscriber is closed to resume from the log. A post, or the close (or the
one-attempt ``DeleteItem`` of a gone subscriber's subscription) after it, gives up after
:data:`POST_TIMEOUT_S` of silence (botocore's connect and read timeouts, per socket operation:
an answer that trickles in byte by byte could take longer). So one subscriber's delivery ends
within about ``budget + 2 x POST_TIMEOUT_S`` of its start, however slowly its connection
drains. The batch as a whole stops posting :data:`INVOCATION_MARGIN_MS` before the function's
timeout; it still closes the subscribers it did not serve for :data:`POST_TIMEOUT_S` more, and
leaves any others to find the gap themselves (their cursor asks the log for it when a later
message shows it, or when they reconnect). A batch therefore does not time out, and is not
retried (holding every stream of its shard), for its subscribers' slowness.

A failure to read the subscribers raises: Lambda retries the whole batch (posts already made
are repeated, and the clients drop them as duplicates). At least once on the wire, exactly once
to the application.

Metrics (Embedded Metric Format on stdout, one document per invocation, namespace
:data:`~streamfleet.model.METRIC_NAMESPACE`, dimension ``ServiceName`` = ``SERVICE_NAME``, which
the construct sets per fan-out, else :data:`~streamfleet.model.FANOUT_SERVICE_NAME`): messages
delivered (messages x subscribers), posts, gone subscribers, failed posts, subscribers over
budget, disconnected subscribers, and the lag from the worker's receipt of the batch's oldest
message to its post.

Environment: ``SUBSCRIPTIONS_TABLE_NAME``, ``STREAMS_TABLE_NAME``, ``APIGW_MANAGEMENT_ENDPOINT``
(required), ``FANOUT_POST_THREADS`` (default 16), ``FANOUT_SUBSCRIBER_BUDGET_MS`` (default 1000),
``SERVICE_NAME`` (default ``streamfleet-fanout``), ``AWS_REGION``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import random
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .. import emf, model, readers
from ..backoff import full_jitter
from ..clock import SYSTEM_CLOCK, Clock
from ..env import ConfigError, EnvironmentCache, required
from ..lease.dynamo import error_code, from_item, to_attr
from ..logs import configured, log_event
from ..validation import check_service_name
from .delivery import SOURCE_LIVE, StoredMessage, message_from_item, pack_frames

logger = logging.getLogger(__name__)

DEFAULT_POST_THREADS = 16
MAX_POST_THREADS = 64
DEFAULT_SUBSCRIBER_BUDGET_MS = 1_000
MAX_SUBSCRIBER_BUDGET_MS = 30_000
# A healthy post takes tens of milliseconds: each frame of a subscriber's share of the batch adds
# this much to its budget, so a big batch is not taken for a slow reader.
FRAME_ALLOWANCE_MS = 50
# A post that cannot be made in this time is worth less than the client's resume from the log.
# The SDK makes one attempt; the fan-out retries once itself, and only within the subscriber's
# budget (the SDK's own retries and their backoff could not be stopped at a deadline).
# Connect above 1 s: Linux retransmits a lost SYN after 1 s, and one lost SYN is no reason to
# close a subscriber.
_POST_CONNECT_TIMEOUT_S = 2.0
_POST_READ_TIMEOUT_S = 2.0
POST_TIMEOUT_S = _POST_CONNECT_TIMEOUT_S + _POST_READ_TIMEOUT_S
# What a post in flight and the close after it may still take when posting stops.
INVOCATION_MARGIN_MS = int(2 * POST_TIMEOUT_S * 1000) + 1_000
# A throttled or failed post is tried again within the subscriber's budget, backing off
# (full jitter from 50 ms, doubling), at most this many times in all.
_MAX_POST_ATTEMPTS = 4
_RETRY_BASE_S = 0.05
# Answers worth one more attempt: throttled, or the service's own failure.
_RETRYABLE_POST_ERRORS = frozenset(
    {
        "LimitExceededException",
        "ThrottlingException",
        "TooManyRequestsException",
        "InternalServerError",
        "InternalFailure",
        "ServiceUnavailable",
    }
)
_MANAGEMENT_CONFIG = Config(
    connect_timeout=_POST_CONNECT_TIMEOUT_S,
    read_timeout=_POST_READ_TIMEOUT_S,
    retries={"total_max_attempts": 1, "mode": "standard"},
    max_pool_connections=MAX_POST_THREADS,
)
_ONE_ATTEMPT_DYNAMODB_CONFIG = Config(
    connect_timeout=_POST_CONNECT_TIMEOUT_S,
    read_timeout=_POST_READ_TIMEOUT_S,
    retries={"total_max_attempts": 1, "mode": "standard"},
    max_pool_connections=MAX_POST_THREADS,
)
_DYNAMODB_CONFIG = Config(
    connect_timeout=1.0,
    read_timeout=3.0,
    retries={"max_attempts": 5, "mode": "standard"},
    max_pool_connections=MAX_POST_THREADS,
)


@dataclass(frozen=True)
class FanoutConfig:
    """The fan-out's settings, immutable once read."""

    subscriptions_table: str
    management_endpoint: str
    region: str
    streams_table: str  # the fleet's lease table: each stream's readers
    service_name: str = model.FANOUT_SERVICE_NAME  # its metrics' service dimension
    post_threads: int = DEFAULT_POST_THREADS
    subscriber_budget_ms: int = DEFAULT_SUBSCRIBER_BUDGET_MS
    frame_allowance_ms: int = FRAME_ALLOWANCE_MS

    def budget_s(self, frames: int) -> float:
        """How long one subscriber's ``frames`` may take to post, from its first post."""
        return (self.subscriber_budget_ms + frames * self.frame_allowance_ms) / 1000

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> FanoutConfig:
        env = os.environ if env is None else env
        endpoint = required(env, model.ENV_APIGW_MANAGEMENT_ENDPOINT)
        if not endpoint.startswith(("https://", "http://")):
            raise ConfigError(
                model.ENV_APIGW_MANAGEMENT_ENDPOINT, "expected the stage's https endpoint"
            )

        def whole(name: str, default: int, low: int, high: int) -> int:
            raw = env.get(name, "").strip()
            if not raw:
                return default
            if not raw.isdigit() or not low <= int(raw) <= high:
                raise ConfigError(name, f"{raw!r} is not {low} to {high}")
            return int(raw)

        return cls(
            subscriptions_table=required(env, model.ENV_SUBSCRIPTIONS_TABLE_NAME),
            management_endpoint=endpoint,
            region=required(env, "AWS_REGION"),
            streams_table=required(env, model.ENV_STREAMS_TABLE_NAME),
            service_name=_service_name(env),
            post_threads=whole(
                model.ENV_FANOUT_POST_THREADS, DEFAULT_POST_THREADS, 1, MAX_POST_THREADS
            ),
            subscriber_budget_ms=whole(
                model.ENV_FANOUT_SUBSCRIBER_BUDGET_MS,
                DEFAULT_SUBSCRIBER_BUDGET_MS,
                1,
                MAX_SUBSCRIBER_BUDGET_MS,
            ),
        )


def _service_name(env: Mapping[str, str]) -> str:
    """The metrics' service dimension: what the construct set, the package's name if unset."""
    raw = env.get(model.ENV_SERVICE_NAME, "").strip()
    try:
        return check_service_name(model.ENV_SERVICE_NAME, raw) if raw else model.FANOUT_SERVICE_NAME
    except ValueError as exc:
        raise ConfigError(model.ENV_SERVICE_NAME, str(exc).partition(": ")[2]) from None


@dataclass
class FanoutStats:
    """What one invocation did (the metric document's values)."""

    records: int = 0
    streams: int = 0
    messages: int = 0
    subscribers: int = 0
    delivered: int = 0
    posts: int = 0
    gone: int = 0
    failed_posts: int = 0
    disconnected: int = 0
    over_budget: int = 0
    revoked: int = 0
    lag_ms: int | None = None
    by_stream: dict[str, int] = field(default_factory=dict)


def messages_by_stream(records: Iterable[Mapping[str, Any]]) -> dict[str, list[StoredMessage]]:
    """The new images of a batch's ``INSERT``/``MODIFY`` records of stream messages, by stream,
    sorted by seq, the last image of a seq winning (records of one item arrive in write order)."""
    latest: dict[str, dict[int, StoredMessage]] = {}
    for record in records:
        if record.get("eventName") not in ("INSERT", "MODIFY"):
            continue  # REMOVE: an unsealed tail removed, or expired by TTL: nothing to send
        image = from_item((record.get("dynamodb") or {}).get("NewImage"))
        if not image or not str(image.get(model.PK, "")).startswith(model.CONNECTION_PREFIX):
            continue
        try:
            message = message_from_item(image)
        except (KeyError, TypeError, ValueError):
            continue
        stream = model.connection_id_of(str(image[model.PK]))
        latest.setdefault(stream, {})[message.seq] = message
    return {stream: sorted(by_seq.values()) for stream, by_seq in latest.items()}


class Fanout:
    """One Region's fan-out; thread-safe (the local event source may call it concurrently)."""

    def __init__(
        self,
        config: FanoutConfig,
        *,
        dynamodb: Any | None = None,
        management: Any | None = None,
        clock: Clock = SYSTEM_CLOCK,
        metrics_out: Callable[[str], None] | None = None,
        pool: Executor | None = None,
        sleep: Callable[[float], None] | None = None,
        rng: random.Random | None = None,
    ):
        """``pool``, ``sleep`` and ``rng`` run the posts, their backoff's pauses and its draws:
        threads, real time and an unseeded generator unless a simulation brings its own."""
        self.config = config
        # A session costs milliseconds to build: only once a client is to be made here.
        session = functools.cache(boto3.session.Session)
        self.dynamodb = dynamodb or session().client(
            "dynamodb", region_name=config.region, config=_DYNAMODB_CONFIG
        )
        self.management = management or session().client(
            "apigatewaymanagementapi",
            endpoint_url=config.management_endpoint,
            region_name=config.region,
            config=_MANAGEMENT_CONFIG,
        )
        # Forgetting a gone subscriber is a courtesy (its subscription has a TTL): one attempt,
        # so that it fits the time a subscriber may hold its shard.
        self._forget_dynamodb = dynamodb or session().client(
            "dynamodb", region_name=config.region, config=_ONE_ATTEMPT_DYNAMODB_CONFIG
        )
        self.clock = clock
        self._pool = pool or ThreadPoolExecutor(
            config.post_threads, thread_name_prefix="fanout-post"
        )
        self._sleep = sleep or time.sleep
        self._rng = rng or random.Random()
        self._metrics_out = metrics_out or emf.write

    def __call__(self, event: Mapping[str, Any], context: Any = None) -> dict[str, Any]:
        """Deliver one batch of stream records; raises (the batch is retried) only when the
        subscribers could not be read."""
        records = event.get("Records") or []
        stats = FanoutStats(records=len(records))
        batches = messages_by_stream(records)
        stats.streams = len(batches)
        work: list[tuple[str, str, list[bytes]]] = []
        oldest: int | None = None
        # Every stream's subscribers at once, on the posting threads: one query after another
        # would bound a shard to about 1 / (query latency) streams per second, below the
        # record rate of a hundred busy streams. A failed read still fails the whole batch.
        audiences = dict(zip(batches, self._pool.map(self.audience, batches), strict=True))
        revoked = [(stream, c) for stream, (_, gone) in audiences.items() for c in gone]
        stats.revoked = sum(self._pool.map(lambda item: self._revoke(*item), revoked))
        for stream, messages in batches.items():
            stats.messages += len(messages)
            subscribers, _ = audiences[stream]
            if not subscribers:
                continue
            frames = pack_frames(stream, messages, region=self.config.region, source=SOURCE_LIVE)
            stats.subscribers += len(subscribers)
            stats.by_stream[stream] = len(subscribers)
            work += [(stream, connection_id, frames) for connection_id in subscribers]
            stats.delivered += len(messages) * len(subscribers)
            received = [m.received_at_ms for m in messages if m.received_at_ms is not None]
            if received:
                oldest = min(received) if oldest is None else min(oldest, *received)
        stop_at = self._stop_posting_at(context)
        for outcome in self._pool.map(lambda item: self._deliver(*item, stop_at), work):
            stats.posts += outcome.posts
            stats.gone += outcome.gone
            stats.failed_posts += outcome.failed
            stats.over_budget += outcome.over_budget
            stats.disconnected += outcome.disconnected
            stats.delivered -= outcome.undelivered
        if oldest is not None:
            stats.lag_ms = max(0, self.clock.wall_ms() - oldest)
        self._emit(stats)
        return {"batchItemFailures": []}

    def audience(self, stream: str) -> tuple[list[str], list[str]]:
        """The connection ids subscribed to ``stream`` in this Region that may read it now, and
        those that may not any more (readers changed, or their token expired)."""
        allowed_readers = self.readers(stream)
        now_s = self.clock.wall_ms() // 1000
        allowed: list[str] = []
        revoked: list[str] = []
        for subscriber in self.subscribers(stream):
            expires_at = subscriber.get(model.SUB_TOKEN_EXPIRES_AT)
            user = subscriber.get(model.SUB_USER_ID)
            tags = [
                *([readers.user_tag(user)] if isinstance(user, str) and user else []),
                *readers.decode_tags(subscriber.get(model.SUB_READER_TAGS)),
            ]
            may = readers.may_read(allowed_readers, tags) and (
                expires_at is None or int(expires_at) > now_s
            )
            (allowed if may else revoked).append(str(subscriber[model.SUB_CONNECTION]))
        return allowed, revoked

    def readers(self, stream: str) -> Any:
        """The stream's ``readers`` as its START left them (a consistent read)."""
        response = self.dynamodb.get_item(
            TableName=self.config.streams_table,
            Key={model.PK: to_attr(model.connection_pk(stream))},
            ProjectionExpression="#readers",
            ExpressionAttributeNames={"#readers": model.READERS},
            ConsistentRead=True,
        )
        return (from_item(response.get("Item")) or {}).get(model.READERS)

    def subscribers(self, stream: str) -> list[dict[str, Any]]:
        """The subscriptions to ``stream`` in this Region (a consistent read): connection id,
        user, the claim tags of its token, token expiry."""
        params: dict[str, Any] = {
            "TableName": self.config.subscriptions_table,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {
                "#pk": model.PK,
                "#c": model.SUB_CONNECTION,
                "#user": model.SUB_USER_ID,
                "#tags": model.SUB_READER_TAGS,
                "#exp": model.SUB_TOKEN_EXPIRES_AT,
            },
            "ExpressionAttributeValues": {":pk": to_attr(model.stream_subscribers_pk(stream))},
            "ProjectionExpression": "#c, #user, #tags, #exp",
            "ConsistentRead": True,
        }
        found: list[dict[str, Any]] = []
        while True:
            response = self.dynamodb.query(**params)
            found += [from_item(item) or {} for item in response.get("Items", [])]
            if "LastEvaluatedKey" not in response:
                return found
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]

    def _revoke(self, stream: str, connection_id: str) -> int:
        """A subscriber that may no longer read: forget its subscription and close its
        connection (the client reconnects with a fresh token and is refused or served anew)."""
        log_event(
            logger,
            logging.INFO,
            "fanout_revoke",
            decision="disconnect",
            stream=stream,
            connectionId=connection_id,
        )
        self._forget(stream, connection_id)
        # Gone already, or not closable now: it gets nothing either way, its subscription is gone.
        with contextlib.suppress(BotoCoreError, ClientError):
            self.management.delete_connection(ConnectionId=connection_id)
        return 1

    def _stop_posting_at(self, context: Any) -> float | None:
        """The monotonic time at which this invocation stops posting, if it has a timeout."""
        remaining = getattr(context, "get_remaining_time_in_millis", None)
        if remaining is None:
            return None
        return self.clock.monotonic() + (remaining() - INVOCATION_MARGIN_MS) / 1000

    def _deliver(
        self, stream: str, connection_id: str, frames: list[bytes], stop_at: float | None
    ) -> _Outcome:
        outcome = _Outcome()
        deadline = self.clock.monotonic() + self.config.budget_s(len(frames))
        # Past this, nothing more is started, not even a close: what is in flight then still
        # ends before the function's timeout.
        close_by = None if stop_at is None else stop_at + POST_TIMEOUT_S
        if stop_at is not None:
            deadline = min(deadline, stop_at)
        for index, frame in enumerate(frames):
            error = None
            if self.clock.monotonic() < deadline:
                error = self._post(connection_id, frame, deadline)
                if error is None:
                    outcome.posts += 1
                    continue
            outcome.undelivered = _count_messages(frames[index:])
            in_time = close_by is None or self.clock.monotonic() < close_by
            if isinstance(error, ClientError) and error_code(error) == "GoneException":
                outcome.gone = 1
                if in_time:
                    self._forget(stream, connection_id)
                return outcome
            if error is None:
                outcome.over_budget = 1
                detail = f"{index} of {len(frames)} frames posted in its budget"
            else:
                outcome.failed = 1
                detail = f"{type(error).__name__}: {error}"
            if in_time:
                outcome.disconnected = self._disconnect(stream, connection_id, detail)
            return outcome
        return outcome

    def _post(self, connection_id: str, frame: bytes, deadline: float) -> Exception | None:
        """Post one frame: ``None``, or the error of its last attempt. A throttled or failed
        attempt is tried again while the subscriber's budget allows, backing off (full jitter,
        so that the retries of many subscribers do not arrive together)."""
        error: Exception | None = None
        for attempt in range(_MAX_POST_ATTEMPTS):
            if attempt:
                pause = full_jitter(attempt - 1, _RETRY_BASE_S, math.inf, self._rng)
                if self.clock.monotonic() + pause >= deadline:
                    return error
                self._sleep(pause)
            try:
                self.management.post_to_connection(ConnectionId=connection_id, Data=frame)
                return None
            except ClientError as exc:
                error = exc
                status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
                if error_code(exc) not in _RETRYABLE_POST_ERRORS and status < 500:
                    return error
            except BotoCoreError as exc:  # a timeout or a connection error
                error = exc
        return error

    def _forget(self, stream: str, connection_id: str) -> None:
        try:
            self._forget_dynamodb.delete_item(
                TableName=self.config.subscriptions_table,
                Key={
                    model.PK: to_attr(model.stream_subscribers_pk(stream)),
                    model.SUB_CONNECTION: to_attr(connection_id),
                },
            )
        except (BotoCoreError, ClientError) as exc:  # its TTL removes it later
            log_event(
                logger,
                logging.WARNING,
                "fanout_forget",
                decision="error",
                stream=stream,
                connectionId=connection_id,
                detail=str(exc),
            )

    def _disconnect(self, stream: str, connection_id: str, detail: str) -> int:
        """Close a subscriber that cannot take its messages: it resumes from the log."""
        log_event(
            logger,
            logging.WARNING,
            "fanout_post",
            decision="disconnect",
            stream=stream,
            connectionId=connection_id,
            detail=detail,
        )
        try:
            self.management.delete_connection(ConnectionId=connection_id)
        except ClientError as exc:
            if error_code(exc) == "GoneException":
                self._forget(stream, connection_id)
            return 0
        except BotoCoreError:
            return 0
        return 1

    def _emit(self, stats: FanoutStats) -> None:
        values: dict[str, tuple[float, str]] = {
            model.METRIC_FANOUT_DELIVERED: (stats.delivered, emf.COUNT),
            model.METRIC_FANOUT_POSTS: (stats.posts, emf.COUNT),
            model.METRIC_FANOUT_GONE: (stats.gone, emf.COUNT),
            model.METRIC_FANOUT_FAILED_POSTS: (stats.failed_posts, emf.COUNT),
            model.METRIC_FANOUT_DISCONNECTED: (stats.disconnected, emf.COUNT),
            model.METRIC_FANOUT_OVER_BUDGET: (stats.over_budget, emf.COUNT),
            model.METRIC_FANOUT_REVOKED: (stats.revoked, emf.COUNT),
        }
        if stats.lag_ms is not None:
            values[model.METRIC_FANOUT_LAG_MS] = (stats.lag_ms, emf.MILLISECONDS)
        document = emf.document(
            model.METRIC_NAMESPACE,
            {model.METRIC_DIMENSION_SERVICE: self.config.service_name},
            values,
            timestamp_ms=self.clock.wall_ms(),
            records=stats.records,
            streams=stats.streams,
            messages=stats.messages,
            subscribers=stats.subscribers,
        )
        self._metrics_out(emf.line(document))


@dataclass
class _Outcome:
    posts: int = 0
    gone: int = 0
    failed: int = 0
    over_budget: int = 0
    disconnected: int = 0
    undelivered: int = 0


def _count_messages(frames: list[bytes]) -> int:
    """Messages (whole or first parts) in ``frames``: what a failed subscriber did not get."""
    count = 0
    for frame in frames:
        for entry in json.loads(frame)["messages"]:
            count += 1 if entry.get("part", 0) == 0 else 0
    return count


# --- Lambda entry point -------------------------------------------------------------------------

_FANOUT = EnvironmentCache(
    (*model.FANOUT_ENV, "AWS_REGION"), lambda: Fanout(FanoutConfig.from_env())
)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point (``streamfleet.wsapi.fanout.handler``), for a DynamoDB stream event
    source mapping with ``ReportBatchItemFailures``."""
    fanout = configured(_FANOUT, logger, context)
    started = time.monotonic()
    result = fanout(event, context)
    log_event(
        logger,
        logging.DEBUG,
        "fanout_invocation",
        records=len(event.get("Records") or []),
        durationMs=round((time.monotonic() - started) * 1000, 1),
    )
    return result
