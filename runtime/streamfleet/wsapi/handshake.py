"""How a client opens a connection to the WebSocket API: the URL and subprotocols of one attempt.

The token travels as the subprotocol ``bearer.<jwt>`` next to the application protocol
``streamfleet.v1`` by default (kept out of URLs and therefore out of access logs), or as
``?token=<jwt>``. Clients and the canary share this, so the canary dials exactly as users do.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .. import model


class TokenTransport(StrEnum):
    """Where the token goes in the handshake."""

    SUBPROTOCOL = "subprotocol"  # Sec-WebSocket-Protocol: streamfleet.v1, bearer.<jwt>
    QUERY = "query"  # ?token=<jwt>


@dataclass(frozen=True)
class Endpoint:
    """Where to connect for one attempt, and with which token."""

    url: str
    token: str | None = None
    transport: TokenTransport = TokenTransport.SUBPROTOCOL

    def handshake(self) -> tuple[str, list[str]]:
        """The URL to dial and the subprotocols to offer."""
        protocols = [model.WS_APP_SUBPROTOCOL]
        if self.token is None:
            return self.url, protocols
        if self.transport is TokenTransport.SUBPROTOCOL:
            return self.url, [*protocols, model.WS_BEARER_SUBPROTOCOL_PREFIX + self.token]
        parts = urlsplit(self.url)
        query = [
            (k, v)
            for k, v in parse_qsl(parts.query, keep_blank_values=True)
            if k != model.WS_TOKEN_QUERY_PARAMETER
        ]
        query.append((model.WS_TOKEN_QUERY_PARAMETER, self.token))
        return urlunsplit(parts._replace(query=urlencode(query))), protocols
