"""The task-events Lambda: end the sessions of a worker task that ECS reports STOPPED.

A worker that dies (OOM kill, crash, container exit, host retirement) is otherwise noticed only
when its session expires: a whole lease during which its streams are dark. But ECS *knows*: it
sends an ``ECS Task State Change`` event with ``lastStatus: STOPPED`` once every container of
the task has exited. A process that has exited can renew nothing, so its session can be ended
at once, with the write a taker makes when it fences an expired session (ending it is safe for
the same reason: any request of the dead process still in flight fails its condition after it).

For one such event (EventBridge rule: ``streamfleet_cdk.task_events``) the handler

1. checks that the event is this fleet's: ``source`` ``aws.ecs``, a task state change,
   ``lastStatus`` ``STOPPED`` (never ``DEACTIVATING`` or ``STOPPING``: a task that got SIGTERM
   is still handing its connections over), ``detail.clusterArn`` and ``detail.group``
   (``service:<name>``) equal to its configuration, the event's Region its own. Anything else is
   logged and ignored;
2. finds the task's sessions with one query of the ``by-task`` index (never a scan);
3. ends each one that is LIVE, belongs to that task *and* was opened in this Region (one
   conditional write, the same ``SET session_state = ENDED`` as a taker's fence). The Region
   condition matters with global tables: the standby Region's handler must never end a session
   of the primary's workers, whatever its replica shows;
4. for each session it ended, finds the STARTED connections the session held (one ``by-owner``
   query, as orphan discovery asks) and publishes an SQS notification for each, so live peers
   claim them at once through intake, each up to its fair share (the notifications say
   ``orphan``: a worker hands back what is beyond its share, visible to peers a second later).
   A moment later (1.5 s, then 2 s more) it asks again and announces once more the rows still
   held: a notification the dead worker's own pending long poll swallowed would otherwise wait
   out the queue's visibility timeout. Reconcile picks up whatever is left.

It is idempotent: the same event again, or an event for a session a peer already fenced after
its lease expired, finds nothing LIVE, changes nothing and says so. A failure to reach
DynamoDB or SQS fails the invocation (EventBridge and Lambda retry it; the session expires on
its own in any case). Configuration (``TABLE_NAME``, ``QUEUE_URL``, ``ECS_CLUSTER_ARN``,
``ECS_SERVICE_NAME``, ``AWS_REGION``) is validated on first use; a bad value fails every
invocation with a log line naming the variable.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit

from . import model
from .aws import AsyncClient, ClientSettings
from .clock import SYSTEM_CLOCK, Clock
from .env import ConfigError, required
from .lease.dynamo import (
    error_code,
    from_item,
    is_condition_failure,
    names,
    query_all,
    retry_until,
    to_attr,
)
from .lease.errors import StoreUnavailable
from .lease.sessions import delete_after
from .logs import configured, log_event
from .validation import REGION_PATTERN
from .warm import WarmContainer
from .worker.ecs_metadata import check_task_arn

logger = logging.getLogger(__name__)

ENV_REGION = "AWS_REGION"
ENV_NAMES = (
    model.ENV_TABLE_NAME,
    model.ENV_QUEUE_URL,
    model.ENV_ECS_CLUSTER_ARN,
    model.ENV_ECS_SERVICE_NAME,
    ENV_REGION,
)

# DynamoDB accepts a table name or a table ARN as TableName (as the event router does).
TABLE_NAME_PATTERN = re.compile(
    r"[A-Za-z0-9_.\-]{3,255}|arn:aws[a-z\-]*:dynamodb:[a-z0-9\-]+:\d{12}:table/[A-Za-z0-9_.\-]{3,255}"
)
CLUSTER_ARN_PATTERN = re.compile(
    r"arn:aws[a-z-]*:ecs:(?P<region>[a-z0-9-]+):\d{12}:cluster/[A-Za-z0-9_-]{1,255}"
)
SERVICE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,255}")
TASK_ARN_REGION = re.compile(r"arn:aws[a-z-]*:ecs:(?P<region>[a-z0-9-]+):")

MAX_BATCH = 10  # SQS's limit per SendMessageBatch
# The work of one event is a handful of requests; leave the rest of the function's time as
# margin, and never plan beyond this even when the function's timeout is longer.
MAX_WORK_SECONDS = 20.0
DEADLINE_MARGIN_SECONDS = 1.0
SEND_ATTEMPTS = 3
# After the notifications, rows still held by the ended session are announced again after
# these pauses (see SessionEnder._notify_leftovers). The first waits out the workers' fair
# share: what a worker does not take it hands back visible a second later, still announced.
FOLLOW_UP_DELAYS_SECONDS = (1.5, 2.0)
LOGGED_FIELD_CHARS = 256
# One invocation at a time per execution environment: two threads per client are plenty.
CLIENT_SETTINGS = ClientSettings(threads=2)


@dataclass(frozen=True)
class TaskEventsConfig:
    """What the handler acts on: its table and queue, and whose tasks (cluster, service, Region).

    Attributes:
        table_name: the lease table (name or ARN).
        queue_url: the intake queue the workers poll.
        cluster_arn: the ECS cluster of the fleet's service, in this Region.
        service_name: the ECS service whose tasks run the workers.
        region: the Region this function runs in (``AWS_REGION``).
    """

    table_name: str
    queue_url: str
    cluster_arn: str
    service_name: str
    region: str

    @property
    def group(self) -> str:
        """The ``group`` of this service's tasks in ECS events."""
        return model.ecs_service_group(self.service_name)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> TaskEventsConfig:
        """Read and validate the environment; :class:`ConfigError` names the first bad one."""
        env = os.environ if env is None else env
        table_name = required(env, model.ENV_TABLE_NAME)
        if not TABLE_NAME_PATTERN.fullmatch(table_name):
            raise ConfigError(model.ENV_TABLE_NAME, "not a DynamoDB table name or table ARN")
        queue_url = required(env, model.ENV_QUEUE_URL)
        parts = urlsplit(queue_url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(model.ENV_QUEUE_URL, "not an http(s) SQS queue URL")
        region = required(env, ENV_REGION)
        if not REGION_PATTERN.fullmatch(region):
            raise ConfigError(ENV_REGION, f"{region[:64]!r} is not a Region")
        cluster_arn = required(env, model.ENV_ECS_CLUSTER_ARN)
        match = CLUSTER_ARN_PATTERN.fullmatch(cluster_arn)
        if match is None:
            raise ConfigError(model.ENV_ECS_CLUSTER_ARN, "not an ECS cluster ARN")
        if match["region"] != region:
            raise ConfigError(
                model.ENV_ECS_CLUSTER_ARN,
                f"the cluster is in {match['region']}, this function in {region}: ECS events "
                "reach only their own Region",
            )
        service_name = required(env, model.ENV_ECS_SERVICE_NAME)
        if not SERVICE_NAME_PATTERN.fullmatch(service_name):
            raise ConfigError(
                model.ENV_ECS_SERVICE_NAME, "not an ECS service name (letters, digits, - and _)"
            )
        return cls(table_name, queue_url, cluster_arn, service_name, region)


# --- The event (pure) -------------------------------------------------------------------------


@dataclass(frozen=True)
class TaskStopped:
    """A STOPPED event of one of this service's tasks, validated."""

    task_arn: str
    stopped_reason: str = ""
    stop_code: str = ""


class Ignored(Exception):
    """An event the handler does not act on; ``reason`` says why (a log field)."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


def _text(value: object) -> str:
    return str(value)[:LOGGED_FIELD_CHARS]


def parse_event(event: object, config: TaskEventsConfig) -> TaskStopped:
    """The STOPPED task of ``event`` if it is this fleet's; :class:`Ignored` otherwise.

    The rule already matches only this cluster's, this service's STOPPED events; the same checks
    here keep the handler right when it is invoked any other way (a test, a replay, a
    misconfigured rule).
    """
    if not isinstance(event, Mapping):
        raise Ignored("malformed", "the event is not an object")
    if event.get("source") != model.ECS_EVENT_SOURCE:
        raise Ignored("not_ecs", f"source {_text(event.get('source'))!r}")
    if event.get("detail-type") != model.ECS_TASK_STATE_CHANGE:
        raise Ignored("not_a_task_state_change", f"detail-type {_text(event.get('detail-type'))!r}")
    detail = event.get("detail")
    if not isinstance(detail, Mapping):
        raise Ignored("malformed", "detail is not an object")
    last_status = detail.get("lastStatus")
    if last_status != model.ECS_TASK_STOPPED:
        # DEACTIVATING, STOPPING...: the task may still be handing its connections over.
        raise Ignored("not_stopped", f"lastStatus {_text(last_status)!r}")
    if event.get("region") != config.region:
        raise Ignored("other_region", f"region {_text(event.get('region'))!r}")
    if detail.get("clusterArn") != config.cluster_arn:
        raise Ignored("other_cluster", f"clusterArn {_text(detail.get('clusterArn'))!r}")
    if detail.get("group") != config.group:
        raise Ignored("other_service", f"group {_text(detail.get('group'))!r}")
    try:
        task_arn = check_task_arn("detail.taskArn", detail.get("taskArn"))
    except ValueError as exc:
        raise Ignored("malformed", str(exc)) from None
    match = TASK_ARN_REGION.match(task_arn)
    if match is None or match["region"] != config.region:
        raise Ignored("other_region", f"taskArn {task_arn}")
    return TaskStopped(
        task_arn=task_arn,
        stopped_reason=_text(detail.get("stoppedReason") or ""),
        stop_code=_text(detail.get("stopCode") or ""),
    )


# --- Ending the sessions ----------------------------------------------------------------------


class SessionOutcome(StrEnum):
    """What happened to one session of the stopped task."""

    ENDED = "ended"  # ended now, by this event
    ALREADY_ENDED = "already_ended"  # closed by its holder, fenced by a peer, or an earlier event
    OTHER_REGION = "other_region"  # opened in another Region: never ours to end
    OTHER_TASK = "other_task"  # the index was stale: the item names another task
    GONE = "gone"  # no such item any more (its TTL removed it)


@dataclass
class SessionReport:
    """One session: what was done and how many connections were announced."""

    pk: str
    outcome: SessionOutcome
    owner: str | None = None
    version: int | None = None
    notified: int = 0
    notified_again: int = 0  # rows still unclaimed a moment later, announced once more


@dataclass
class Report:
    """What one invocation did (also its log line)."""

    task_arn: str
    sessions: list[SessionReport] = field(default_factory=list)
    notified_at: float | None = None  # monotonic: when SQS accepted the first notifications

    @property
    def changed(self) -> bool:
        return any(s.outcome is SessionOutcome.ENDED for s in self.sessions)

    @property
    def notified(self) -> int:
        return sum(s.notified for s in self.sessions)

    def count(self, outcome: SessionOutcome) -> int:
        return sum(1 for s in self.sessions if s.outcome is outcome)


class SessionEnder:
    """Ends the sessions of a stopped task and announces their connections to the fleet."""

    def __init__(
        self,
        config: TaskEventsConfig,
        *,
        dynamodb: AsyncClient,
        sqs: AsyncClient,
        clock: Clock = SYSTEM_CLOCK,
    ):
        self.config = config
        self._dynamodb = dynamodb
        self._sqs = sqs
        self.clock = clock

    async def handle(self, stopped: TaskStopped, *, deadline: float, token: str) -> Report:
        """Every session of ``stopped.task_arn`` handled; raises :class:`StoreUnavailable`
        (or an SQS error) if the work could not be done before ``deadline``. ``token``: unique
        to this invocation (its request id), recorded in each session it ends."""
        report = Report(task_arn=stopped.task_arn)
        for pk in await self._sessions_of(stopped.task_arn, deadline):
            session = await self._end(pk, stopped.task_arn, deadline, token)
            if session.outcome is SessionOutcome.ENDED:
                rows = await self._started_rows(session, deadline)
                await self._notify(rows, deadline)
                session.notified = len(rows)
                if rows and report.notified_at is None:
                    report.notified_at = self.clock.monotonic()
            report.sessions.append(session)
        await self._notify_leftovers(report, deadline)
        return report

    async def _notify_leftovers(self, report: Report, deadline: float) -> None:
        """Announce again what no peer has claimed a moment later.

        A notification can be swallowed: the dead worker's own long poll may still be pending
        at SQS, which hands it the first messages and takes them out of sight for the queue's
        visibility timeout (30 s), and a row acquired just before the crash may have been
        missing from the ``by-owner`` index at the first query. Each round asks the index once
        per ended session and notifies only the rows still held; it stops as soon as none is.
        """
        pending = [s for s in report.sessions if s.outcome is SessionOutcome.ENDED]
        for delay in FOLLOW_UP_DELAYS_SECONDS:
            if not pending or self.clock.monotonic() + delay >= deadline:
                return
            await asyncio.sleep(delay)
            still = []
            for session in pending:
                rows = await self._started_rows(session, deadline)
                if rows:
                    await self._notify(rows, deadline)
                    session.notified_again += len(rows)
                    still.append(session)
            pending = still

    async def _sessions_of(self, task_arn: str, deadline: float) -> list[str]:
        """The keys the ``by-task`` index lists for the task (one query; keys only)."""
        items = await query_all(
            self._dynamodb,
            clock=self.clock,
            deadline=deadline,
            what=f"sessions of {task_arn}",
            TableName=self.config.table_name,
            IndexName=model.TASK_INDEX.name,
            KeyConditionExpression="#task_arn = :task",
            ExpressionAttributeNames=names(model.SESSION_TASK_ARN),
            ExpressionAttributeValues={":task": to_attr(task_arn)},
        )
        return sorted(
            {
                item[model.PK]
                for item in items
                if str(item.get(model.PK, "")).startswith(model.SESSION_PREFIX)
            }
        )

    async def _end(self, pk: str, task_arn: str, deadline: float, token: str) -> SessionReport:
        """The fence: LIVE -> ENDED, only if the item names this task and this Region.

        The index is only a pointer (it may lag): the condition, evaluated on the item itself,
        decides. A renewal the dead process sent before it died and that lands after this fails
        on the state, exactly as after a taker's fence. ``token`` (written as ``ended_by``) tells
        a retry whose earlier attempt was applied, answer lost, from a session that was over.
        """
        ended_by = f"{model.ENDED_BY_TASK_STOPPED}:{token}"
        update = {
            "TableName": self.config.table_name,
            "Key": {model.PK: to_attr(pk)},
            "UpdateExpression": (
                "SET #session_state = :ended, #delete_after = :delete_after, #ended_by = :ended_by"
            ),
            "ConditionExpression": (
                "#session_state = :live AND #task_arn = :task AND #region = :region"
            ),
            "ExpressionAttributeNames": names(
                model.SESSION_STATE,
                model.DELETE_AFTER,
                model.SESSION_ENDED_BY,
                model.SESSION_TASK_ARN,
                model.SESSION_REGION,
            ),
            "ExpressionAttributeValues": {
                ":ended": to_attr(model.SessionState.ENDED.value),
                ":live": to_attr(model.SessionState.LIVE.value),
                ":task": to_attr(task_arn),
                ":region": to_attr(self.config.region),
                ":delete_after": to_attr(delete_after(self.clock)),
                ":ended_by": to_attr(ended_by),
            },
        }
        try:
            response = await retry_until(
                lambda: self._dynamodb.call("update_item", ReturnValues="ALL_NEW", **update),
                deadline=deadline,
                clock=self.clock,
                what=f"end {pk}",
            )
        except Exception as exc:
            if not is_condition_failure(exc):
                raise
        else:
            item = from_item(response["Attributes"]) or {}
            return SessionReport(
                pk,
                SessionOutcome.ENDED,
                owner=item.get(model.SESSION_OWNER),
                version=int(item[model.SESSION_VERSION]),
            )
        item = await self._read(pk, deadline)
        if item is None:
            return SessionReport(pk, SessionOutcome.GONE)
        owner = item.get(model.SESSION_OWNER)
        version = int(item[model.SESSION_VERSION]) if model.SESSION_VERSION in item else None
        if item.get(model.SESSION_ENDED_BY) == ended_by:  # an earlier attempt was applied
            return SessionReport(pk, SessionOutcome.ENDED, owner, version)
        if item.get(model.SESSION_TASK_ARN) != task_arn:
            return SessionReport(pk, SessionOutcome.OTHER_TASK, owner, version)
        if item.get(model.SESSION_REGION) != self.config.region:
            return SessionReport(pk, SessionOutcome.OTHER_REGION, owner, version)
        return SessionReport(pk, SessionOutcome.ALREADY_ENDED, owner, version)

    async def _read(self, pk: str, deadline: float) -> dict[str, Any] | None:
        response = await retry_until(
            lambda: self._dynamodb.call(
                "get_item",
                TableName=self.config.table_name,
                Key={model.PK: to_attr(pk)},
                ConsistentRead=True,
            ),
            deadline=deadline,
            clock=self.clock,
            what=f"read {pk}",
        )
        return from_item(response.get("Item"))

    async def _started_rows(self, session: SessionReport, deadline: float) -> list[str]:
        """The STARTED connections the session holds (``by-owner``, as orphan discovery asks).

        STOPPED rows of the dead owner are left to reconcile, which clears them (or has their
        log sealed); a row the index has not caught up with yet is found by reconcile too.
        """
        owner, version = session.owner, session.version
        assert owner is not None and version is not None
        items = await query_all(
            self._dynamodb,
            clock=self.clock,
            deadline=deadline,
            what=f"connections of {session.pk}",
            TableName=self.config.table_name,
            IndexName=model.OWNER_INDEX.name,
            KeyConditionExpression="#lease_owner = :owner",
            FilterExpression="#lease_session = :version",
            ExpressionAttributeNames=names(model.LEASE_OWNER, model.LEASE_SESSION),
            ExpressionAttributeValues={
                ":owner": to_attr(owner),
                ":version": to_attr(version),
            },
        )
        started = model.DesiredState.STARTED.value
        return sorted(item[model.PK] for item in items if item.get(model.DESIRED_STATE) == started)

    async def _notify(self, pks: list[str], deadline: float) -> None:
        """One notification per connection, in ``SendMessageBatch`` requests of ten, entries
        SQS refused sent again; raises if some could not be sent before ``deadline``."""
        for start in range(0, len(pks), MAX_BATCH):
            pending = {str(n): pk for n, pk in enumerate(pks[start : start + MAX_BATCH])}
            for _ in range(SEND_ATTEMPTS):
                entries = [
                    {"Id": entry_id, "MessageBody": model.notification_body(pk, orphan=True)}
                    for entry_id, pk in pending.items()
                ]
                response = await retry_until(
                    lambda entries=entries: self._sqs.call(
                        "send_message_batch", QueueUrl=self.config.queue_url, Entries=entries
                    ),
                    deadline=deadline,
                    clock=self.clock,
                    what="notify the fleet",
                )
                failed = {entry["Id"] for entry in response.get("Failed", [])}
                pending = {entry_id: pk for entry_id, pk in pending.items() if entry_id in failed}
                if not pending:
                    break
            if pending:
                raise RuntimeError(
                    f"SQS refused the notifications of {sorted(pending.values())[:5]}"
                )


# --- Per-container state and the entry point ----------------------------------------------


def _build_config(
    clients: Callable[[], tuple[AsyncClient, ...]],
) -> tuple[TaskEventsConfig, AsyncClient, AsyncClient]:
    config = TaskEventsConfig.from_env()
    dynamodb, sqs = clients()
    return config, dynamodb, sqs


_CONTAINER = WarmContainer(ENV_NAMES, ("dynamodb", "sqs"), _build_config, CLIENT_SETTINGS)


def reset() -> None:
    """Forget the cached config, clients and event loop (tests; a new environment)."""
    with _CONTAINER.lock:
        _CONTAINER.reset()


def _work_seconds(context: Any) -> float:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    if remaining is None:
        return MAX_WORK_SECONDS
    return max(0.5, min(MAX_WORK_SECONDS, remaining() / 1000 - DEADLINE_MARGIN_SECONDS))


def _requests(clients: tuple[AsyncClient, AsyncClient], before: list[Counter[str]]) -> dict:
    """Requests sent during this invocation, by service and operation."""
    return {
        client.service: dict(client.requests - seen)
        for client, seen in zip(clients, before, strict=True)
    }


def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    """The Lambda entry point (``streamfleet.task_events.handler``), for EventBridge events.

    Returns what it did (EventBridge ignores it; tests and the local fleet read it). Raises when
    the configuration is bad or the store could not be reached, so the invocation is retried and
    counted as an error (the errors alarm).
    """
    started = time.monotonic()
    request_id = getattr(context, "aws_request_id", None)
    with _CONTAINER.lock:
        config, dynamodb, sqs = configured(_CONTAINER, logger, context)
        try:
            stopped = parse_event(event, config)
        except Ignored as ignored:
            # The rule sends only this service's STOPPED events: anything else is worth a look.
            level = logging.INFO if ignored.reason == "not_stopped" else logging.WARNING
            log_event(
                logger,
                level,
                "task_event_ignored",
                reason=ignored.reason,
                detail=ignored.detail,
                requestId=request_id,
            )
            return {"decision": "ignored", "reason": ignored.reason, "detail": ignored.detail}
        clients = (dynamodb, sqs)
        before = [Counter(client.requests) for client in clients]
        ender = SessionEnder(config, dynamodb=dynamodb, sqs=sqs)
        deadline = SYSTEM_CLOCK.monotonic() + _work_seconds(context)
        try:
            token = request_id or uuid.uuid4().hex
            report = _CONTAINER.run(ender.handle(stopped, deadline=deadline, token=token))
        except Exception as exc:
            log_event(
                logger,
                logging.ERROR,
                "task_stopped_failed",
                taskArn=stopped.task_arn,
                error=type(exc).__name__,
                errorCode=error_code(exc),
                detail=_text(exc),
                unavailable=isinstance(exc, StoreUnavailable),
                requestId=request_id,
            )
            raise
    requests = _requests(clients, before)
    for session in report.sessions:
        log_event(
            logger,
            logging.INFO,
            "task_session",
            taskArn=stopped.task_arn,
            pk=session.pk,
            outcome=session.outcome.value,
            notified=session.notified,
            notifiedAgain=session.notified_again,
            # Said in words, so that a replayed event reads as harmless in the log.
            changed=session.outcome is SessionOutcome.ENDED,
        )
    log_event(
        logger,
        logging.INFO,
        "task_stopped",
        taskArn=stopped.task_arn,
        stoppedReason=stopped.stopped_reason,
        stopCode=stopped.stop_code,
        sessions=len(report.sessions),
        ended=report.count(SessionOutcome.ENDED),
        alreadyEnded=report.count(SessionOutcome.ALREADY_ENDED),
        notified=report.notified,
        changed=report.changed,
        durationMs=round((time.monotonic() - started) * 1000, 1),
        requestId=request_id,
    )
    return {
        "decision": "acted" if report.changed else "unchanged",
        "task_arn": stopped.task_arn,
        "sessions": [
            {
                "pk": s.pk,
                "outcome": s.outcome.value,
                "owner": s.owner,
                "version": s.version,
                "notified": s.notified,
                "notified_again": s.notified_again,
            }
            for s in report.sessions
        ],
        "notified": report.notified,
        "notified_again": sum(s.notified_again for s in report.sessions),
        # From the invocation's start until SQS accepted the first notifications.
        "notified_after_ms": (
            None if report.notified_at is None else round((report.notified_at - started) * 1000, 1)
        ),
        "requests": requests,
    }
