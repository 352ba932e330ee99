"""START and STOP mean what they say: a new source is never mixed into a stream's log, a readers
change applies only to its own START, and every allowed caller controls every stream.

The lease table is on dynalite, SQS on moto: racing STARTs are the point here, and moto's server
evaluates a condition and writes without a lock, so two racing conditional writes can both
pass there, which DynamoDB (and dynalite) never lets happen."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import pytest

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.desired_state import DesiredStateWriter
from streamfleet.event_router import EventRouter, RouterConfig, StartEvent, StopEvent
from tests.router_support import Router, proxy_event, router_on_servers

A = "ws://127.0.0.1:8765/a"
B = "ws://127.0.0.1:8765/b"


def start(router: Router, stream: str, url: str, readers: list[str] | None = None, **context):
    body: dict[str, Any] = {"event_type": "START", "connection_id": stream, "ws_url": url}
    if readers is not None:
        body["readers"] = readers
    event = proxy_event("POST", "/events", body=json.dumps(body))
    event["requestContext"].update(context)
    return router.call(event)


@pytest.fixture
def router(servers, moto, monkeypatch: pytest.MonkeyPatch) -> Iterator[Router]:
    monkeypatch.setenv("AWS_ENDPOINT_URL_DYNAMODB", servers["dynalite"].endpoint)
    yield from router_on_servers(monkeypatch)


@pytest.fixture
def containers(router: Router) -> Iterator[tuple[EventRouter, EventRouter]]:
    """Two router instances with clients of their own, as two Lambda containers run them."""
    config = RouterConfig.from_env()
    clients = [(AsyncClient("dynamodb"), AsyncClient("sqs")) for _ in range(2)]
    yield tuple(  # type: ignore[misc]
        EventRouter(config, dynamodb=dynamodb, sqs=sqs) for dynamodb, sqs in clients
    )
    for pair in clients:
        for client in pair:
            client.close()


def as_owner(router: Router, stream: str, **attributes: Any) -> None:
    """What a worker's claim (and its checkpoints) leave on the row."""
    sets = ", ".join(f"#{name} = :{name}" for name in attributes)
    router.dynamodb.update_item(
        TableName=router.table,
        Key={model.PK: {"S": model.connection_pk(stream)}},
        UpdateExpression=f"SET {sets}",
        ExpressionAttributeNames={f"#{name}": name for name in attributes},
        ExpressionAttributeValues={
            f":{name}": {"N": str(value)} if isinstance(value, int) else {"S": value}
            for name, value in attributes.items()
        },
    )


def test_a_new_url_while_the_stopped_owner_still_closes_is_refused(router: Router):
    """A STOP then a START with another URL, before the owner closed, answered 200 and wrote
    the new URL; the owner, finding no stop request any more, kept streaming the old one."""
    assert router.start("s1", A)[0] == 201
    as_owner(router, "s1", lease_owner="w1", lease_session=1)
    assert router.stop("s1")[0] == 200

    status, body = start(router, "s1", B)

    assert status == 409 and body["field"] == "ws_url"
    row = router.row("s1")
    assert row[model.WS_URL] == A and row[model.DESIRED_STATE] == "STOPPED"
    assert row[model.STOP_REQUESTED_FOR] == "w1"  # the stop stays in force
    assert start(router, "s1", A)[0] == 200  # the same URL simply keeps it running


def test_a_new_url_for_a_stream_with_a_log_is_refused_and_the_log_keeps_its_source(
    router: Router,
):
    """A START with another URL kept the old position: the next owner dialled B with
    ?last_seq=500, and B's messages were appended to A's log."""
    assert router.start("s2", A)[0] == 201
    as_owner(router, "s2", origin_seq=0, last_seq=500)
    assert router.stop("s2")[0] == 200

    status, body = start(router, "s2", B)

    assert status == 409 and "new connection id" in body["error"]
    row = router.row("s2")
    assert (row[model.WS_URL], row[model.LAST_SEQ]) == (A, 500)
    assert start(router, "s2", A)[1]["outcome"] == "restarted"


def test_a_stream_that_never_stored_anything_may_be_pointed_elsewhere(router: Router):
    """A START refused by the allow-list, say, stopped it before it ever dialled."""
    assert router.start("s3", A)[0] == 201
    assert router.stop("s3")[0] == 200
    status, body = start(router, "s3", B)
    assert (status, body["outcome"], body["state"]["ws_url"]) == (200, "restarted", B)


async def test_readers_apply_only_to_the_start_that_made_them(router: Router, containers):
    """Two STARTs with other URLs and readers at once, on two router instances (two Lambda
    containers): exactly one is applied, and the row holds its URL with its readers."""
    assert (await asyncio.to_thread(router.start, "s4", A))[0] == 201
    assert (await asyncio.to_thread(router.stop, "s4"))[0] == 200
    first, second = containers

    answers = await asyncio.gather(
        first.apply(StartEvent("s4", A, ("user:alice",))),
        second.apply(StartEvent("s4", B, ("user:bob",))),
    )

    assert sorted(status for status, _, _ in answers) == [200, 409], answers
    winner = {A: "user:alice", B: "user:bob"}
    (applied,) = [payload["state"]["ws_url"] for status, payload, _ in answers if status == 200]
    row = router.row("s4")
    assert (row[model.WS_URL], row[model.READERS]) == (applied, {winner[applied]})


def test_every_allowed_caller_controls_every_stream(router: Router):
    """The access model: the REST API's resource policy says who may call it, and every caller
    it admits may START, STOP and re-point (within the rules above) every connection id."""
    producer = {"identity": {"caller": "AROAPRODUCER:p1", "userArn": "arn:aws:sts::1:p1"}}
    operator = {"identity": {"caller": "AROAOPERATOR:o1", "userArn": "arn:aws:sts::1:o1"}}
    assert start(router, "s5", A, ["user:alice"], **producer)[0] == 201
    assert start(router, "s5", A, ["user:bob"], **operator)[0] == 200
    assert router.row("s5")[model.READERS] == {"user:bob"}


async def test_a_start_delayed_after_its_write_cannot_change_a_later_starts_readers(
    router: Router, containers, monkeypatch
):
    """The reported race: START(A, alice) paused after its first write; meanwhile STOP and
    START(B, bob) were answered on another container; then A's readers write landed on B's
    stream, and Alice could read it."""
    assert (await asyncio.to_thread(router.start, "s6", A))[0] == 201
    assert (await asyncio.to_thread(router.stop, "s6"))[0] == 200
    delayed, prompt = containers
    paused, resume = asyncio.Event(), asyncio.Event()
    original = DesiredStateWriter._write

    async def pausing(self, pk, **kwargs):
        written = await original(self, pk, **kwargs)
        if self is delayed.control.writer and written is not None:
            paused.set()
            await resume.wait()  # this request only: the other container runs meanwhile
        return written

    monkeypatch.setattr(DesiredStateWriter, "_write", pausing)
    late = asyncio.create_task(delayed.apply(StartEvent("s6", A, ("user:alice",))))
    await asyncio.wait_for(paused.wait(), 30)
    assert (await prompt.apply(StopEvent("s6")))[0] == 200
    # Its START(A) landed, but nothing of A was ever stored: B may take the stream over.
    assert (await prompt.apply(StartEvent("s6", B, ("user:bob",))))[0] == 200
    resume.set()
    status, payload, _ = await asyncio.wait_for(late, 30)

    row = router.row("s6")
    assert (row[model.WS_URL], row.get(model.READERS)) == (B, {"user:bob"})
    assert status == 200 and payload["state"]["ws_url"] == A  # what its own write stored


async def test_every_path_that_writes_a_start_checks_the_url(router: Router, containers):
    """The router refused a NUL in the host, but DesiredStateWriter.start and ControlPlane.start
    wrote START rows with no check at all."""
    first, _ = containers
    for url in ("wss://127.0.0.2\x00.example.com/", "wss://.example.com/", "ws://a b/"):
        with pytest.raises(ValueError, match=r"^ws_url: "):
            await first.control.start("s7", url)
    assert router.row("s7") is None
