"""How much a worker may hold in memory for its upstreams, in bytes: one rule, read by the
worker's configuration and by the construct that sizes its task.

Per connection, the WebSocket library holds at most ``MAX_QUEUED_FRAMES`` received frames and
one being read, each at most ``MAX_MESSAGE_BYTES`` (and a connection may queue one message in
the sink past the worker's bound before it stops reading), and at most ``MAX_OUTGOING_BYTES``
not yet sent (an upstream that stops reading while it pings is cut off there). Messages received
and not yet stored are bounded per connection (``MAX_BUFFERED_BYTES``, for fairness) and for the
whole worker (``MAX_WORKER_BUFFERED_BYTES``): past either, the connections stop reading their
sockets until the sink has caught up, and the upstreams' TCP windows hold the rest.
"""

from __future__ import annotations

MAX_QUEUED_FRAMES = 4
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
MAX_OUTGOING_BYTES = 64 * 1024
DEFAULT_MAX_BUFFERED_BYTES = 4 * 1024 * 1024
DEFAULT_MAX_WORKER_BUFFERED_BYTES = 128 * 1024 * 1024
# The share of the task's memory that buffering may take: the interpreter, the libraries and
# each connection's own objects (TLS state, the lease) need the rest.
MEMORY_SHARE = 0.75


def worst_case_bytes(
    *, max_connections: int, max_message_bytes: int, max_worker_buffered_bytes: int
) -> int:
    """The most a worker can hold for its upstreams at these settings. Per connection: the
    frames the WebSocket library queues and the one it is reading, one more message that the
    connection queued in the sink just before it found the worker's bound reached, and the
    unsent bytes."""
    per_connection = (MAX_QUEUED_FRAMES + 2) * max_message_bytes + MAX_OUTGOING_BYTES
    return max_connections * per_connection + max_worker_buffered_bytes


def check_fits_memory(
    *,
    memory_limit_mib: int,
    max_connections: int,
    max_message_bytes: int,
    max_worker_buffered_bytes: int,
    fields: str,
) -> None:
    """``ValueError`` naming ``fields`` if buffering could pass its share of the task's memory."""
    worst = worst_case_bytes(
        max_connections=max_connections,
        max_message_bytes=max_message_bytes,
        max_worker_buffered_bytes=max_worker_buffered_bytes,
    )
    budget = int(memory_limit_mib * 1024 * 1024 * MEMORY_SHARE)
    if worst > budget:
        raise ValueError(
            f"{fields}: buffering could reach {worst // 2**20} MiB, over "
            f"{MEMORY_SHARE:.0%} of the task's {memory_limit_mib} MiB ({budget // 2**20} MiB)"
        )
