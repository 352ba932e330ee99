"""A Region's DynamoDB endpoint that can be made unreachable on demand.

Wraps a synchronous boto3 client: while :attr:`StoreSwitch.down` is set, every call fails as a
connection to an endpoint that does not answer fails (``EndpointConnectionError``), without
touching the tables. Whoever calls that Region's store through the switch sees the outage: its
own handlers and the other Region's handlers that write to it (the auctions' home).
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import EndpointConnectionError


class StoreSwitch:
    """A boto3 DynamoDB client that fails every call while ``down``."""

    def __init__(self, client: Any, region: str):
        self._client = client
        self.region = region
        self.down = False
        self.refused = 0  # calls failed while down

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.down:
                self.refused += 1
                raise EndpointConnectionError(
                    endpoint_url=f"https://dynamodb.{self.region}.amazonaws.com"
                )
            return attribute(*args, **kwargs)

        return call
