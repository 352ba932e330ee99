"""A connection and who holds it: ``$connect`` records it under its verified user,
``$disconnect`` (or a reply to a client that left) forgets it and its subscriptions; and what
API Gateway's event says of the connection and of the principal its authorizer verified."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from ... import model, readers
from ...clock import Clock
from ...lease.dynamo import from_item, to_attr
from ...logs import log_event
from .config import HandlerConfig
from .messages import NotAuthorized

# The package's logger: the handlers' log lines keep one name whichever module writes them.
logger = logging.getLogger(__package__)


class Connections:
    """The connections table's records (and, with live delivery, each connection's list of
    subscribed streams)."""

    def __init__(self, config: HandlerConfig, dynamodb: Any, clock: Clock):
        self.config = config
        self.dynamodb = dynamodb
        self.clock = clock

    def on_connect(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Record the connection under its verified user; select the application subprotocol."""
        request_context = event.get("requestContext") or {}
        user_id = authorized_sub_of(request_context)
        connection_id = connection_id_of(event)
        if user_id is None:
            # No authorizer in front of $connect: a deployment error, never let it through.
            log_event(
                logger,
                logging.ERROR,
                "wsapi_connect",
                decision="refuse",
                reason="no_authorizer_context",
                connectionId=connection_id,
            )
            return {"statusCode": 401}
        response: dict[str, Any] = {"statusCode": 200}
        if model.WS_APP_SUBPROTOCOL in offered_subprotocols_of(event):
            response["headers"] = {"Sec-WebSocket-Protocol": model.WS_APP_SUBPROTOCOL}
        kind = principal_kind_of(request_context)
        log_event(
            logger,
            logging.INFO,
            "wsapi_connect",
            decision="accept",
            principalKind=kind,
            sub=user_id,
            connectionId=connection_id,
        )
        # The canary's connection is recorded as every user's: a Region whose state store cannot
        # be written refuses the canary's handshake as it refuses its users'.
        now_ms = self.clock.wall_ms()
        self.dynamodb.put_item(
            TableName=self.config.connections_table,
            Item={
                model.PK: to_attr(model.ws_connection_pk(connection_id)),
                model.WS_USER_ID: to_attr(user_id),
                model.WS_CONNECTED_AT_MS: to_attr(now_ms),
                model.WS_REGION: to_attr(self.config.region),
                model.WS_EXPIRES_AT: to_attr(now_ms // 1000 + self.config.connection_ttl_seconds),
            },
        )
        return response

    def on_disconnect(self, event: Mapping[str, Any]) -> dict[str, Any]:
        """Delete the connection record and its subscriptions (best effort, like
        ``$disconnect`` itself; the subscriptions' TTL removes what a lost one leaves)."""
        self.forget(connection_id_of(event))
        return {"statusCode": 200}

    def forget(self, connection_id: str) -> None:
        """Delete the connection's record and its subscriptions (a client that left)."""
        self.dynamodb.delete_item(
            TableName=self.config.connections_table,
            Key={model.PK: to_attr(model.ws_connection_pk(connection_id))},
        )
        live = self.config.live
        if live is None:
            return
        old = self.dynamodb.delete_item(
            TableName=live.subscriptions_table,
            Key={k: to_attr(v) for k, v in model.connection_streams_key(connection_id).items()},
            ReturnValues="ALL_OLD",
        ).get("Attributes")
        streams = sorted((from_item(old) or {}).get(model.WS_STREAMS) or ())
        requests = [
            {
                "DeleteRequest": {
                    "Key": {
                        model.PK: to_attr(model.stream_subscribers_pk(stream)),
                        model.SUB_CONNECTION: to_attr(connection_id),
                    }
                }
            }
            for stream in streams
        ]
        for start in range(0, len(requests), 25):
            pending = requests[start : start + 25]
            for _ in range(3):  # unprocessed items: retried twice, then left to the TTL
                response = self.dynamodb.batch_write_item(
                    RequestItems={live.subscriptions_table: pending}
                )
                pending = response.get("UnprocessedItems", {}).get(live.subscriptions_table)
                if not pending:
                    break

    def read(self, connection_id: str) -> dict[str, Any]:
        """The connection's record as ``$connect`` wrote it (consistent; ``{}``: none)."""
        return (
            from_item(
                self.dynamodb.get_item(
                    TableName=self.config.connections_table,
                    Key={model.PK: to_attr(model.ws_connection_pk(connection_id))},
                    ConsistentRead=True,
                ).get("Item")
            )
            or {}
        )

    def user_of(self, request_context: Mapping[str, Any], connection_id: str) -> str:
        """The verified user of a connection: from the authorizer context API Gateway passes
        with every message, else from the connection record written at ``$connect``."""
        user_id = authorized_sub_of(request_context)
        if user_id is not None:
            return user_id
        item = self.read(connection_id)
        if not isinstance(item.get(model.WS_USER_ID), str):
            raise NotAuthorized("no verified user for this connection; reconnect")
        return item[model.WS_USER_ID]


def connection_id_of(event: Mapping[str, Any]) -> str:
    return str((event.get("requestContext") or {}).get("connectionId") or "")


def authorized_sub_of(request_context: Mapping[str, Any]) -> str | None:
    authorizer = request_context.get("authorizer") or {}
    sub = authorizer.get(model.WS_CONTEXT_SUB) or authorizer.get("principalId")
    return sub if isinstance(sub, str) and sub else None


def token_expires_at_of(request_context: Mapping[str, Any]) -> int | None:
    """When the connection's token expires (epoch seconds), as the authorizer passed it on;
    ``None`` for a connection authorized before it did."""
    value = (request_context.get("authorizer") or {}).get(model.WS_CONTEXT_TOKEN_EXPIRES_AT)
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def reader_tags_of(request_context: Mapping[str, Any], user_id: str) -> list[str]:
    """The connection's reader tags: its verified ``sub`` and the claim tags the authorizer
    passed on (:mod:`streamfleet.readers`)."""
    authorizer = request_context.get("authorizer") or {}
    return [
        readers.user_tag(user_id),
        *readers.decode_tags(authorizer.get(model.WS_CONTEXT_READER_TAGS)),
    ]


def principal_kind_of(request_context: Mapping[str, Any]) -> str:
    """``canary`` for the canary's identity, else ``user``. A principal whose id carries the
    canary prefix counts as the canary even if the kind is missing (fail closed)."""
    authorizer = request_context.get("authorizer") or {}
    kind = authorizer.get(model.WS_CONTEXT_PRINCIPAL_KIND)
    sub = authorized_sub_of(request_context) or ""
    if kind == model.WS_PRINCIPAL_CANARY or sub.startswith(model.CANARY_PRINCIPAL_PREFIX):
        return model.WS_PRINCIPAL_CANARY
    return model.WS_PRINCIPAL_USER


def offered_subprotocols_of(event: Mapping[str, Any]) -> list[str]:
    headers = event.get("headers") or {}
    values = [v for k, v in headers.items() if k.lower() == "sec-websocket-protocol" and v]
    return [entry.strip() for value in values for entry in str(value).split(",")]
