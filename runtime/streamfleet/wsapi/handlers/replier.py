"""Replies through the API Gateway Management API: ``post_to_connection`` at the API's own
regional endpoint, and :class:`ConnectionGone` when the client has left."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import boto3
from botocore.exceptions import ClientError

from ...lease.dynamo import error_code
from .config import BOTO_CONFIG


class ConnectionGone(Exception):
    """The connection no longer exists (HTTP 410 from the Management API)."""


class Replier(Protocol):
    """Delivers one message to one connection."""

    def post(self, request_context: Mapping[str, Any], connection_id: str, data: bytes) -> None:
        """Send ``data``; :class:`ConnectionGone` when the client has left."""


def management_endpoint(request_context: Mapping[str, Any], region: str) -> str:
    """The Management API endpoint for a request: the API's own regional endpoint.

    A request that arrived through a custom domain name (the failover name) must not be answered
    through it: the name follows the failover DNS and may resolve to the *other* region, whose
    API Gateway does not know this connection.
    """
    domain = str(request_context.get("domainName") or "")
    stage = str(request_context.get("stage") or "")
    api_id = str(request_context.get("apiId") or "")
    if domain.endswith(".amazonaws.com") or not api_id:
        return f"https://{domain}/{stage}"
    return f"https://{api_id}.execute-api.{region}.amazonaws.com/{stage}"


class ManagementApiReplier:
    """``apigatewaymanagementapi.post_to_connection`` with boto3, one client per endpoint."""

    def __init__(
        self,
        *,
        region: str,
        endpoint: str | None = None,
        client_factory: Callable[[str], Any] | None = None,
    ):
        self.region = region
        self.endpoint = endpoint
        self._factory = client_factory or self._new_client
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _new_client(self, endpoint: str) -> Any:
        return boto3.session.Session().client(
            "apigatewaymanagementapi",
            endpoint_url=endpoint,
            region_name=self.region,
            config=BOTO_CONFIG,
        )

    def client_for(self, request_context: Mapping[str, Any]) -> Any:
        """The boto3 client for this request's endpoint (created once, then reused)."""
        endpoint = self.endpoint or management_endpoint(request_context, self.region)
        with self._lock:
            client = self._clients.get(endpoint)
            if client is None:
                client = self._clients[endpoint] = self._factory(endpoint)
            return client

    def post(self, request_context: Mapping[str, Any], connection_id: str, data: bytes) -> None:
        try:
            self.client_for(request_context).post_to_connection(
                ConnectionId=connection_id, Data=data
            )
        except ClientError as exc:
            if error_code(exc) == "GoneException":
                raise ConnectionGone(connection_id) from None
            raise
