"""An asyncio DynamoDB client over the simulations' in-process store.

:class:`InProcessClient` stands where :class:`streamfleet.aws.AsyncClient` stands: ``await
client.call(operation, guard=..., **params)`` runs the guard at the send, as the real client
does, then answers on the caller's own event loop, so a virtual-time loop stays deterministic.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from typing import Any

from streamfleet.aws import ClientSettings
from streamfleet_dev.dsim.dynamodb_model import DynamoDBModel


class InProcessClient:
    """An :class:`~streamfleet.aws.AsyncClient` look-alike over
    :class:`~.dynamodb_model.DynamoDBModel`.

    ``latency``: seconds each request takes (called once per request; a seeded draw keeps a
    simulation deterministic), slept on the caller's loop before the request is applied.
    """

    def __init__(
        self,
        store: DynamoDBModel,
        *,
        settings: ClientSettings | None = None,
        latency: Callable[[], float] | None = None,
    ):
        self.client = store
        self.settings = settings or ClientSettings()
        self.requests: Counter[str] = Counter()
        self._latency = latency

    async def call(
        self, operation: str, *, guard: Callable[[], object] | None = None, **params: Any
    ) -> dict[str, Any]:
        if guard is not None:
            guard()
        self.requests[operation] += 1
        delay = self._latency() if self._latency is not None else 0.0
        # Always yield, as a real request does: another task may run before the answer.
        await asyncio.sleep(max(0.0, delay))
        return self.client.call(operation, params)

    def close(self) -> None:
        pass
