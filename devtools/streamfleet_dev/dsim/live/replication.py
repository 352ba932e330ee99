"""DynamoDB global tables between two Regions, as the secondary's clients see them.

The primary's fleet writes the messages, and its control plane each stream's readers (the
lease table); each write reaches the secondary's replica some time later, each item on its own:
writes of different items may apply out of order, so the secondary's change stream can carry
seq N+2 before N+1, and its replay can find N+2 stored and N+1 not yet. Writes of one item are
settled last writer wins (an older version arriving after a newer one is dropped), as global
tables settle them. While the primary is cut off, what it wrote and had not replicated waits,
and arrives (again out of order) once it is reachable.

TTL is not replicated: each replica's own TTL deletes what expired there (the run's TTL actor
expires every Region at once), so a delete of the primary's reaches nothing the secondary has
not deleted itself. The per-Region tables (connections, subscriptions) are not replicated. The
state table (each user's subscriptions, which ``getState`` lists) is written by the handlers of
whichever Region serves the user: it replicates both ways, each way its own
:class:`Replication` with its own seeded lags, held while either end is cut off. Last writer
wins within each way only: two Regions writing one user's item at once may settle apart (a
user's client is served by one Region at a time, so the simulation does not produce that).
"""

from __future__ import annotations

import itertools
import random
from typing import TYPE_CHECKING, Any

from streamfleet import model
from streamfleet.lease.dynamo import from_item

if TYPE_CHECKING:
    from streamfleet_dev.dsim.live.region import Region
    from streamfleet_dev.dsim.live.world import World

# A write in flight: (table, its key, the item as the primary holds it after the write or None,
# its version: the order the primary applied it in).
_Write = tuple[str, dict[str, Any], "dict[str, Any] | None", int]
# How much longer each write held back while the primary was cut off makes its backlog take.
BACKLOG_S_PER_WRITE = 0.02
# The writes the fleet and the control plane make to the global tables.
_WRITES = frozenset({"put_item", "update_item", "delete_item"})


class Replication:
    """The primary's writes to the global tables, applied to the secondary after seeded lags."""

    def __init__(
        self,
        world: World,
        source: Region,
        target: Region,
        *,
        tables: tuple[str, ...] = ("messages", "streams"),
        stream_name: str = "replication",
    ):
        assert world.schedule.failover is not None
        self._world = world
        self._source = source
        self._target = target
        # Each way and set of tables draws from a stream of its own: the fleet tables' lags
        # stay as they were before the state table replicated.
        self._rng = random.Random(f"{stream_name}-{world.schedule.seed}")
        self._lag_max = world.schedule.failover.lag_max
        key_names = {
            "messages": (model.PK, model.SEQ),
            "streams": (model.PK,),
            "state": (model.PK,),
        }
        self._keys = {source.names[table]: key_names[table] for table in tables}
        self._versions = itertools.count(1)
        self._applied: dict[tuple[str, tuple[str, ...]], int] = {}  # the version each item has
        self._held: list[_Write] = []  # waiting for the primary to be reachable

    def carry(self, operation: str, params: dict[str, Any]) -> None:
        """A write the primary just applied: on its way to the secondary, if its table is a
        global one."""
        if operation not in _WRITES:
            return
        table = params.get("TableName")
        key_names = self._keys.get(table)  # type: ignore[arg-type]
        if key_names is None:
            return
        source = params["Item"] if operation == "put_item" else params["Key"]
        key = {name: source[name] for name in key_names}
        image = self._source.store.call(
            "get_item", {"TableName": table, "Key": key, "ConsistentRead": True}
        ).get("Item")
        self._send((table, key, image, next(self._versions)))

    def resume(self) -> None:
        """The primary is reachable again: what waited is sent, each write with a lag of its
        own; a backlog takes longer to drain the longer it is, its writes landing in any
        order meanwhile."""
        held, self._held = self._held, []
        drain = self._lag_max + BACKLOG_S_PER_WRITE * len(held)
        for write in held:
            self._send(write, drain)

    def _send(self, write: _Write, lag_max: float | None = None) -> None:
        self._world.scheduler.spawn(
            self._arrive,
            write,
            name="replicate",
            delay=self._rng.uniform(0.0, self._lag_max if lag_max is None else lag_max),
            root=True,
        )

    def _arrive(self, write: _Write) -> None:
        if self._source.isolated or self._target.isolated:
            self._held.append(write)  # not through yet: one end is cut off
            return
        table, key, image, version = write
        item_key = (table, tuple(str(value) for value in key.values()))
        if self._applied.get(item_key, 0) > version:
            return  # a newer version of the item is there already: last writer wins
        self._applied[item_key] = version
        store = self._target.store
        if image is None:
            store.call("delete_item", {"TableName": table, "Key": key})
        else:
            store.call("put_item", {"TableName": table, "Item": image})
        if table == self._target.names["streams"] and image is not None:
            stream = model.connection_id_of(key[model.PK]["S"])
            readers = (from_item(image) or {}).get(model.READERS) or []
            self._world.readers.replicated(self._target, stream, readers)
