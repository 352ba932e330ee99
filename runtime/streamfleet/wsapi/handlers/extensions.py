"""Routes added to the handler by a deployment: the seam through which an application's own
messages reach the same Lambda, dispatch, replies and refusals as the core routes.

A :class:`RouteExtension` says, statically, what it adds to the protocol: its route keys, each
with the fields its message may carry and a parser (payload -> the extension's message object,
raising :class:`~.messages.BadMessage` naming the field), and optionally extra ``getState``
request fields. Once the handlers exist, :attr:`RouteExtension.bind` is called with what they
share (:class:`ExtensionContext`: the configuration, the state table, the DynamoDB client, the
clock, the environment) and returns the :class:`BoundExtension` that answers its messages and
adds its part to the ``getState`` reply.

An extension is installed by its Lambda entry module, which builds the entry point with
:func:`streamfleet.wsapi.handlers.make_handler` and names the extension in its code: nothing is
imported by computed name, so each asset still carries exactly what its entry imports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from ...clock import Clock
from .config import HandlerConfig
from .state_store import StateStore

# The fields every message may carry besides its own.
COMMON_FIELDS = ("action", "requestId")


@dataclass(frozen=True)
class ExtensionRoute:
    """One route an extension adds.

    Attributes:
        fields: the fields its message may carry besides ``action`` and ``requestId``; any
            other field is refused, as for the core routes.
        parse: the payload (a JSON object holding only those fields) -> the message object
            the extension's :meth:`BoundExtension.handle` receives; raises
            :class:`~.messages.BadMessage` naming the first bad field.
    """

    fields: tuple[str, ...]
    parse: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class StateRequest:
    """Extra fields of ``getState`` an extension reads.

    Attributes:
        fields: the fields it adds to ``getState``.
        parse: the payload -> what :meth:`BoundExtension.add_state` receives (``BadMessage``
            naming the field).
    """

    fields: tuple[str, ...]
    parse: Callable[[Mapping[str, Any]], Any]


@dataclass(frozen=True)
class ExtensionContext:
    """What the handlers share with an extension once they are built."""

    config: HandlerConfig
    state: StateStore
    dynamodb: Any
    clock: Clock
    environment: Mapping[str, str]


class BoundExtension(Protocol):
    """An extension at work: it answers its routes and adds to ``getState``."""

    def handle(
        self,
        user_id: str,
        message: Any,
        time_left_ms: Callable[[], int] | None,
    ) -> dict[str, Any]:
        """The reply to one of its messages (``type`` and its fields; the handlers add
        ``region`` and ``requestId``). Raises :class:`~.messages.Refused` to refuse it; a
        DynamoDB error becomes the core's retryable ``unavailable`` reply."""
        ...

    def add_state(self, user_id: str, request: Any, reply: dict[str, Any]) -> dict[str, Any]:
        """The ``getState`` reply with this extension's keys added to the core's (``request``:
        what :attr:`StateRequest.parse` returned, ``None`` without a :class:`StateRequest`)."""
        ...


@dataclass(frozen=True)
class RouteExtension:
    """What an extension adds to the handler.

    Attributes:
        name: what the extension is, for logs and errors.
        routes: its route keys (never a core route's), each with its fields and parser.
        bind: builds the extension that serves them, from the handlers' shared context.
        state_request: its extra ``getState`` fields (``None``: none).
        environment: the variables it reads; the Lambda entry's warm cache rebuilds the
            handlers when one of them changes, as for the core's.
    """

    name: str
    routes: Mapping[str, ExtensionRoute]
    bind: Callable[[ExtensionContext], BoundExtension]
    state_request: StateRequest | None = None
    environment: tuple[str, ...] = ()
