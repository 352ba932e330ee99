"""What a Lambda execution environment keeps between warm invocations.

A synchronous handler runs its asyncio code on one event loop that lives as long as the
environment, with clients created once (their connection pools stay warm) and a value built
from the environment (:class:`~streamfleet.env.EnvironmentCache`).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from typing import Any, Generic, TypeVar

from streamfleet.aws import AsyncClient, ClientSettings
from streamfleet.env import EnvironmentCache

T = TypeVar("T")


class WarmContainer(Generic[T]):
    """One event loop, one :class:`AsyncClient` per service, and the value ``build(clients)``
    returns, cached while the variables ``env_names`` keep their values. ``build`` gets
    :meth:`clients` to call once the configuration is valid (a bad variable is reported before
    any client exists). Callers hold :attr:`lock` around :meth:`get` and :meth:`run` (a local
    adapter may call from several threads)."""

    def __init__(
        self,
        env_names: tuple[str, ...],
        services: tuple[str, ...],
        build: Callable[..., T],
        settings: ClientSettings,
    ) -> None:
        self.lock = threading.Lock()
        self._services = services
        self._settings = settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._clients: tuple[AsyncClient, ...] | None = None
        self._value: EnvironmentCache[T] = EnvironmentCache(env_names, lambda: build(self.clients))

    def get(self) -> T:
        """The value for the current environment (built, with the clients, on first use)."""
        return self._value.get()

    def clients(self) -> tuple[AsyncClient, ...]:
        """The clients, in the order of ``services`` (created on first use)."""
        if self._clients is None:
            self._clients = tuple(AsyncClient(name, self._settings) for name in self._services)
        return self._clients

    def run(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` to completion on the environment's event loop."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)

    def reset(self) -> None:
        """Close the clients and the loop, forget the value (tests; a new environment)."""
        for client in self._clients or ():
            client.close()
        if self._loop is not None:
            self._loop.close()
        self._loop, self._clients = None, None
        self._value.clear()
