"""Client library for the WebSocket API: a reconnecting client with application heartbeats.

Depends on ``websockets`` only (and on the runtime's :mod:`streamfleet.model` for the wire
protocol's names, :mod:`streamfleet.wsapi.handshake` for how a connection is opened and
:mod:`streamfleet.backoff` for its retry pacing), so applications can use it without boto3. It is
not part of what is deployed: no Lambda and not the worker image import it.
"""

# Under the client's own name, so that applications can pace their retries as the client does.
from streamfleet.backoff import full_jitter as backoff_delay
from streamfleet.wsapi.handshake import Endpoint, TokenTransport

from .reconnecting import (
    AuthorizationFailed,
    ClientClosed,
    ClientConfig,
    ClientStatus,
    ConnectionLost,
    FrameTooLarge,
    NotConnected,
    ReconnectingClient,
    SendQueueFull,
    SubscriptionRefused,
)
from .streams import EpochChange, Skip, StreamCursor, StreamMessage, StreamPosition

__all__ = [
    "AuthorizationFailed",
    "ClientClosed",
    "ClientConfig",
    "ClientStatus",
    "ConnectionLost",
    "Endpoint",
    "EpochChange",
    "FrameTooLarge",
    "NotConnected",
    "ReconnectingClient",
    "SendQueueFull",
    "Skip",
    "StreamCursor",
    "StreamMessage",
    "StreamPosition",
    "SubscriptionRefused",
    "TokenTransport",
    "backoff_delay",
]
