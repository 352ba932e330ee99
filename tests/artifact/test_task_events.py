"""The task-events handler from its synthesized asset, against local servers (sessions and rows
on dynalite, the intake queue on moto, both behind the recording proxy), in both Regions.

Sessions and connection rows are written by the runtime's own lease store, as workers write
them; the handler runs from the asset directory with its template environment (the template's
references mapped to the local table, queue, cluster and service), and the events it gets are
checked against the synthesized rule's pattern first, as EventBridge would.
"""

from __future__ import annotations

import asyncio
import json
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.desired_state import DesiredStateWriter
from streamfleet.lease import LeaseStore, LeaseTiming
from streamfleet_dev.assembly import Bindings
from streamfleet_dev.emulator.ecs import (
    HANDLER,
    RuleTarget,
    local_cluster_arn,
    local_task_arn,
    matches,
    rule_target,
    start_handler,
    task_state_change_event,
)
from streamfleet_dev.emulator.lambda_runner import LambdaFunctionError, LambdaProcess
from streamfleet_dev.iam import NameMap, calls_of, check, statements_of
from tests.assembly_support import (
    build_world,
    client,
    environment_findings,
    function_with_handler,
    origin_findings,
)

pytestmark = pytest.mark.slow
TIMING = LeaseTiming()  # production timing: nothing here waits for an expiry
SERVICE = "streamfleet-test-workers"
WS_URL = "ws://127.0.0.1:8765/streams/x"


@pytest.fixture(scope="module")
def world(servers, tmp_path_factory):
    yield from build_world(servers, tmp_path_factory.mktemp("task-events"))


@dataclass
class RegionHandler:
    """One Region's handler from its asset, and what it acts on here."""

    role: str
    region: str
    target: RuleTarget
    process: LambdaProcess
    cluster_arn: str
    table: str
    queue_url: str
    world: Any
    stores: list[LeaseStore] = field(default_factory=list)

    @property
    def dynamodb(self) -> Any:
        return client("dynamodb", self.world.dynalite, self.region)

    @property
    def sqs(self) -> Any:
        return client("sqs", self.world.moto, self.region)

    def event(self, task_arn: str, **overrides: Any) -> dict[str, Any]:
        arguments = {
            "task_arn": task_arn,
            "cluster_arn": self.cluster_arn,
            "service_name": SERVICE,
            "region": self.region,
            "exit_code": 137,
        }
        return task_state_change_event(**{**arguments, **overrides})

    def invoke(self, event: dict[str, Any]) -> dict[str, Any]:
        return self.process.invoke(event)

    def item(self, pk: str) -> dict[str, Any] | None:
        return self.dynamodb.get_item(
            TableName=self.table, Key={model.PK: {"S": pk}}, ConsistentRead=True
        ).get("Item")

    def items(self, pks: list[str]) -> dict[str, Any]:
        return {pk: self.item(pk) for pk in pks}

    def drain(self) -> list[str]:
        """Every notification in the queue now (deleted), as ``pk``s."""
        found: list[str] = []
        while True:
            messages = self.sqs.receive_message(
                QueueUrl=self.queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
            ).get("Messages", [])
            if not messages:
                return found
            for message in messages:
                found.append(model.parse_notification(message["Body"]))
                # Announced as an orphan: claimed by each peer up to its fair share.
                assert model.is_orphan_notification(message["Body"]), message["Body"]
                self.sqs.delete_message(
                    QueueUrl=self.queue_url, ReceiptHandle=message["ReceiptHandle"]
                )


def _handler(world, role: str, *, access_key: str, env: dict[str, str] | None = None):
    region = world.regions[role]
    stack = region.fleet.stack
    function = function_with_handler(stack, HANDLER)
    cluster_arn = local_cluster_arn(stack.region)
    target = rule_target(
        stack,
        bindings=Bindings(
            refs=region.fleet.bindings.refs,
            attributes=region.fleet.bindings.attributes,
            pseudo=region.fleet.bindings.pseudo,
            values=region.fleet.bindings.values,
        ),
        cluster_arn=cluster_arn,
        service_name=SERVICE,
    )
    if env:
        target = RuleTarget(target.pattern, target.function, {**target.environment, **env})
    process = start_handler(
        target,
        region=stack.region,
        log_path=world.tmp / f"task-events-{access_key}-{uuid.uuid4().hex[:6]}.log",
        credentials=(access_key, "local"),
        extra_env={"AWS_ENDPOINT_URL": world.proxy.endpoint},
        sdk_dir=world.sdk_dir,
    )
    world.started.append(process)
    return RegionHandler(
        role=role,
        region=stack.region,
        target=target,
        process=process,
        cluster_arn=cluster_arn,
        table=target.environment["TABLE_NAME"],
        queue_url=target.environment["QUEUE_URL"],
        world=world,
    ), function


@pytest.fixture(scope="module")
def primary(world) -> Iterator[RegionHandler]:
    handler, _ = _handler(world, "primary", access_key="task-events-primary")
    yield handler
    for store in handler.stores:
        store.session._dynamodb.close()


@pytest.fixture(scope="module")
def secondary(world) -> Iterator[RegionHandler]:
    handler, _ = _handler(world, "secondary", access_key="task-events-secondary")
    yield handler


def _async_dynamodb(handler: RegionHandler) -> AsyncClient:
    return AsyncClient(
        "dynamodb",
        endpoint_url=handler.world.dynalite,
        region_name=handler.region,
        aws_access_key_id="setup",
        aws_secret_access_key="setup",
    )


async def worker_session(
    handler: RegionHandler,
    *,
    task_arn: str,
    streams: dict[str, str],
    region: str | None = None,
    worker: str | None = None,
) -> tuple[LeaseStore, list[str]]:
    """A worker's session (``task_arn``, ``region``) holding ``streams`` (id -> desired
    state), written by the runtime's lease store and desired-state writer."""
    dynamodb = _async_dynamodb(handler)
    worker = worker or f"w-{uuid.uuid4().hex[:8]}"
    store = LeaseStore.create(
        table_name=handler.table,
        worker_id=worker,
        timing=TIMING,
        dynamodb=dynamodb,
        region=region or handler.region,
        task_arn=task_arn,
    )
    handler.stores.append(store)
    await store.session.open()
    writer = DesiredStateWriter(dynamodb=dynamodb, table_name=handler.table)
    pks = []
    for stream_id, state in streams.items():
        await writer.start(stream_id, WS_URL)
        lease = await store.connections.acquire(model.connection_pk(stream_id))
        assert lease is not None and lease.owner == worker
        if state == model.DesiredState.STOPPED.value:
            await writer.stop(stream_id)
        pks.append(lease.pk)
    return store, pks


def ids(prefix: str, count: int) -> list[str]:
    suffix = uuid.uuid4().hex[:6]
    return [f"{prefix}-{suffix}-{n}" for n in range(count)]


def invoke(handler: RegionHandler, event: dict[str, Any]) -> dict[str, Any]:
    # EventBridge first: only an event the synthesized rule matches reaches the handler.
    assert matches(handler.target.pattern, event), event
    return handler.invoke(event)


# --- (a) the dead task's sessions end and their streams are announced ---------------------------


async def test_a_stopped_event_ends_the_dead_tasks_sessions_and_announces_each_stream(primary):
    primary.drain()
    dead_task = local_task_arn(primary.cluster_arn)
    running_task = local_task_arn(primary.cluster_arn)
    started = ids("dead", 12)
    stopped = ids("dead-stopped", 1)
    # The dead task ran two sessions: one closed earlier (the worker reopened), one live.
    earlier, _ = await worker_session(primary, task_arn=dead_task, streams={})
    earlier_pk = earlier.session.pk
    await earlier.session.close()
    dead, dead_pks = await worker_session(
        primary,
        task_arn=dead_task,
        streams={**dict.fromkeys(started, "STARTED"), **dict.fromkeys(stopped, "STOPPED")},
    )
    alive, alive_pks = await worker_session(
        primary, task_arn=running_task, streams=dict.fromkeys(ids("alive", 3), "STARTED")
    )
    before = primary.items([*alive_pks, alive.session.pk, *dead_pks])
    peer, _ = await worker_session(primary, task_arn=running_task, streams={})
    claimed: list[str] = []

    async def intake() -> None:
        """A live peer's intake: claims each announced stream as soon as it is announced."""
        while True:
            for pk in await asyncio.to_thread(primary.drain):
                lease = await peer.connections.acquire(pk)
                assert lease is not None and lease.owner == peer.session.worker_id, pk
                claimed.append(pk)
            await asyncio.sleep(0.02)

    peers = asyncio.create_task(intake())
    try:
        result = await asyncio.to_thread(invoke, primary, primary.event(dead_task))
    finally:
        peers.cancel()

    assert result["decision"] == "acted", result
    outcomes = {s["pk"]: s["outcome"] for s in result["sessions"]}
    assert outcomes == {dead.session.pk: "ended", earlier_pk: "already_ended"}
    ended = primary.item(dead.session.pk)
    assert ended[model.SESSION_STATE]["S"] == model.SessionState.ENDED.value
    assert ended[model.SESSION_ENDED_BY]["S"].startswith(f"{model.ENDED_BY_TASK_STOPPED}:")
    assert int(ended[model.DELETE_AFTER]["N"]) > 0  # left to the TTL, never deleted
    # One notification per STARTED stream the session held (the STOPPED one is reconcile's),
    # each claimed by the peer through its intake. (A stream whose claim was still in flight
    # half a second later is announced once more: harmless, the peer has it.)
    assert set(claimed) == {model.connection_pk(s) for s in started}
    assert result["notified"] == len(started)
    # The handler claims nothing itself and touches no other session or row.
    assert primary.items([*alive_pks, alive.session.pk]) == {
        pk: before[pk] for pk in [*alive_pks, alive.session.pk]
    }
    stopped_pk = model.connection_pk(stopped[0])
    assert primary.item(stopped_pk) == before[stopped_pk]
    # Its cost: one by-task query; per session it ended one write, one by-owner query, one
    # send per ten streams and a look a moment later (a second one if something was still
    # held at the first); one read for the session that was already over.
    requests = result["requests"]
    looks = requests["dynamodb"]["query"] - 2
    assert looks in (1, 2) and (looks == 2) == (result["notified_again"] > 0), result
    assert {k: v for k, v in requests["dynamodb"].items() if k != "query"} == {
        "update_item": 2,
        "get_item": 1,
    }
    first = math.ceil(len(started) / 10)
    extra_sends = requests["sqs"]["send_message_batch"] - first
    if result["notified_again"]:
        assert 1 <= extra_sends <= 2 * first, requests
    else:
        assert extra_sends == 0, requests

    # The same event again (a retry, a duplicate): nothing changes, and the result says so.
    primary.drain()  # a last announcement the peer's intake had not picked up yet
    after = primary.items([*dead_pks, dead.session.pk, earlier_pk])
    again = invoke(primary, primary.event(dead_task))
    assert again["decision"] == "unchanged"
    assert {s["outcome"] for s in again["sessions"]} == {"already_ended"}
    assert again["notified"] == 0 and primary.drain() == []
    assert primary.items([*dead_pks, dead.session.pk, earlier_pk]) == after


async def test_streams_nobody_claims_are_announced_again_then_left_to_reconcile(primary):
    """A notification can be lost to the dead worker's own pending long poll: what is still
    held by the ended session a moment later is announced once more, twice at most."""
    primary.drain()
    task = local_task_arn(primary.cluster_arn)
    dead, pks = await worker_session(primary, task_arn=task, streams=dict.fromkeys(ids("u", 3)))

    result = invoke(primary, primary.event(task))  # and no peer claims anything

    assert (result["notified"], result["notified_again"]) == (3, 6)
    announced = primary.drain()
    assert sorted(announced) == sorted(pks * 3)
    assert result["requests"]["dynamodb"]["query"] == 1 + 3  # by-task, then by-owner x 3
    # Still the ended session's rows: reconcile's from here on (an ended session is takeable).
    assert {primary.item(pk)[model.LEASE_OWNER]["S"] for pk in pks} == {dead.session.worker_id}


async def test_an_event_after_a_peer_fenced_the_expired_session_changes_nothing(primary):
    primary.drain()
    task = local_task_arn(primary.cluster_arn)
    store, pks = await worker_session(primary, task_arn=task, streams=dict.fromkeys(ids("f", 2)))
    # The lease expired and a peer fenced the session (the taker's write) before ECS's event.
    info = await store.directory.read(store.session.worker_id, store.session.version)
    assert info is not None
    assert await store.directory.fence(info)
    before = primary.items([*pks, store.session.pk])

    result = invoke(primary, primary.event(task))

    assert result["decision"] == "unchanged", result
    assert [s["outcome"] for s in result["sessions"]] == ["already_ended"]
    assert primary.drain() == [] and primary.items([*pks, store.session.pk]) == before


def _variants(handler: RegionHandler, task: str) -> dict[str, dict[str, Any]]:
    other_cluster = local_cluster_arn(handler.region)
    return {
        "another service": handler.event(task, service_name="someone-else"),
        "another cluster": handler.event(task, cluster_arn=other_cluster),
        "DEACTIVATING (SIGTERM, still handing over)": handler.event(
            task, last_status="DEACTIVATING"
        ),
        "STOPPING": handler.event(task, last_status="STOPPING"),
        "RUNNING": handler.event(task, last_status="RUNNING"),
    }


@pytest.mark.parametrize(
    "variant",
    [
        "another service",
        "another cluster",
        "DEACTIVATING (SIGTERM, still handing over)",
        "STOPPING",
        "RUNNING",
    ],
)
async def test_an_event_that_is_not_this_services_stopped_task_changes_nothing(primary, variant):
    primary.drain()
    task = local_task_arn(primary.cluster_arn)
    store, pks = await worker_session(primary, task_arn=task, streams=dict.fromkeys(ids("n", 2)))
    event = _variants(primary, task)[variant]
    before = primary.items([*pks, store.session.pk])

    # The synthesized rule does not match it...
    assert not matches(primary.target.pattern, event)
    # ...and the handler, invoked anyway (a replay, a misconfigured rule), refuses it too.
    result = primary.invoke(event)

    assert result["decision"] == "ignored", result
    assert result["reason"] in {"other_service", "other_cluster", "not_stopped"}
    assert primary.items([*pks, store.session.pk]) == before
    assert primary.drain() == []


async def test_malformed_events_are_ignored(primary):
    task = local_task_arn(primary.cluster_arn)
    bad_arn = primary.event(task)
    bad_arn["detail"]["taskArn"] = "arn:aws:ecs:us-east-1:123456789012:task/short-format"
    for event, reason in (
        (bad_arn, "malformed"),
        ({**primary.event(task), "source": "aws.ec2"}, "not_ecs"),
        ({**primary.event(task), "detail": "STOPPED"}, "malformed"),
        ("not even an object", "malformed"),
    ):
        assert primary.invoke(event)["reason"] == reason


# --- Regions: the standby never touches the primary's sessions ------------------------------


async def test_the_standby_regions_handler_never_ends_the_primarys_sessions(primary, secondary):
    primary.drain()
    secondary.drain()
    # One lease table for both Regions (a global table): the standby's replica shows the
    # primary's sessions.
    assert primary.table == secondary.table
    primary_task = local_task_arn(primary.cluster_arn)
    store, pks = await worker_session(
        primary, task_arn=primary_task, streams=dict.fromkeys(ids("p", 2))
    )
    before = primary.items([*pks, store.session.pk])

    # The primary's STOPPED event, however it reaches the standby, names the other Region.
    forged = primary.event(primary_task)
    assert secondary.invoke(forged)["reason"] == "other_region"
    relabelled = {**forged, "region": secondary.region}
    relabelled["detail"] = {**forged["detail"], "clusterArn": secondary.cluster_arn}
    relabelled["detail"]["group"] = model.ecs_service_group(SERVICE)
    assert matches(secondary.target.pattern, relabelled)  # even past the standby's rule...
    assert secondary.invoke(relabelled)["reason"] == "other_region"  # ...the task is not its own
    # A session that claims one of the standby's tasks but was opened in the primary (what a
    # replica may show): the write's own condition refuses it.
    standby_task = local_task_arn(secondary.cluster_arn)
    odd, _odd_pks = await worker_session(
        primary, task_arn=standby_task, region=primary.region, streams=dict.fromkeys(ids("o", 1))
    )
    result = secondary.invoke(secondary.event(standby_task))
    assert [s["outcome"] for s in result["sessions"]] == ["other_region"]
    assert primary.item(odd.session.pk)[model.SESSION_STATE]["S"] == "LIVE"
    assert primary.items([*pks, store.session.pk]) == before
    assert primary.drain() == [] and secondary.drain() == []

    # The standby's own worker (its fleet promoted, running a task there): acted on.
    own, own_pks = await worker_session(
        secondary,
        task_arn=local_task_arn(secondary.cluster_arn),
        streams=dict.fromkeys(ids("s", 2)),
    )
    result = secondary.invoke(secondary.event(own.session.task_arn))
    assert result["decision"] == "acted"
    assert sorted(set(secondary.drain())) == sorted(own_pks)  # (announced again: no peer here)


# --- Configuration, environment, permissions -------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("ECS_CLUSTER_ARN", "streamfleet-cluster", "ECS_CLUSTER_ARN: not an ECS cluster ARN"),
        (
            "ECS_CLUSTER_ARN",
            "arn:aws:ecs:eu-west-1:123456789012:cluster/c",
            "ECS_CLUSTER_ARN: the cluster is in eu-west-1, this function in us-east-1",
        ),
        ("ECS_SERVICE_NAME", "two words", "ECS_SERVICE_NAME: not an ECS service name"),
        ("QUEUE_URL", "intake", "QUEUE_URL: not an http(s) SQS queue URL"),
        ("TABLE_NAME", "x", "TABLE_NAME: not a DynamoDB table name"),
    ],
)
def test_a_bad_configuration_fails_every_invocation_naming_the_variable(
    world, variable, value, message
):
    handler, _ = _handler(world, "primary", access_key="task-events-bad", env={variable: value})
    with pytest.raises(LambdaFunctionError) as failed:
        handler.invoke(handler.event(local_task_arn(handler.cluster_arn)))
    assert message in str(failed.value)
    assert failed.value.error_type == "ConfigError"


async def test_the_handler_reads_its_template_environment_and_runs_only_its_asset(world, primary):
    function = function_with_handler(world.regions["primary"].fleet.stack, HANDLER)
    primary.invoke(primary.event(local_task_arn(primary.cluster_arn)))  # config read on use
    findings = environment_findings(function, primary.process) + origin_findings(
        function, primary.process
    )
    assert not findings, findings


async def test_its_role_allows_exactly_what_it_calls(world):
    """Every request the handler made is granted by its synthesized role, and every grant
    was used (the lease table, its two indexes, the queue)."""
    key = "task-events-iam"
    handler, function = _handler(world, "primary", access_key=key)
    task = local_task_arn(handler.cluster_arn)
    store, _ = await worker_session(handler, task_arn=task, streams=dict.fromkeys(ids("i", 2)))
    for _ in range(2):  # ended, then already ended (the read)
        handler.invoke(handler.event(task))
    handler.drain()
    region = world.regions["primary"]
    records = [r for r in world.proxy.records() if r.access_key_id == key]
    assert records and all(0 < r.status < 500 for r in records), records
    names = NameMap(tables=region.fleet.names.tables, queues=region.fleet.names.queues)
    stack = region.fleet.stack
    calls = calls_of(records, stack.account, names)
    findings = check(
        calls, statements_of(stack, function.role), describe=lambda s: f"{function.role} {s.source}"
    )
    assert not findings, f"{function.label} (role {function.role}):\n" + "\n".join(
        map(str, findings)
    )
    store.session._dynamodb.close()


def test_the_local_event_is_what_the_rule_matches(primary):
    event = primary.event(local_task_arn(primary.cluster_arn))
    assert json.loads(json.dumps(event)) == event  # what EventBridge can carry
    assert matches(primary.target.pattern, event)
    assert primary.target.pattern["detail"]["clusterArn"] == [primary.cluster_arn]
    assert primary.target.pattern["detail"]["group"] == [f"service:{SERVICE}"]
