"""Client library for the WebSocket API: a reconnecting client with application heartbeats.

Depends on ``websockets`` only (and on :mod:`streamfleet.model` for the wire protocol's names), so
applications can use it without boto3.
"""

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
    backoff_delay,
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
