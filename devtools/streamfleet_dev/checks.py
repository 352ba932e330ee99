"""What every fleet test, chaos run and simulation checks at the end, in one place.

The stored log of a stream is its messages table items under ``(pk, seq)``. "Exactly once from
the origin" means: the row records where its first owner joined the stream (``origin_seq``), and
the stored seqs are exactly ``origin + 1 .. newest``, each holding what the upstream sent for that
seq. A duplicate cannot show in the table ((pk, seq) is its key), so the check is on content and
on the range: a gap at the start, in the middle or at the end (past the final checkpoint) fails.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from streamfleet import model
from streamfleet.lease.dynamo import from_item

StoredLog = Mapping[int, str]  # seq -> data


def log_problems(
    stream_id: str,
    row: Mapping[str, Any] | None,
    stored: StoredLog,
    data_of: Callable[[str, int], str],
    *,
    final: bool = False,
    stored_by_a_correct_worker: Callable[[int], bool] = lambda seq: True,
) -> list[str]:
    """What is wrong with one stream's stored log (empty: nothing).

    ``final``: the stream was stopped and its owner has released it, so its checkpoint must be
    the newest stored seq (nothing unsealed past it). ``stored_by_a_correct_worker``: whether a
    seq belongs in the log (a hostile upstream's poison and gaps do not).
    """
    problems: list[str] = []
    origin = None if row is None else row.get(model.ORIGIN_SEQ)
    seqs = sorted(stored)
    if origin is None:
        if seqs:
            problems.append(f"{stream_id}: {len(seqs)} messages stored but no origin recorded")
        return problems
    newest = seqs[-1] if seqs else origin
    expected = {s for s in range(origin + 1, newest + 1) if stored_by_a_correct_worker(s)}
    missing = sorted(expected - set(seqs))
    unexpected = sorted(set(seqs) - expected - {s for s in seqs if s <= origin})
    if unexpected:
        problems.append(f"{stream_id}: stored what it should have refused: {unexpected[:8]}")
    below = [seq for seq in seqs if seq <= origin]
    if below:
        problems.append(f"{stream_id}: stored before its origin {origin}: {below[:5]}")
    if missing:
        problems.append(
            f"{stream_id}: missing {len(missing)} of {origin + 1}..{newest}: {missing[:8]}"
        )
    wrong = [seq for seq in seqs if stored[seq] != data_of(stream_id, seq)]
    if wrong:
        problems.append(f"{stream_id}: wrong content at {wrong[:5]}")
    if final:
        checkpoint = row.get(model.LAST_SEQ)
        if checkpoint != newest:
            problems.append(f"{stream_id}: final checkpoint {checkpoint}, newest stored {newest}")
        if model.LEASE_OWNER in row or model.UNSEALED in row:
            problems.append(f"{stream_id}: still owned or unsealed after its final release")
    return problems


def connection_rows(dynamodb: Any, lease_table: str) -> dict[str, dict[str, Any]]:
    """Every connection row of a lease table, by stream id (an operator's scan: tests only)."""
    pages = dynamodb.get_paginator("scan").paginate(TableName=lease_table, ConsistentRead=True)
    items = [from_item(raw) for page in pages for raw in page["Items"]]
    return {
        model.connection_id_of(item[model.PK]): item
        for item in items
        if item[model.PK].startswith(model.CONNECTION_PREFIX)
    }


def stored_log(dynamodb: Any, messages_table: str, stream_id: str) -> dict[int, str]:
    """What is stored for a stream: seq -> data, read consistently."""
    pages = dynamodb.get_paginator("query").paginate(
        TableName=messages_table,
        KeyConditionExpression="#pk = :pk",
        ExpressionAttributeNames={"#pk": model.PK},
        ExpressionAttributeValues={":pk": {"S": model.connection_pk(stream_id)}},
        ConsistentRead=True,
    )
    return {
        int(item[model.SEQ]["N"]): item[model.MESSAGE_DATA]["S"]
        for page in pages
        for item in page["Items"]
    }
