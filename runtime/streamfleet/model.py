"""The data model: the one place where table, attribute, index and metric names are spelled.

The CDK constructs, the worker, the Lambda handlers, the local mode and the tests all import
these names; none of them retypes a name. Changing a name here changes it everywhere, which is
the point: a typo in a condition expression would otherwise be a silent split-brain bug.

Two tables:

* the **lease table** holds one *connection item* per upstream connection (``pk = CONN#<id>``)
  and one *session item* per worker session (``pk = SESSION#<worker>#<version>``);
* the **messages table** holds every upstream message under ``(pk, seq)``, so a replay after a
  failover rewrites the same items instead of adding duplicates.

Every index is *sparse*: an attribute that is an index key is written only when it has a
meaning and removed otherwise (never set to ``""``, which DynamoDB rejects in an index key and
dynalite silently accepts).
"""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from enum import StrEnum

# --- Table names (defaults; deployed names come from TABLE_NAME / MESSAGES_TABLE_NAME) ---

DEFAULT_LEASE_TABLE_NAME = "streamfleet-connections"
DEFAULT_MESSAGES_TABLE_NAME = "streamfleet-messages"

# --- Keys ---

PK = "pk"
SEQ = "seq"  # sort key of the messages table: a log position (see below)

# --- Log positions: (epoch, seq) in one sort key ---
#
# A stream's stored log is a sequence of *epochs*: an upstream that restarts its numbering (or
# resends a seq with other content) begins the next epoch, so its new messages are neither taken
# for duplicates nor written over the old ones. A message is stored at the *position*
# ``epoch * EPOCH_STRIDE + seq``: positions order the whole log, epoch by epoch, and epoch 0's
# positions are its seqs. Positions stay inside the worker and the tables; the wire carries the
# epoch and the seq apart (both at most MAX_SEQ, which JavaScript clients count exactly).
MAX_SEQ = 2**53 - 1
EPOCH_STRIDE = 2**53
MAX_EPOCH = 2**53 - 1  # a position then has 32 digits: a DynamoDB number holds 38


API_EPOCH = "epoch"  # the epoch beside a seq, in the REST API's and the WebSocket's answers


def log_position(epoch: int, seq: int) -> int:
    """Where message ``seq`` of ``epoch`` is stored (the messages table's sort key)."""
    return epoch * EPOCH_STRIDE + seq


def epoch_of(position: int) -> int:
    return position // EPOCH_STRIDE


def seq_of(position: int) -> int:
    return position % EPOCH_STRIDE


def split_position(position: object) -> tuple[int | None, int | None]:
    """``(epoch, seq)`` of a stored position (a number, as read from a table); ``(None, None)``
    for none."""
    if position is None:
        return None, None
    position = int(position)  # type: ignore[call-overload]
    return epoch_of(position), seq_of(position)


CONNECTION_PREFIX = "CONN#"
SESSION_PREFIX = "SESSION#"


def connection_pk(connection_id: str) -> str:
    """The lease-table key of a connection: ``CONN#<id>``."""
    return f"{CONNECTION_PREFIX}{connection_id}"


def connection_id_of(pk: str) -> str:
    """The connection id inside a ``CONN#<id>`` key."""
    if not pk.startswith(CONNECTION_PREFIX):
        raise ValueError(f"pk: {pk!r} is not a connection key (expected {CONNECTION_PREFIX}<id>)")
    return pk[len(CONNECTION_PREFIX) :]


def session_pk(worker_id: str, session_version: int) -> str:
    """The lease-table key of one session of one worker process."""
    return f"{SESSION_PREFIX}{worker_id}#{session_version}"


# --- Connection item attributes ---

DESIRED_STATE = "desired_state"
WS_URL = "ws_url"
# The checkpoint (a log position): every message up to it is stored. ABSENT means "never
# checkpointed" (nothing stored yet, the next owner joins the stream live); 0 is a real
# checkpoint (replay from seq 1).
LAST_SEQ = "last_seq"
# The checkpoint the first owner recorded when it joined the stream live, before storing
# anything: the stored log of the stream is exactly ORIGIN_SEQ + 1 .. the newest seq. Set once.
ORIGIN_SEQ = "origin_seq"
# Sparse: present while the stored log may extend past the checkpoint with holes in it (an owner
# acquired the row and has not yet released it after a final flush). A STOP of an unowned row
# that carries it keeps the row claimable, so a worker seals the log (see worker/connection.py).
UNSEALED = "unsealed"
LEASE_OWNER = "lease_owner"  # worker id; absent when unowned
LEASE_SESSION = "lease_session"  # session_version of the owner's session at acquisition
LEASE_VERSION = "lease_version"  # fencing token, +1 on every acquisition
UPDATED_AT_MS = "updated_at_ms"
AWAITING_OWNER = "awaiting_owner"  # sparse: present iff STARTED and unowned
STOP_REQUESTED_FOR = "stop_requested_for"  # sparse: the owner asked to stop this connection
REFUSED_REASON = "refused_reason"  # why a worker refused to dial ws_url
# A stream whose owner failed with it (an error the redial loop does not retry, or a log it could
# not seal) is released with a hold-off kept in the row, so the whole fleet waits, not only the
# worker that failed: consecutive failures (reset by a checkpoint, i.e. by progress), the wall
# time (ms) before which nobody claims it, and what went wrong last.
DIAL_FAILURES = "dial_failures"
HELD_UNTIL_MS = "held_until_ms"
LAST_FAILURE = "last_failure"
HOLD_OFF_ATTRIBUTES = (DIAL_FAILURES, HELD_UNTIL_MS, LAST_FAILURE)
HOLD_OFF_BASE_MS = 1_000
HOLD_OFF_CAP_MS = 300_000
MAX_FAILURE_CHARS = 300


def hold_off_ms(failures: int, fraction: float) -> int:
    """How long to hold a stream off after its ``failures``-th consecutive failure: doubling from
    :data:`HOLD_OFF_BASE_MS` up to :data:`HOLD_OFF_CAP_MS`, scaled into [half, whole] by
    ``fraction`` in [0, 1] (jitter that never makes it zero, so streams failing together
    spread out)."""
    whole = min(HOLD_OFF_CAP_MS, HOLD_OFF_BASE_MS * 2 ** min(max(failures - 1, 0), 20))
    return int(whole * (0.5 + 0.5 * fraction))


class DesiredState(StrEnum):
    """What the outside world wants for a connection (written by the event router only)."""

    STARTED = "STARTED"
    STOPPED = "STOPPED"


# The values of AWAITING_OWNER: the index's partition keys. A START writes it once and the claim
# that follows once more, and one partition key takes about 1,000 writes a second (a throttled
# index throttles the table's writes too), so one constant value would cap START storms near
# 500 streams a second. A row's value is one of AWAITING_OWNER_SHARDS, picked by a hash of its
# key; readers query every one. 8 shards carry about 4,000 STARTs a second.
AWAITING_OWNER_SHARDS = 8
AWAITING_OWNER_VALUES = tuple(
    f"{DesiredState.STARTED.value}#{shard}" for shard in range(AWAITING_OWNER_SHARDS)
)


# What readers query: the shards, and the one value every row had before there were shards, so
# that a table written by an earlier version loses none of its unowned rows.
AWAITING_OWNER_READ_VALUES = (*AWAITING_OWNER_VALUES, DesiredState.STARTED.value)


def awaiting_owner_value(pk: str) -> str:
    """The AWAITING_OWNER value of the row ``pk``: the same for every write of that row."""
    return AWAITING_OWNER_VALUES[zlib.crc32(pk.encode()) % AWAITING_OWNER_SHARDS]


# --- Session item attributes ---

SESSION_OWNER = "session_owner"
SESSION_VERSION = "session_version"
SESSION_GROUP = "session_group"  # index key: every session of one fleet
SESSION_STATE = "session_state"
EXPIRES_AT_MS = "expires_at_ms"
SESSION_REGION = "region"
SESSION_CAPACITY = "capacity"
SESSION_LOAD = "load"
STARTED_AT_MS = "started_at_ms"
DRAIN_REQUESTED = "drain_requested"  # set by an operator; the holder sees it in its next renewal
# Set once reconcile has handled every connection of an ended session: it is never queried again.
# The item itself is deleted by the table's TTL (DELETE_AFTER), far beyond any index lag, never
# on the strength of an index query (which may lag behind the table).
# The ECS task that runs the session's worker (sparse: absent outside ECS). When ECS reports
# that task STOPPED, the task-events handler ends its sessions at once (a dead process renews
# nothing), instead of waiting a whole lease for them to expire.
SESSION_TASK_ARN = "task_arn"
SESSION_CLEARED = "cleared"
DELETE_AFTER = "delete_after"  # epoch seconds: the lease table's TTL attribute (ended sessions)
ENDED_SESSION_RETENTION_SECONDS = 24 * 60 * 60


class SessionState(StrEnum):
    """LIVE while its holder renews it; ENDED once closed by its holder or fenced by a taker."""

    LIVE = "LIVE"
    ENDED = "ENDED"


DEFAULT_SESSION_GROUP = "fleet"

# --- Messages table attributes ---

MESSAGE_DATA = "data"
MESSAGE_RECEIVED_AT_MS = "received_at_ms"
MESSAGE_WORKER = "worker_id"
MESSAGE_EXPIRES_AT = "expires_at"  # epoch seconds, the table's TTL attribute
# Present (MESSAGE_FORMAT_JSON) when ``data`` is the exact JSON text of a value that is not a
# string; absent when ``data`` is the string the upstream sent.
MESSAGE_FORMAT = "format"
# The seq of the message before it as its writer received it: the upstream sent nothing in
# between (a gap it left, or a frame refused), so a reader can tell a gap from a hole that a
# partly landed batch left. Absent on items stored before it was recorded.
MESSAGE_PREV_SEQ = "prev_seq"
# When that previous message expires (epoch seconds, its TTL), if its writer stored it: once it
# has, a hole before this message can never be filled (what was received earlier expired too).
MESSAGE_PREV_EXPIRES_AT = "prev_expires_at"
MESSAGE_FORMAT_JSON = "json"
DYNAMODB_MAX_ITEM_BYTES = 400 * 1024
# The largest upstream message a worker may be configured to take (MAX_MESSAGE_BYTES): a stored
# item adds its key, names and numbers, well under the rest of DynamoDB's 400 KB.
MAX_UPSTREAM_MESSAGE_BYTES = 384 * 1024
DEFAULT_MESSAGE_RETENTION_DAYS = 7

# --- Worker environment variables that the constructs set (the rest: worker/config.py) ---

# The fleet side's lease table and intake queue (the router, the workers, the task events).
ENV_TABLE_NAME = "TABLE_NAME"
ENV_QUEUE_URL = "QUEUE_URL"
ENV_ALLOWED_UPSTREAMS = "ALLOWED_UPSTREAMS"  # where STARTs may point the workers
ENV_MESSAGE_RETENTION_DAYS = "MESSAGE_RETENTION_DAYS"  # how long stored messages are kept
ENV_MEMORY_LIMIT_MIB = "MEMORY_LIMIT_MIB"  # the task's memory: buffering must fit in its share
# Set by ECS in every container of a task: where the task's metadata (its ARN) is served.
ENV_ECS_METADATA_URI = "ECS_CONTAINER_METADATA_URI_V4"


# --- Indexes ---


class Projection(StrEnum):
    """How much of an item an index copies."""

    KEYS_ONLY = "KEYS_ONLY"
    INCLUDE = "INCLUDE"
    ALL = "ALL"


@dataclass(frozen=True)
class IndexSpec:
    """A global secondary index: its name, string keys and projection."""

    name: str
    partition_key: str
    sort_key: str | None = None
    projection: Projection = Projection.KEYS_ONLY
    non_key_attributes: tuple[str, ...] = ()


# "Which STARTED connections have no owner?" (orphan discovery, part 1).
AWAITING_OWNER_INDEX = IndexSpec(name="awaiting-owner", partition_key=AWAITING_OWNER, sort_key=PK)

# "Which connections does worker W hold?" Used only for workers whose session has ended, so orphan
# discovery costs O(orphans). Projects the fencing fields a taker conditions on, and the desired
# state (STOPPED rows of a dead owner are cleared, not taken).
OWNER_INDEX = IndexSpec(
    name="by-owner",
    partition_key=LEASE_OWNER,
    sort_key=PK,
    projection=Projection.INCLUDE,
    non_key_attributes=(LEASE_SESSION, LEASE_VERSION, DESIRED_STATE),
)

# "Which of my connections were stopped?" One query per worker per interval.
STOP_REQUESTED_INDEX = IndexSpec(
    name="stop-requested", partition_key=STOP_REQUESTED_FOR, sort_key=PK
)

# "Which sessions exist?" Keys only, so a renewal (which changes expires_at_ms) never writes the
# index: a session renewal costs exactly one write.
SESSION_INDEX = IndexSpec(name="sessions", partition_key=SESSION_GROUP, sort_key=PK)

# "Which sessions did ECS task T run?" One query per STOPPED task event. Sparse (only sessions
# of workers on ECS) and written once per session, never by a renewal.
TASK_INDEX = IndexSpec(name="by-task", partition_key=SESSION_TASK_ARN, sort_key=PK)


@dataclass(frozen=True)
class TableSpec:
    """A table's key schema and indexes, read by the CDK constructs and by the local set-up."""

    default_name: str
    partition_key: str
    sort_key: str | None = None
    sort_key_type: str = "S"  # DynamoDB scalar type letter
    indexes: tuple[IndexSpec, ...] = ()
    ttl_attribute: str | None = None


LEASE_TABLE = TableSpec(
    default_name=DEFAULT_LEASE_TABLE_NAME,
    partition_key=PK,
    indexes=(AWAITING_OWNER_INDEX, OWNER_INDEX, STOP_REQUESTED_INDEX, SESSION_INDEX, TASK_INDEX),
    ttl_attribute=DELETE_AFTER,
)
# The lease table's indexes the workers query (by-task is the task-events handler's alone).
WORKER_INDEXES = (AWAITING_OWNER_INDEX, OWNER_INDEX, STOP_REQUESTED_INDEX, SESSION_INDEX)

MESSAGES_TABLE = TableSpec(
    default_name=DEFAULT_MESSAGES_TABLE_NAME,
    partition_key=PK,
    sort_key=SEQ,
    sort_key_type="N",
    ttl_attribute=MESSAGE_EXPIRES_AT,
)

# --- SQS notification ---

NOTIFICATION_PK = "pk"


NOTIFICATION_ORPHAN = "orphan"  # the row belongs to a session that ended: claim it fairly


def notification_body(pk: str, *, orphan: bool = False) -> str:
    """The SQS body that tells the fleet a connection is claimable: ``{"pk": "CONN#<id>"}``,
    with ``"orphan": true`` when its owner's session was ended by someone else (a dead task):
    such notifications come by the dozen at once and are claimed up to each worker's fair share."""
    body: dict[str, object] = {NOTIFICATION_PK: pk}
    if orphan:
        body[NOTIFICATION_ORPHAN] = True
    return json.dumps(body, separators=(",", ":"))


def is_orphan_notification(body: str) -> bool:
    """Whether a (valid) notification body announces an orphan (see :func:`notification_body`)."""
    try:
        return json.loads(body).get(NOTIFICATION_ORPHAN) is True
    except (ValueError, AttributeError):
        return False


def parse_notification(body: str) -> str:
    """The ``pk`` of a notification body; ``ValueError`` naming the problem otherwise."""
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as exc:
        raise ValueError(f"body: not JSON ({exc.msg})") from None
    if not isinstance(payload, dict):
        raise ValueError("body: not a JSON object")
    pk = payload.get(NOTIFICATION_PK)
    if not isinstance(pk, str) or not pk.startswith(CONNECTION_PREFIX):
        raise ValueError(f"{NOTIFICATION_PK}: expected a {CONNECTION_PREFIX}<id> string")
    return pk


# --- Metrics (Embedded Metric Format; the scaling policy tracks ACTIVE_CONNECTIONS) ---

METRIC_NAMESPACE = "StreamFleet"
METRIC_DIMENSION_SERVICE = "ServiceName"
# The value of that dimension in what a worker or a fan-out function publishes: two deployments
# in one account and Region keep their metrics (and the alarms on them) apart by it.
ENV_SERVICE_NAME = "SERVICE_NAME"
# The worker's service dimension when SERVICE_NAME is unset, and the one the app's fleets keep
# (a library user's fleet derives its own, unique in the app).
DEFAULT_WORKER_SERVICE_NAME = "streamfleet-worker"
METRIC_ACTIVE_CONNECTIONS = "ActiveConnections"
METRIC_LEASES_LOST = "LeasesLost"
METRIC_HANDOFFS = "Handoffs"
METRIC_FRAMES_REFUSED = "FramesRefused"  # upstream frames judged unreadable or unstorable
METRIC_UPSTREAM_GAPS = "UpstreamGaps"  # a seq past the next one (some skipped)
# A seq received again with the same content (dropped as a duplicate).
METRIC_UPSTREAM_SEQ_BACKWARDS = "UpstreamSeqBackwards"
# The upstream's numbering restarted (a seq received again with other content): a new epoch.
METRIC_LOG_EPOCHS = "LogEpochsBegun"
METRIC_UPSTREAM_DROPS = "UpstreamDrops"  # upstream connections that ended (then redialled)
METRIC_STREAMS_HELD_OFF = "StreamsHeldOff"  # streams released with a hold-off after a failure


# --- ECS task events (runtime/streamfleet/task_events.py, streamfleet_cdk/task_events.py) ---
#
# When ECS reports a worker's task STOPPED, every process of it has exited and can renew
# nothing: the task-events Lambda ends the task's sessions at once (found through TASK_INDEX)
# and notifies the fleet of their connections, instead of leaving them dark for a whole lease.

ECS_EVENT_SOURCE = "aws.ecs"
ECS_TASK_STATE_CHANGE = "ECS Task State Change"
ECS_TASK_STOPPED = "STOPPED"  # lastStatus once every container of the task has exited
ECS_SERVICE_GROUP_PREFIX = "service:"  # a service's tasks have group "service:<service name>"
# Environment of the task-events Lambda (besides TABLE_NAME, QUEUE_URL and AWS_REGION).
ENV_ECS_CLUSTER_ARN = "ECS_CLUSTER_ARN"
ENV_ECS_SERVICE_NAME = "ECS_SERVICE_NAME"
# Who ended a session, when it was not its holder (sparse; for operators and tests).
SESSION_ENDED_BY = "ended_by"
ENDED_BY_TASK_STOPPED = "ecs-task-stopped"


def ecs_service_group(service_name: str) -> str:
    """The ``group`` ECS gives the tasks of service ``service_name``: ``service:<name>``."""
    return f"{ECS_SERVICE_GROUP_PREFIX}{service_name}"


# --- Client-facing WebSocket API (runtime/streamfleet/wsapi, runtime/streamfleet/client) ---
#
# Two tables per region, on purpose:
#
# * the **state table** (a global table, replicated to the other region) holds what must survive
#   a failover, keyed by the *verified user id* (the token's ``sub``), never by a connection id,
#   which changes on every reconnect: ``SUBS#<sub>`` (the user's subscriptions), and the items
#   of the routes a deployment adds (the demo auction's, examples/auction);
# * the **connections table** (regional, *not* replicated: a connection id means nothing to the
#   other region's API Gateway) holds ``WSCONN#<connection id>`` -> user, with a TTL, and the
#   canary's hysteresis item ``CANARY#<api id>``.
#
# Every state-table write sets UPDATED_AT_MS strictly above the item's previous value (the
# handlers retry with ``previous + 1`` when their clock is behind), so within one region the
# timestamp orders an item's versions exactly as DynamoDB applied them; the local replicator
# resolves cross-region conflicts last-writer-wins on (UPDATED_AT_MS, WRITER_REGION), as global
# tables do on their own timestamps.

DEFAULT_WSAPI_STATE_TABLE_NAME = "streamfleet-wsapi-state"
DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME = "streamfleet-wsapi-connections"

# Environment variables read by the WebSocket API's Lambdas.
ENV_STATE_TABLE_NAME = "STATE_TABLE_NAME"
ENV_CONNECTIONS_TABLE_NAME = "CONNECTIONS_TABLE_NAME"
ENV_APIGW_MANAGEMENT_ENDPOINT = "APIGW_MANAGEMENT_ENDPOINT"  # optional override (local stand-in)

WS_CONNECTION_PREFIX = "WSCONN#"
CANARY_PREFIX = "CANARY#"


def ws_connection_pk(connection_id: str) -> str:
    """The connections-table key of an API Gateway connection: ``WSCONN#<connection id>``."""
    return f"{WS_CONNECTION_PREFIX}{connection_id}"


def canary_pk(api_id: str) -> str:
    """The connections-table key of the canary's hysteresis state for one API."""
    return f"{CANARY_PREFIX}{api_id}"


# Connection item (connections table).
WS_USER_ID = "user_id"
WS_CONNECTED_AT_MS = "connected_at_ms"
WS_REGION = "region"
WS_EXPIRES_AT = "expires_at"  # epoch seconds: the connections table's TTL attribute

# State items (state table). UPDATED_AT_MS (above) is their last-writer-wins timestamp.
WRITER_REGION = "writer_region"

# Canary hysteresis item (connections table).
CANARY_REPORTED_HEALTHY = "reported_healthy"
CANARY_TRIPPED = "tripped"  # failed long enough to fail over: fail-back needs a healthy streak
CANARY_FAILURE_STREAK = "failure_streak"
CANARY_HEALTHY_STREAK = "healthy_streak"
CANARY_STATE_VERSION = "state_version"
CANARY_LAST_TICK_MS = "last_tick_ms"  # the schedule tick of the last run (epoch ms)

WSAPI_STATE_TABLE = TableSpec(default_name=DEFAULT_WSAPI_STATE_TABLE_NAME, partition_key=PK)
WSAPI_CONNECTIONS_TABLE = TableSpec(
    default_name=DEFAULT_WSAPI_CONNECTIONS_TABLE_NAME, partition_key=PK, ttl_attribute=WS_EXPIRES_AT
)

# Wire protocol, shared by the handlers, the authorizer, the local gateway and the client.
WS_ROUTE_SELECTION_FIELD = "action"  # route selection expression $request.body.action
WS_ROUTE_HEARTBEAT = "heartbeat"
WS_ROUTE_GET_STATE = "getState"
WS_ROUTE_SUBSCRIBE = "subscribe"  # live delivery of ingested streams (below)
WS_ROUTE_UNSUBSCRIBE = "unsubscribe"
# The core's routes; a deployment may add its own (streamfleet.wsapi.handlers.extensions).
WS_ROUTES = (
    WS_ROUTE_HEARTBEAT,
    WS_ROUTE_GET_STATE,
    WS_ROUTE_SUBSCRIBE,
    WS_ROUTE_UNSUBSCRIBE,
)
WS_APP_SUBPROTOCOL = "streamfleet.v1"  # the subprotocol $connect selects (never the token)
WS_BEARER_SUBPROTOCOL_PREFIX = "bearer."  # Sec-WebSocket-Protocol entry carrying the JWT
WS_TOKEN_QUERY_PARAMETER = "token"  # ...or ?token=<jwt> in the query string
WS_REPLY_STATE = "state"
WS_REPLY_ERROR = "error"
WS_REPLY_SUBSCRIBED = "subscribed"
WS_REPLY_UNSUBSCRIBED = "unsubscribed"
WS_REPLY_MESSAGES = "messages"  # one or more messages of one stream, each with its seq
# API Gateway's WebSocket limits (docs/protocol.md).
WS_MAX_FRAME_BYTES = 32 * 1024
WS_MAX_MESSAGE_BYTES = 128 * 1024
WS_MAX_CONNECTION_SECONDS = 2 * 60 * 60
WS_IDLE_TIMEOUT_SECONDS = 10 * 60
# API Gateway stops waiting for a WebSocket route's integration after this long.
WS_INTEGRATION_TIMEOUT_SECONDS = 29
# The WebSocket route handler's Lambda timeout unless a deployment sets another, and the
# $connect authorizer's.
WS_HANDLER_TIMEOUT_SECONDS = 10
WS_AUTHORIZER_TIMEOUT_SECONDS = 10

# Canary metric: 1 healthy, 0 unhealthy, after the fail-back hysteresis. A CloudWatch alarm on it
# (2 of 2 datapoints, missing data breaching) drives the Route 53 health check.
HEALTH_METRIC_NAMESPACE = "App"
HEALTH_METRIC_NAME = "WebSocketHealth"
HEALTH_METRIC_DIMENSION_API_ID = "ApiId"
PROBE_METRIC_NAME = "WebSocketProbeSuccess"  # the raw probe result, before hysteresis

# The heartbeat's reply: a TEXT frame of exactly these 4 bytes, not JSON, so that third-party
# clients can match it literally (react-use-websocket's ``heartbeat.returnMessage: 'pong'``).
WS_PONG_FRAME = "pong"
MAX_WS_REQUEST_ID_CHARS = 64

# The context the authorizer returns; API Gateway passes it to $connect and to every later route
# of the connection (requestContext.authorizer).
WS_CONTEXT_SUB = "sub"
WS_CONTEXT_TOKEN_TRANSPORT = "tokenTransport"
WS_CONTEXT_PRINCIPAL_KIND = "principalKind"
WS_PRINCIPAL_USER = "user"
# The reader tags the authorizer derives from JWT_READER_CLAIMS (a JSON array in a string:
# API Gateway passes only strings, numbers and booleans in the context).
WS_CONTEXT_READER_TAGS = "readerTags"
# When the connection's token expires (epoch seconds): its authorization ends then.
WS_CONTEXT_TOKEN_EXPIRES_AT = "tokenExpiresAt"
# The canary's identity: a token signed by one of JWT_CANARY_KEYS (never by the identity
# provider's keys) with ``iss`` = CANARY_TOKEN_ISSUER. The authorizer prefixes its principal with
# CANARY_PRINCIPAL_PREFIX and the handlers allow it on the heartbeat route only.
WS_PRINCIPAL_CANARY = "canary"
CANARY_TOKEN_ISSUER = "urn:streamfleet:canary"
CANARY_PRINCIPAL_PREFIX = "canary:"
CANARY_MAX_TOKEN_LIFETIME_SECONDS = 15 * 60

# Environment of the $connect authorizer (runtime/streamfleet/wsapi/authorizer.py).
ENV_JWT_ISSUER = "JWT_ISSUER"
ENV_JWT_AUDIENCE = "JWT_AUDIENCE"
ENV_JWT_KEYS = "JWT_KEYS"
ENV_JWT_JWKS_URL = "JWT_JWKS_URL"
ENV_JWT_LEEWAY_SECONDS = "JWT_LEEWAY_SECONDS"
ENV_JWT_JWKS_CACHE_SECONDS = "JWT_JWKS_CACHE_SECONDS"
ENV_JWT_JWKS_MIN_REFRESH_SECONDS = "JWT_JWKS_MIN_REFRESH_SECONDS"
ENV_JWT_JWKS_STALE_SECONDS = "JWT_JWKS_STALE_SECONDS"
ENV_JWT_JWKS_TIMEOUT_SECONDS = "JWT_JWKS_TIMEOUT_SECONDS"
ENV_JWT_ALGORITHMS = "JWT_ALGORITHMS"
ENV_JWT_MAX_LIFETIME_SECONDS = "JWT_MAX_LIFETIME_SECONDS"
ENV_JWT_TOKEN_USE = "JWT_TOKEN_USE"
ENV_JWT_TYP = "JWT_TYP"
ENV_JWT_AUTHORIZED_PARTIES = "JWT_AUTHORIZED_PARTIES"
ENV_JWT_CANARY_KEYS = "JWT_CANARY_KEYS"  # the canary's public key(s); unset: no canary identity
# Claims whose values become reader tags ("<claim>:<value>") a START's readers may name.
ENV_JWT_READER_CLAIMS = "JWT_READER_CLAIMS"
# A REQUEST authorizer can refuse a connection with HTTP 401 only by raising, which Lambda counts
# as an error: every connect without a token (a scanner, a canary without its key) would trip
# the authorizer's errors alarm. The authorizer counts those connects in an EMF metric of its
# own, and the alarm subtracts the count.
METRIC_AUTHORIZER_MISSING_TOKEN = "AuthorizerMissingToken"  # namespace METRIC_NAMESPACE
# The dimension of that count: the authorizer's function name, under the name Lambda gives the
# same dimension of its own metrics (only the EMF line and the alarm have to agree on it).
METRIC_DIMENSION_FUNCTION = "FunctionName"
AUTHORIZER_ENV = (
    ENV_JWT_ISSUER,
    ENV_JWT_AUDIENCE,
    ENV_JWT_KEYS,
    ENV_JWT_JWKS_URL,
    ENV_JWT_LEEWAY_SECONDS,
    ENV_JWT_JWKS_CACHE_SECONDS,
    ENV_JWT_JWKS_MIN_REFRESH_SECONDS,
    ENV_JWT_JWKS_STALE_SECONDS,
    ENV_JWT_JWKS_TIMEOUT_SECONDS,
    ENV_JWT_ALGORITHMS,
    ENV_JWT_MAX_LIFETIME_SECONDS,
    ENV_JWT_TOKEN_USE,
    ENV_JWT_TYP,
    ENV_JWT_AUTHORIZED_PARTIES,
    ENV_JWT_CANARY_KEYS,
    ENV_JWT_READER_CLAIMS,
)

# Environment of the handlers (the package runtime/streamfleet/wsapi/handlers), besides AWS_REGION.
ENV_CONNECTION_TTL_SECONDS = "CONNECTION_TTL_SECONDS"
# Live delivery (optional: without them subscribe answers "not_supported").
ENV_STREAMS_TABLE_NAME = "STREAMS_TABLE_NAME"  # the fleet's lease table: readers, origin_seq
ENV_MESSAGES_TABLE_NAME = "MESSAGES_TABLE_NAME"  # the fleet's messages table (this Region's)
ENV_SUBSCRIPTIONS_TABLE_NAME = "SUBSCRIPTIONS_TABLE_NAME"  # this Region's subscribers
ENV_SUBSCRIBE_NEWEST_MESSAGES = "SUBSCRIBE_NEWEST_MESSAGES"  # replay for after=null
ENV_REPLAY_MAX_MESSAGES = "REPLAY_MAX_MESSAGES"  # replayed per subscribe, at most
# Subscribers of one stream in one Region, and connections of one user to one stream, at most:
# every message costs a post per subscriber, and the fan-out's batch waits for all of them.
ENV_MAX_SUBSCRIBERS_PER_STREAM = "MAX_SUBSCRIBERS_PER_STREAM"
ENV_MAX_USER_CONNECTIONS_PER_STREAM = "MAX_USER_CONNECTIONS_PER_STREAM"
DEFAULT_MAX_SUBSCRIBERS_PER_STREAM = 1000
DEFAULT_MAX_USER_CONNECTIONS_PER_STREAM = 5
HANDLERS_ENV = (
    ENV_STATE_TABLE_NAME,
    ENV_CONNECTIONS_TABLE_NAME,
    ENV_APIGW_MANAGEMENT_ENDPOINT,
    ENV_CONNECTION_TTL_SECONDS,
    ENV_STREAMS_TABLE_NAME,
    ENV_MESSAGES_TABLE_NAME,
    ENV_SUBSCRIPTIONS_TABLE_NAME,
    ENV_SUBSCRIBE_NEWEST_MESSAGES,
    ENV_REPLAY_MAX_MESSAGES,
    ENV_MAX_SUBSCRIBERS_PER_STREAM,
    ENV_MAX_USER_CONNECTIONS_PER_STREAM,
)

# Environment of the canary (the package runtime/streamfleet/wsapi/canary).
ENV_CANARY_ENDPOINT_URL = "CANARY_ENDPOINT_URL"
ENV_CANARY_API_ID = "CANARY_API_ID"
ENV_CANARY_TIMEOUT_SECONDS = "CANARY_TIMEOUT_SECONDS"
ENV_CANARY_HEALTHY_RUNS_TO_RECOVER = "CANARY_HEALTHY_RUNS_TO_RECOVER"
ENV_CANARY_FAILURES_TO_TRIP = "CANARY_FAILURES_TO_TRIP"
ENV_CANARY_STATE_TABLE_NAME = "CANARY_STATE_TABLE_NAME"  # the regional connections table
ENV_CANARY_TOKEN_TRANSPORT = "CANARY_TOKEN_TRANSPORT"
ENV_CANARY_TOKEN = "CANARY_TOKEN"
ENV_CANARY_SIGNING_KEY = "CANARY_SIGNING_KEY"
ENV_CANARY_SIGNING_KEY_SECRET_ARN = "CANARY_SIGNING_KEY_SECRET_ARN"
ENV_CANARY_SUBJECT = "CANARY_SUBJECT"
# While the region reports unhealthy, close every client connection of it (default true).
ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY = "CANARY_DISCONNECT_WHEN_UNHEALTHY"
# Management API endpoint for those closes; default: the https form of CANARY_ENDPOINT_URL.
ENV_CANARY_MANAGEMENT_ENDPOINT = "CANARY_MANAGEMENT_ENDPOINT"
# The alarm the canary's metric feeds: read each run, so that fail-back waits for a healthy
# streak after any ALARM, missing data included (not only after the canary's own failures).
ENV_CANARY_ALARM_NAME = "CANARY_ALARM_NAME"
# Where the canary opens its TCP (and TLS) connection when CANARY_ENDPOINT_URL names the custom
# domain: this Region's regional domain name, so the probe goes through the domain's
# certificate and mapping, as users do, yet judges this Region whatever DNS answers.
ENV_CANARY_CONNECT_HOST = "CANARY_CONNECT_HOST"
CANARY_ENV = (
    ENV_CANARY_ENDPOINT_URL,
    ENV_CANARY_API_ID,
    ENV_CANARY_TIMEOUT_SECONDS,
    ENV_CANARY_HEALTHY_RUNS_TO_RECOVER,
    ENV_CANARY_FAILURES_TO_TRIP,
    ENV_CANARY_STATE_TABLE_NAME,
    ENV_CANARY_TOKEN_TRANSPORT,
    ENV_CANARY_TOKEN,
    ENV_CANARY_SIGNING_KEY,
    ENV_CANARY_SIGNING_KEY_SECRET_ARN,
    ENV_CANARY_SUBJECT,
    ENV_CANARY_DISCONNECT_WHEN_UNHEALTHY,
    ENV_CANARY_MANAGEMENT_ENDPOINT,
    ENV_CANARY_ALARM_NAME,
    ENV_CANARY_CONNECT_HOST,
    ENV_JWT_AUDIENCE,
    ENV_JWT_CANARY_KEYS,
)


# --- Live delivery of ingested streams to subscribed clients ---
#
# A client subscribes to a stream (an upstream connection id of the fleet) and gets its stored
# messages first (a replay from the messages table, by the subscribe handler) and then every new
# one (live, by the fan-out function, fed by the messages table's change stream in its own
# Region, replicated writes included). Three kinds of records:
#
# * the stream's **readers**, on its connection item in the lease table: a string set of
#   ``user:<sub>`` and ``<claim>:<value>`` entries, written by START; absent or empty means nobody
#   may read it (default deny);
# * the Region's **subscriptions table**: ``STREAM#<stream id>`` / ``<API Gateway connection
#   id>``, one item per subscribed connection, with a TTL; the fan-out reads a stream's
#   subscribers with a *consistent* query on the base table (an index could lag and miss a
#   subscriber whose replay has already ended); and ``WSCONN#<connection id>`` / ``<connection
#   id>``, which lists the connection's streams (WS_STREAMS), so ``$disconnect`` removes them;
# * the user's **subscriptions** in the global state table, ``SUBS#<sub>`` (a string set), so a
#   client that reconnects or reloads, in either Region, is told what it was subscribed to.

READERS = "readers"  # on the lease table's connection item: who may subscribe to the stream
READER_USER_PREFIX = "user:"  # a reader entry naming a verified ``sub``
MAX_READERS = 100
MAX_READER_CHARS = 300

DEFAULT_WSAPI_SUBSCRIPTIONS_TABLE_NAME = "streamfleet-wsapi-subscriptions"
STREAM_SUBSCRIBERS_PREFIX = "STREAM#"
USER_SUBSCRIPTIONS_PREFIX = "SUBS#"
SUB_CONNECTION = "connection_id"  # sort key of the subscriptions table
SUB_USER_ID = "user_id"
SUB_SUBSCRIBED_AT_MS = "subscribed_at_ms"
SUB_EXPIRES_AT = "expires_at"  # epoch seconds: the subscriptions table's TTL attribute
# What the fan-out checks at every delivery: the connection's reader tags (as the authorizer
# context carries them) and when its token expires (epoch seconds).
SUB_READER_TAGS = "reader_tags"
SUB_TOKEN_EXPIRES_AT = "token_expires_at"
WS_STREAMS = "streams"  # string set: a connection's streams, and a user's (SUBS#<sub>)
MAX_SUBSCRIPTIONS_PER_CONNECTION = 50


def stream_subscribers_pk(stream_id: str) -> str:
    """The subscriptions-table key of one stream's subscribers: ``STREAM#<stream id>``."""
    return f"{STREAM_SUBSCRIBERS_PREFIX}{stream_id}"


def connection_streams_key(connection_id: str) -> dict[str, str]:
    """The subscriptions-table key of the item listing one connection's streams."""
    return {PK: ws_connection_pk(connection_id), SUB_CONNECTION: connection_id}


def user_subscriptions_pk(user_id: str) -> str:
    """The state-table key of a user's subscriptions: ``SUBS#<sub>``."""
    return f"{USER_SUBSCRIPTIONS_PREFIX}{user_id}"


WSAPI_SUBSCRIPTIONS_TABLE = TableSpec(
    default_name=DEFAULT_WSAPI_SUBSCRIPTIONS_TABLE_NAME,
    partition_key=PK,
    sort_key=SUB_CONNECTION,
    sort_key_type="S",
    ttl_attribute=SUB_EXPIRES_AT,
)

# Environment of the fan-out function (runtime/streamfleet/wsapi/fanout.py), besides AWS_REGION:
# the subscriptions table and the Management API endpoint of this Region's stage.
ENV_FANOUT_POST_THREADS = "FANOUT_POST_THREADS"
ENV_FANOUT_SUBSCRIBER_BUDGET_MS = "FANOUT_SUBSCRIBER_BUDGET_MS"
FANOUT_ENV = (
    ENV_SUBSCRIPTIONS_TABLE_NAME,
    ENV_STREAMS_TABLE_NAME,
    ENV_APIGW_MANAGEMENT_ENDPOINT,
    ENV_FANOUT_POST_THREADS,
    ENV_FANOUT_SUBSCRIBER_BUDGET_MS,
    ENV_SERVICE_NAME,
)

# Fan-out metrics (Embedded Metric Format, namespace METRIC_NAMESPACE, dimension
# METRIC_DIMENSION_SERVICE = SERVICE_NAME, FANOUT_SERVICE_NAME when unset).
FANOUT_SERVICE_NAME = "streamfleet-fanout"
METRIC_FANOUT_DELIVERED = "FanoutDelivered"  # messages x subscribers posted
METRIC_FANOUT_POSTS = "FanoutPosts"  # Management API posts (each one frame, many messages)
METRIC_FANOUT_GONE = "FanoutGone"  # subscribers found gone (GoneException) and removed
METRIC_FANOUT_FAILED_POSTS = "FanoutFailedPosts"  # posts that failed for another reason
METRIC_FANOUT_DISCONNECTED = "FanoutDisconnected"  # subscribers closed to resume from the log
# Subscribers whose frames could not all be posted within their budget, or before the invocation
# stopped posting: closed (counted in FanoutDisconnected too when the close succeeded).
METRIC_FANOUT_OVER_BUDGET = "FanoutOverBudget"
# Subscribers closed because they may no longer read (readers changed, token expired).
METRIC_FANOUT_REVOKED = "FanoutRevoked"
METRIC_FANOUT_LAG_MS = "FanoutLagMs"  # worker receipt -> post, the batch's oldest message
