"""``python -m streamfleet_ops.cli``: the operator's tool, for a local fleet or real AWS alike.

It reaches DynamoDB and SQS through the standard AWS configuration (credentials, region and
``AWS_ENDPOINT_URL*`` for local servers). Table and queue come from ``--table`` / ``--queue-url``
or ``TABLE_NAME`` / ``QUEUE_URL``; ``start`` checks the URL against ``--allowed-upstreams`` /
``ALLOWED_UPSTREAMS``, the list the router and the workers enforce. ``--json`` prints
machine-readable output (on stdout only; messages go to stderr). ``preflight`` checks what a
deployment needs in the target account.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)
from rich.console import Console
from rich.table import Table

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.control import ControlPlane
from streamfleet.lease import LeaseTiming, SessionDirectory
from streamfleet.lease.dynamo import from_item, to_attr
from streamfleet.lease.errors import StoreUnavailable
from streamfleet.validation import check_id, check_ws_url
from streamfleet.worker.upstream_policy import UpstreamPolicy, UpstreamRefused

T = TypeVar("T")
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
TableOption = Annotated[
    str, typer.Option("--table", envvar=model.ENV_TABLE_NAME, help="lease table")
]
QueueOption = Annotated[
    str, typer.Option("--queue-url", envvar=model.ENV_QUEUE_URL, help="intake queue")
]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]
GroupOption = Annotated[str, typer.Option("--group", envvar="SESSION_GROUP", help="session group")]
AllowedOption = Annotated[
    str,
    typer.Option(
        "--allowed-upstreams",
        envvar=model.ENV_ALLOWED_UPSTREAMS,
        help="comma-separated scheme://host[:port] the fleet may dial (as the router checks)",
    ),
]
MessagesOption = Annotated[
    str,
    typer.Option(
        "--messages-table",
        envvar=model.ENV_MESSAGES_TABLE_NAME,
        help="messages table: with it, lag is measured (messages stored past the checkpoint)",
    ),
]


def _fail(message: str, code: int = 1) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(code)


def _aws_error(exc: Exception) -> typer.Exit | None:
    """A clear one-line error for what goes wrong before or while talking to AWS."""
    if isinstance(exc, NoRegionError):
        return _fail(
            "AWS region: not set. Set AWS_REGION (or AWS_DEFAULT_REGION, or a profile's region); "
            "for a local fleet, the environment `make local` prints.",
            2,
        )
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return _fail(
            "AWS credentials: none found. Configure them (AWS_PROFILE, aws sso login, ...); "
            "local servers accept any (AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local).",
            2,
        )
    if isinstance(exc, EndpointConnectionError):
        return _fail(
            f"endpoint: cannot connect to {exc.kwargs.get('endpoint_url', '?')} "
            "(check AWS_ENDPOINT_URL* and that the server is running)",
            1,
        )
    if isinstance(exc, StoreUnavailable):
        return _fail(f"DynamoDB did not answer in time ({exc}); check AWS_ENDPOINT_URL*", 1)
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code, message = error.get("Code", "?"), error.get("Message", "")
        if code == "ResourceNotFoundException":
            hint = f"check --table / {model.ENV_TABLE_NAME} and region"
            return _fail(f"not found: {message or code} ({hint})")
        return _fail(f"AWS refused: {code}: {message}")
    return None


def _run(work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        dynamodb = AsyncClient("dynamodb")
        try:
            return await work(dynamodb)
        finally:
            dynamodb.close()

    try:
        return asyncio.run(main())
    except Exception as exc:
        translated = _aws_error(exc)
        if translated is None:
            raise
        raise translated from None


def _valid(check: Callable[[str, Any], Any], field: str, value: str) -> str:
    try:
        return check(field, value)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _emit(rows: list[dict[str, Any]], as_json: bool, title: str) -> None:
    if as_json:
        typer.echo(json.dumps(rows, default=str))
        return
    table = Table(title=title)
    for column in rows[0] if rows else ["(none)"]:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if value is None else str(value) for value in row.values()))
    Console().print(table)


def allowed_policy(allowed_upstreams: str) -> UpstreamPolicy:
    """The allow-list a START is checked against; a clear error when it is missing or bad."""
    if not allowed_upstreams.strip():
        raise _fail(
            "ALLOWED_UPSTREAMS / --allowed-upstreams: not set. The router and the workers refuse "
            "any URL outside that list, so start checks it first: pass the fleet's list.",
            2,
        )
    try:
        return UpstreamPolicy.parse(model.ENV_ALLOWED_UPSTREAMS, allowed_upstreams)
    except ValueError as exc:
        raise _fail(str(exc), 2) from None


@app.command()
def start(
    connection_id: str,
    ws_url: str,
    table: TableOption,
    queue_url: QueueOption,
    allowed_upstreams: AllowedOption = "",
    json_: JsonOption = False,
) -> None:
    """START a connection (idempotent) and notify the fleet; a URL off the allow-list is
    refused here, before anything is written."""
    _valid(check_id, "connection_id", connection_id)
    _valid(check_ws_url, "ws_url", ws_url)
    try:
        allowed_policy(allowed_upstreams).check(ws_url)
    except UpstreamRefused as refused:
        raise _fail(f"refused, nothing written: {refused} (ALLOWED_UPSTREAMS)", 1) from None

    async def work(dynamodb: AsyncClient):
        sqs = AsyncClient("sqs")
        try:
            control = ControlPlane.create(
                dynamodb=dynamodb, sqs=sqs, table_name=table, queue_url=queue_url
            )
            return await control.start(connection_id, ws_url)
        finally:
            sqs.close()

    result, notified = _run(work)
    row = {"connection_id": connection_id, "outcome": result.outcome.value, "notified": notified}
    _emit([row], json_, "START")


@app.command()
def stop(connection_id: str, table: TableOption, json_: JsonOption = False) -> None:
    """STOP a connection; its owner closes it within a heartbeat."""
    _valid(check_id, "connection_id", connection_id)

    async def work(dynamodb: AsyncClient):
        return await ControlPlane.create(
            dynamodb=dynamodb, sqs=dynamodb, table_name=table, queue_url=""
        ).stop(connection_id)

    result = _run(work)
    _emit([{"connection_id": connection_id, "outcome": result.outcome.value}], json_, "STOP")


def checkpoint_of(item: dict[str, Any]) -> int | None:
    """The seq every message up to which is stored: ``last_seq``, else the origin a first owner
    recorded, else ``None`` (never checkpointed)."""
    for name in (model.LAST_SEQ, model.ORIGIN_SEQ):
        if item.get(name) is not None:
            return int(item[name])
    return None


def connection_rows(
    items: list[dict[str, Any]], now_ms: int, stored: dict[str, int] | None = None
) -> list[dict[str, Any]]:
    """Connection items as rows.

    ``lag`` is in messages, as in the live view: the newest seq the fleet has stored for the
    connection (``stored``, from the messages table) minus its checkpoint; ``None`` where either
    is unknown. ``updated_ago_s`` is how long ago the row last changed (a checkpoint, a lease
    change), in seconds.
    """
    rows = []
    for item in sorted(items, key=lambda i: i[model.PK]):
        if not item[model.PK].startswith(model.CONNECTION_PREFIX):
            continue
        checkpoint = checkpoint_of(item)
        newest = (stored or {}).get(item[model.PK])
        lag = None
        if newest is not None and checkpoint is not None:
            # Positions: within one epoch the difference counts messages; a newer epoch's
            # messages are counted from its start.
            same = model.epoch_of(newest) == model.epoch_of(checkpoint)
            lag = newest - checkpoint if same else model.seq_of(newest)
        rows.append(
            {
                "connection_id": model.connection_id_of(item[model.PK]),
                "desired_state": item.get(model.DESIRED_STATE),
                "owner": item.get(model.LEASE_OWNER),
                "lease_version": item.get(model.LEASE_VERSION),
                "epoch": None if checkpoint is None else model.epoch_of(checkpoint),
                "last_seq": model.split_position(item.get(model.LAST_SEQ))[1],
                "stored_seq": model.split_position(newest)[1],
                "lag": max(lag, 0) if lag is not None else None,
                "updated_ago_s": round((now_ms - item.get(model.UPDATED_AT_MS, now_ms)) / 1000, 1),
                "refused": item.get(model.REFUSED_REASON),
                "held_for_s": _held_for_s(item, now_ms),
                "last_failure": item.get(model.LAST_FAILURE),
            }
        )
    return rows


def _held_for_s(item: dict[str, Any], now_ms: int) -> float | None:
    """How much longer a stream that failed is held off, if it still is."""
    held_until = item.get(model.HELD_UNTIL_MS)
    if held_until is None or int(held_until) <= now_ms:
        return None
    return round((int(held_until) - now_ms) / 1000, 1)


async def _newest_stored(dynamodb: AsyncClient, table: str, pks: list[str]) -> dict[str, int]:
    """The highest stored seq of each connection (one descending Query of one item each)."""

    async def newest(pk: str) -> tuple[str, int | None]:
        page = await dynamodb.call(
            "query",
            TableName=table,
            KeyConditionExpression="#pk = :pk",
            ExpressionAttributeNames={"#pk": model.PK, "#seq": model.SEQ},
            ExpressionAttributeValues={":pk": to_attr(pk)},
            ProjectionExpression="#seq",
            ScanIndexForward=False,
            Limit=1,
        )
        items = page.get("Items", [])
        return pk, int(items[0][model.SEQ]["N"]) if items else None

    found = await asyncio.gather(*(newest(pk) for pk in pks))
    return {pk: seq for pk, seq in found if seq is not None}


@app.command()
def connections(
    table: TableOption, messages_table: MessagesOption = "", json_: JsonOption = False
) -> None:
    """List connections: owner, checkpoint, lag in messages (with --messages-table) and how
    long ago each row last changed.

    This is an operator's full listing (a paginated Scan); the fleet itself never scans.
    """

    async def work(dynamodb: AsyncClient) -> tuple[list[dict[str, Any]], dict[str, int]]:
        items, start_key = [], None
        while True:
            params = {"TableName": table, **({"ExclusiveStartKey": start_key} if start_key else {})}
            page = await dynamodb.call("scan", **params)
            items += [from_item(raw) for raw in page.get("Items", [])]
            start_key = page.get("LastEvaluatedKey")
            if not start_key:
                break
        stored: dict[str, int] = {}
        if messages_table:
            pks = [i[model.PK] for i in items if i[model.PK].startswith(model.CONNECTION_PREFIX)]
            stored = await _newest_stored(dynamodb, messages_table, pks)
        return items, stored

    items, stored = _run(work)
    rows = connection_rows(items, time.time_ns() // 1_000_000, stored if messages_table else None)
    _emit(rows, json_, "connections")


def _directory(dynamodb: AsyncClient, table: str, group: str) -> SessionDirectory:
    # Listing and draining need no timing beyond a request deadline.
    return SessionDirectory(dynamodb=dynamodb, table_name=table, timing=LeaseTiming(), group=group)


@app.command()
def workers(
    table: TableOption, json_: JsonOption = False, group: GroupOption = model.DEFAULT_SESSION_GROUP
) -> None:
    """List worker sessions with their load and how long until they expire."""

    async def work(dynamodb: AsyncClient):
        return await _directory(dynamodb, table, group).list()

    now_ms = time.time_ns() // 1_000_000
    rows = [
        {
            "worker": s.owner,
            "session_version": s.version,
            "state": s.state.value,
            "load": s.load,
            "capacity": s.capacity,
            "expires_in_s": round((s.expires_at_ms - now_ms) / 1000, 1),
            "region": s.region,
        }
        for s in _run(work)
    ]
    _emit(rows, json_, "workers")


@app.command()
def drain(
    worker_id: str,
    table: TableOption,
    json_: JsonOption = False,
    group: GroupOption = model.DEFAULT_SESSION_GROUP,
) -> None:
    """Ask a worker to hand all its connections to the fleet and take no more."""
    _valid(check_id, "worker_id", worker_id)

    async def work(dynamodb: AsyncClient):
        return await _directory(dynamodb, table, group).request_drain(worker_id)

    asked = _run(work)
    if not asked:
        raise _fail(f"worker_id: no live session of {worker_id}")
    _emit([{"worker": s.owner, "session_version": s.version} for s in asked], json_, "drain")


@app.command()
def preflight(
    assembly: Annotated[
        Path, typer.Option("--assembly", help="the synthesized assembly (make synth)")
    ] = Path("cdk.out"),
    json_: JsonOption = False,
) -> None:
    """Check what a deployment of the assembly needs in the target account and on this
    machine (bootstrap, API Gateway role, Docker for arm64, DNS, certificates, secrets).

    One line per check, with the fix; exits 1 if any check fails. Read-only.
    """
    from . import preflight as checks

    try:
        target = checks.target_from_assembly(assembly)
    except (FileNotFoundError, ValueError) as exc:
        raise _fail(f"--assembly: {exc}", 2) from None
    try:
        results = checks.run_checks(target)
    except Exception as exc:
        translated = _aws_error(exc)
        if translated is None:
            raise
        raise translated from None
    if json_:
        typer.echo(json.dumps([result.__dict__ for result in results]))
    else:
        for result in results:
            typer.echo(result.line())
    if checks.failed(results):
        raise typer.Exit(1)


if __name__ == "__main__":
    app()
