"""``python -m streamfleet.cli``: the operator's tool, for a local fleet or real AWS alike.

It reaches DynamoDB and SQS through the standard AWS configuration (credentials, region and
``AWS_ENDPOINT_URL*`` for local servers). Table and queue come from ``--table`` / ``--queue-url``
or ``TABLE_NAME`` / ``QUEUE_URL``. ``--json`` prints machine-readable output.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

from . import model
from .aws import AsyncClient
from .control import ControlPlane
from .lease import LeaseTiming, SessionDirectory
from .lease.dynamo import from_item
from .validation import check_id, check_ws_url

T = TypeVar("T")
app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False)
TableOption = Annotated[str, typer.Option("--table", envvar="TABLE_NAME", help="lease table")]
QueueOption = Annotated[str, typer.Option("--queue-url", envvar="QUEUE_URL", help="intake queue")]
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON")]
GroupOption = Annotated[str, typer.Option("--group", envvar="SESSION_GROUP", help="session group")]


def _run(work: Callable[[AsyncClient], Awaitable[T]]) -> T:
    async def main() -> T:
        dynamodb = AsyncClient("dynamodb")
        try:
            return await work(dynamodb)
        finally:
            dynamodb.close()

    return asyncio.run(main())


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


@app.command()
def start(
    connection_id: str,
    ws_url: str,
    table: TableOption,
    queue_url: QueueOption,
    json_: JsonOption = False,
) -> None:
    """START a connection (idempotent) and notify the fleet."""
    _valid(check_id, "connection_id", connection_id)
    _valid(check_ws_url, "ws_url", ws_url)

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


def connection_rows(items: list[dict[str, Any]], now_ms: int) -> list[dict[str, Any]]:
    """Connection items as rows: owner, last checkpointed seq and how long ago it moved."""
    rows = []
    for item in sorted(items, key=lambda i: i[model.PK]):
        if not item[model.PK].startswith(model.CONNECTION_PREFIX):
            continue
        rows.append(
            {
                "connection_id": model.connection_id_of(item[model.PK]),
                "desired_state": item.get(model.DESIRED_STATE),
                "owner": item.get(model.LEASE_OWNER),
                "lease_version": item.get(model.LEASE_VERSION),
                "last_seq": item.get(model.LAST_SEQ),
                "lag_s": round((now_ms - item.get(model.UPDATED_AT_MS, now_ms)) / 1000, 1),
                "refused": item.get(model.REFUSED_REASON),
            }
        )
    return rows


@app.command()
def connections(table: TableOption, json_: JsonOption = False) -> None:
    """List connections with owner and lag (seconds since the row last moved).

    This is an operator's full listing (a paginated Scan); the fleet itself never scans.
    """

    async def work(dynamodb: AsyncClient) -> list[dict[str, Any]]:
        items, start_key = [], None
        while True:
            params = {"TableName": table, **({"ExclusiveStartKey": start_key} if start_key else {})}
            page = await dynamodb.call("scan", **params)
            items += [from_item(raw) for raw in page.get("Items", [])]
            start_key = page.get("LastEvaluatedKey")
            if not start_key:
                return items

    _emit(connection_rows(_run(work), time.time_ns() // 1_000_000), json_, "connections")


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
        typer.echo(f"worker_id: no live session of {worker_id}", err=True)
        raise typer.Exit(1)
    _emit([{"worker": s.owner, "session_version": s.version} for s in asked], json_, "drain")


if __name__ == "__main__":
    app()
