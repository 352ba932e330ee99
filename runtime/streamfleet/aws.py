"""Asynchronous access to AWS through boto3 clients run in a bounded thread pool.

boto3 is synchronous; calling it inside ``async def`` blocks the event loop, and every heartbeat
with it. Each :class:`AsyncClient` owns a small executor, so a slow DynamoDB cannot queue
unbounded threads, and the worker gives its session renewals a pool of their own so they
are never stuck behind message writes.

Endpoints come only from the standard variables (``AWS_ENDPOINT_URL``,
``AWS_ENDPOINT_URL_DYNAMODB``, ``AWS_ENDPOINT_URL_SQS``...), which boto3 reads itself: the same
code talks to AWS, moto's server or dynalite.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import boto3
from botocore.config import Config


@dataclass(frozen=True)
class ClientSettings:
    """Timeouts and pool size of one client. Retries are ours (deadline-aware), not botocore's."""

    threads: int = 8
    connect_timeout_seconds: float = 1.0
    read_timeout_seconds: float = 3.0

    def botocore_config(self) -> Config:
        return Config(
            connect_timeout=self.connect_timeout_seconds,
            read_timeout=self.read_timeout_seconds,
            retries={"max_attempts": 1, "mode": "standard"},
            max_pool_connections=self.threads,
        )


class AsyncClient:
    """A boto3 low-level client whose calls run in the client's own bounded executor."""

    def __init__(
        self,
        service: str,
        settings: ClientSettings | None = None,
        *,
        session: boto3.session.Session | None = None,
        **client_kwargs: Any,
    ):
        self.settings = settings or ClientSettings()
        self.service = service
        # Low-level clients are thread-safe once created; create them here, not in the threads.
        # A shared ``session`` saves loading the service's model again for every client.
        self.client = (session or boto3.session.Session()).client(
            service, config=self.settings.botocore_config(), **client_kwargs
        )
        self._executor = ThreadPoolExecutor(
            max_workers=self.settings.threads, thread_name_prefix=f"aws-{service}"
        )
        # Requests sent, by operation: what the benchmarks turn into cost per connection-minute.
        self.requests: Counter[str] = Counter()

    async def call(
        self, operation: str, *, guard: Callable[[], object] | None = None, **params: Any
    ) -> dict[str, Any]:
        """Run ``client.<operation>(**params)`` without blocking the event loop.

        ``guard`` runs in the pool thread right before the request is sent and may raise to
        cancel it: a check made earlier on the event loop can be stale by then (a queue wait,
        or a process frozen between the check and the send).
        """
        self.requests[operation] += 1
        loop = asyncio.get_running_loop()
        method = getattr(self.client, operation)

        def send() -> dict[str, Any]:
            if guard is not None:
                guard()
            return method(**params)

        return await loop.run_in_executor(self._executor, send)

    def close(self) -> None:
        """Stop the executor; calls still running finish in the background."""
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.client.close()
