"""The canary: probes one region's WebSocket API and publishes ``App/WebSocketHealth``.

Every run (EventBridge, once a minute) it opens a WebSocket to the *regional* endpoint (not the
failover name: it must judge this region, whatever DNS says): with a custom domain, the
domain's URL connected to this Region's regional domain name (``CANARY_CONNECT_HOST``), so the
domain's certificate and mapping are probed too, as users meet them. It authenticates with its own
identity, sends ``{"action": "heartbeat"}`` and expects the TEXT frame ``pong`` within
``CANARY_TIMEOUT_SECONDS``. Anything else (refused handshake, HTTP 500 because the handler is
throttled, API Gateway's ``Internal server error`` frame, silence) is a failed probe.

**Fail-back hysteresis.** Route 53 only understands the alarm's plain "2 of 2 datapoints"
(no M-of-N, no metric math), so the asymmetry that stops flapping (fail over after 2 bad
minutes, fail back only after more than 5 good ones) lives here. Once ``CANARY_FAILURES_TO_TRIP``
(default 2: the alarm's datapoints) consecutive probes failed, i.e. once the alarm fires, the
canary is *tripped* and keeps reporting 0 until ``CANARY_HEALTHY_RUNS_TO_RECOVER`` (default 5)
*consecutive* probes succeeded. A region that flaps while recovering therefore does not pull
traffic back and forth. A single failed probe does not trip it: it reports one 0, which the
2-of-2 alarm ignores, exactly as without hysteresis (tripping on one blip would turn every blip
into a failover). The canary also reads its alarm's state each run (``CANARY_ALARM_NAME``,
``DescribeAlarms``): an ALARM it did not cause (missing data: the canary did not run, or could
not publish, for two minutes) trips it too, so fail-back waits for the same healthy streak after
any ALARM. Only an ALARM that began after the canary's previous run counts: the one its own
reports keep up, and the minute CloudWatch takes to end it once the canary recovered, must not
trip it again. An alarm it cannot read changes nothing. The small state is kept in a DynamoDB item
(``CANARY#<api id>`` in ``CANARY_STATE_TABLE_NAME``, the regional connections table) written with
an optimistic version check; without a table every run starts from "healthy" (no hysteresis).
If the item cannot be read or written, the raw probe result is reported: a broken state store
alone must not take the region out of service.

**Metric.** ``PutMetricData`` (one call per run: cheap at one run a minute, and visible to the
alarm at once, unlike EMF's log-ingestion delay): namespace ``App``, dimension ``ApiId``,
``WebSocketHealth`` (after hysteresis; the alarm's metric) and ``WebSocketProbeSuccess`` (the
raw probe, for dashboards). The alarm must treat missing data as breaching, so a canary that
stops running also fails the region over.

**Server-driven failover.** A third-party client that counts any frame as "alive" stays on a
throttled region for ever: API Gateway answers each of its heartbeats with an ``Internal server
error`` frame. So while the region reports unhealthy (from the run that trips the hysteresis,
i.e. when the alarm fires and the failover name moves, until fail-back), every run closes every
client connection of this region through the Management API (``DeleteConnection`` on the ids in
the connections table; ``GoneException`` means already gone) and deletes their records (the
``$disconnect`` handler may be throttled too). Clients reconnect through the failover name and
land in the other region; one that lands here again (DNS caches) is closed again next run.
``CANARY_DISCONNECT_WHEN_UNHEALTHY=false`` turns it off. The Management API endpoint is the
https form of ``CANARY_ENDPOINT_URL`` unless ``CANARY_MANAGEMENT_ENDPOINT`` says otherwise.

**Token: the canary's own identity.** The canary's token is signed with its own key and carries
``iss`` = :data:`~streamfleet.model.CANARY_TOKEN_ISSUER`, ``aud`` = ``JWT_AUDIENCE``; the
authorizer verifies it only with ``JWT_CANARY_KEYS`` (the canary's public key, which is *not*
in the identity provider's JWKS) and the handlers let it send ``heartbeat`` only: its key cannot
mint a token for any user. Configure one of ``CANARY_TOKEN`` (a static token: local use),
``CANARY_SIGNING_KEY`` (a PEM private key or an ``oct`` JWK; a 5-minute token is minted per run
for ``CANARY_SUBJECT``, default ``canary``) or ``CANARY_SIGNING_KEY_SECRET_ARN`` (the same, read
from Secrets Manager: again every 5 minutes, and at once when a token is refused, which also
tries the key before it, so a rotation done in either order moves nothing).
``JWT_CANARY_KEYS`` (the keys the authorizer accepts for the canary, optional): a refusal of
keys all outside them is the canary's own fault, not a failed probe. ``CANARY_TOKEN_TRANSPORT`` is
``subprotocol`` (default) or ``query``.

Other environment: ``CANARY_ENDPOINT_URL`` (``wss://<api id>.execute-api.<region>.amazonaws.com/
<stage>``), ``CANARY_API_ID``; every name is in :data:`streamfleet.model.CANARY_ENV`. Runs are
logged as structured records (:mod:`streamfleet.logs`): INFO for a healthy run, WARNING
otherwise.

The package, one concern a module: :mod:`.config` (the environment), :mod:`.probe` (the
heartbeat and its pong), :mod:`.tokens` (the canary's identity), :mod:`.health` (fail-back
hysteresis and its state), :mod:`.metrics` (the metric and the alarm's state), :mod:`.sweeper`
(the closing of client connections), :mod:`.run` (one run of all of them); here, the Lambda
entry point that wires them to AWS.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
from collections.abc import Mapping
from typing import Any

from ... import model
from ...aws import AsyncClient
from ...env import EnvironmentCache
from ...logs import configured
from .config import CLIENT_SETTINGS, CanaryConfig
from .health import DynamoHealthStateStore
from .metrics import CloudWatchAlarmState, CloudWatchPublisher
from .run import Canary
from .sweeper import MANAGEMENT_CLIENT_SETTINGS, ConnectionSweeper
from .tokens import token_source_from_env

logger = logging.getLogger(__name__)


def canary_from_env(env: Mapping[str, str] | None = None) -> Canary:
    """A canary wired to DynamoDB (if a state table is set) and CloudWatch."""
    env = os.environ if env is None else env
    config = CanaryConfig.from_env(env)
    store = None
    disconnector = None
    if config.state_table:
        dynamodb = AsyncClient("dynamodb", CLIENT_SETTINGS)
        store = DynamoHealthStateStore(
            dynamodb, table_name=config.state_table, api_id=config.api_id
        )
        if config.disconnect_when_unhealthy:
            disconnector = ConnectionSweeper(
                dynamodb=dynamodb,
                management=AsyncClient(
                    "apigatewaymanagementapi",
                    MANAGEMENT_CLIENT_SETTINGS,
                    endpoint_url=config.management_url(),
                ),
                table_name=config.state_table,
                budget_seconds=config.disconnect_budget_seconds,
            )
    cloudwatch = AsyncClient("cloudwatch", CLIENT_SETTINGS)
    return Canary(
        config,
        tokens=token_source_from_env(env),
        store=store,
        publishers=[CloudWatchPublisher(cloudwatch)],
        disconnector=disconnector,
        alarm=None
        if config.alarm_name is None
        else CloudWatchAlarmState(cloudwatch, config.alarm_name),
    )


def schedule_tick_ms(event: Mapping[str, Any]) -> int | None:
    """The schedule tick an EventBridge event names (``time``, ISO 8601 UTC), in epoch ms;
    ``None`` for an event without one (a manual invocation)."""
    raw = event.get("time") if isinstance(event, Mapping) else None
    if not isinstance(raw, str):
        return None
    try:
        tick = datetime.datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        return None
    if tick.tzinfo is None:
        return None
    return int(tick.timestamp() * 1000)


_CANARY = EnvironmentCache(model.CANARY_ENV, canary_from_env)


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """Lambda entry point (``streamfleet.wsapi.canary.handler``), one probe per invocation."""
    run = asyncio.run(configured(_CANARY, logger, context).run_once(schedule_tick_ms(event)))
    return {
        "healthy": run.probe.healthy,
        "value": run.value,
        "healthyStreak": run.state.healthy_streak,
        "tripped": run.state.tripped,
        "latencyMs": round(run.probe.latency_seconds * 1000, 1),
        "error": run.probe.error,
        "closedConnections": None if run.sweep is None else run.sweep.closed,
    }
