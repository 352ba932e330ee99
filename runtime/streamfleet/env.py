"""Reading a Lambda's configuration from its environment: one error that names the variable,
and a value built from the environment, kept while the variables it reads keep their values.

Standard library only: the authorizer imports it too, and loads no AWS SDK on a cold start.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class ConfigError(ValueError):
    """A missing or invalid environment variable: every invocation fails, naming it.

    ``variable`` is its name, or the names that conflict (``A, B``), as the message starts."""

    def __init__(self, variable: str, message: str):
        super().__init__(f"{variable}: {message}")
        self.variable = variable


def required(env: Mapping[str, str], name: str) -> str:
    """``env[name]``, stripped; :class:`ConfigError` naming ``name`` when unset or blank."""
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(name, "required but not set")
    return value


class EnvironmentCache(Generic[T]):
    """The value ``build()`` returns, built on first use and again only when one of the
    variables ``names`` changes: Lambda's environment never does, a test's does.

    Thread-safe (a local adapter may invoke a handler from several threads): ``build`` runs
    under the lock, so concurrent first calls build once. A ``build`` that raises caches
    nothing, so every invocation reports the bad variable until it is fixed.
    """

    def __init__(self, names: tuple[str, ...], build: Callable[[], T]) -> None:
        self._names = names
        self._build = build
        self._lock = threading.Lock()
        self._cached: tuple[tuple[str, ...], T] | None = None

    def get(self) -> T:
        """The value for the current environment."""
        key = tuple(os.environ.get(name, "") for name in self._names)
        with self._lock:
            if self._cached is None or self._cached[0] != key:
                self._cached = (key, self._build())
            return self._cached[1]

    def clear(self) -> None:
        """Forget the value: the next :meth:`get` builds it again."""
        with self._lock:
            self._cached = None
