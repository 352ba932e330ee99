"""Client library for the WebSocket API: a reconnecting client with application heartbeats.

Depends on ``websockets`` only (and on :mod:`streamfleet.model` for the wire protocol's names and
:mod:`streamfleet.backoff` for its retry pacing), so applications can use it without boto3.
"""

# Under the client's own name, so that applications can pace their retries as the client does.
from ..backoff import full_jitter as backoff_delay
from .reconnecting import (
    AuthorizationFailed,
    ClientClosed,
    ClientConfig,
    ClientStatus,
    ConnectionLost,
    Endpoint,
    FrameTooLarge,
    NotConnected,
    ReconnectingClient,
    SubscriptionRefused,
    TokenTransport,
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
    "Skip",
    "StreamCursor",
    "StreamMessage",
    "StreamPosition",
    "SubscriptionRefused",
    "TokenTransport",
    "backoff_delay",
]
