"""Live delivery's routes: ``subscribe`` (the reader checked, the connection registered as a
subscriber, then the stored messages replayed) and ``unsubscribe``."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from ... import model, readers
from ...clock import Clock
from ...lease.dynamo import from_item, is_condition_failure, names, to_attr
from ...logs import log_event
from ..delivery import (
    SOURCE_REPLAY,
    StoredMessage,
    hole_is_unfillable,
    message_from_item,
    pack_frames,
)
from .config import HandlerConfig, LiveTables
from .messages import BadMessage, Refused, Subscribe
from .state_store import StateStore, StateWriteConflict

# The package's logger: the handlers' log lines keep one name whichever module writes them.
logger = logging.getLogger(__package__)

# The data one subscribe reads and posts at most, whatever the messages' sizes (at least one
# message): about 35 frames of 32 KB, well within the handler's memory and time; the reply's
# `more` sends the client back for the rest.
REPLAY_MAX_BYTES = 1024 * 1024
QUERY_PAGE_ITEMS = 1000


class Subscriptions:
    """A connection's subscriptions to live streams, and the user's list of them."""

    def __init__(self, config: HandlerConfig, dynamodb: Any, state: StateStore, clock: Clock):
        self.config = config
        self.dynamodb = dynamodb
        self.state = state
        self.clock = clock

    def _live(self) -> LiveTables:
        if self.config.live is None:
            raise Refused(
                "not_supported",
                "stream",
                "live delivery is not configured on this API (STREAMS_TABLE_NAME, "
                "MESSAGES_TABLE_NAME, SUBSCRIPTIONS_TABLE_NAME)",
            )
        return self.config.live

    def subscribe(
        self,
        user_id: str,
        tags: list[str],
        connection_id: str,
        message: Subscribe,
        *,
        token_expires_at: int | None = None,
    ) -> tuple[dict[str, Any], list[bytes]]:
        """Check the reader, register the subscriber, read the replay: the ``subscribed``
        reply and the ``messages`` frames to post after it, in this order."""
        live = self._live()
        stream = message.stream
        try:
            row = self._readable_row(live, stream, tags)
        except Refused:
            # A stream the user may no longer read leaves their subscriptions too: a reconnect
            # (which resubscribes what getState lists) must not ask for it again and again.
            with contextlib.suppress(BotoCoreError, ClientError, StateWriteConflict):
                pk = model.user_subscriptions_pk(user_id)
                listed = (self.state.read(pk) or {}).get(model.WS_STREAMS) or ()
                if stream in listed:
                    self.state.write(pk, sets={}, deletes={model.WS_STREAMS: {stream}})
            raise
        now_ms = self.clock.wall_ms()
        self._check_audience(live, stream, user_id, connection_id)
        self._add_connection_stream(live, connection_id, stream, now_ms)
        # Registered BEFORE the replay is read: a message stored after the read below reaches
        # the fan-out, whose (consistent) query of this table then sees this subscriber.
        subscription = {
            model.PK: to_attr(model.stream_subscribers_pk(stream)),
            model.SUB_CONNECTION: to_attr(connection_id),
            model.SUB_USER_ID: to_attr(user_id),
            model.SUB_SUBSCRIBED_AT_MS: to_attr(now_ms),
            model.SUB_EXPIRES_AT: to_attr(now_ms // 1000 + self.config.connection_ttl_seconds),
            # What the fan-out checks at every delivery against the stream's readers then (with
            # the user tag, which it takes from the user id, never from a list).
            model.SUB_READER_TAGS: to_attr(readers.encode_tags(readers.claim_tags_only(tags))),
        }
        if token_expires_at is not None:
            subscription[model.SUB_TOKEN_EXPIRES_AT] = to_attr(token_expires_at)
        self.dynamodb.put_item(TableName=live.subscriptions_table, Item=subscription)
        try:
            self.state.write(
                model.user_subscriptions_pk(user_id), sets={}, adds={model.WS_STREAMS: {stream}}
            )
        except (BotoCoreError, ClientError, StateWriteConflict) as exc:
            # This connection is subscribed; only a later reload would not be told about it.
            logger.warning("wsapi user subscriptions update failed: %s", exc)
        origin = row.get(model.ORIGIN_SEQ)
        after = message.after
        skipped = 0
        more = False
        if after is None:
            messages = self._newest(live, stream)
            after = messages[0].seq - 1 if messages else origin
        else:
            if origin is not None and after < origin:
                after = int(origin)  # nothing at or below the origin was ever stored
            messages, more = self._replay(live, stream, after)
            first = messages[0] if messages else None
            # A hole right after `after` is skipped only once nothing can fill it any more;
            # one that may still be filled (a batch still landing, a fleet scaled to zero, a
            # Region behind) is waited for, however old its neighbours.
            if (
                first is not None
                and first.seq > after + 1
                and hole_is_unfillable(after, messages, now_ms)
            ):
                if model.epoch_of(first.seq) == model.epoch_of(after):
                    skipped = first.seq - 1 - after
                # else the log went on in a newer epoch: the reply's afterEpoch says so
                after = first.seq - 1
        if not message.knows_epochs:
            newest = self._newest_position(live, stream)
            if newest is not None and model.epoch_of(newest) > 0:
                # This connection only: the user's other clients may follow the stream.
                self._stop_delivery(connection_id, stream)
                raise BadMessage(
                    "afterEpoch",
                    f"required: the stream went on in epoch {model.epoch_of(newest)} (its"
                    " upstream restarted its numbering), which a client that sends no"
                    " afterEpoch cannot follow",
                    message.request_id,
                )
        self._check_readers_after_replay(live, user_id, connection_id, stream, tags)
        self._check_token_after_replay(connection_id, stream, token_expires_at)
        up_to = messages[-1].seq if messages else after
        reply: dict[str, Any] = {
            "type": model.WS_REPLY_SUBSCRIBED,
            "stream": stream,
            **_wire_position("after", after),
            "replayed": len(messages),
            **_wire_position("upTo", up_to),
            "more": more,
        }
        if skipped:
            reply["skipped"] = skipped
        frames = pack_frames(stream, messages, region=self.config.region, source=SOURCE_REPLAY)
        log_event(
            logger,
            logging.INFO,
            "wsapi_subscribe",
            decision="accept",
            sub=user_id,
            stream=stream,
            connectionId=connection_id,
            after=after,
            replayed=len(messages),
            frames=len(frames),
            more=more,
        )
        return reply, frames

    def _check_audience(
        self, live: LiveTables, stream: str, user_id: str, connection_id: str
    ) -> None:
        """Refuse a new subscriber past the stream's bounds (every message costs the fan-out a
        post per subscriber, and its batch waits for all of them). A connection already
        subscribed counts once. Checked here, so concurrent subscribes may pass it by their
        number."""
        params: dict[str, Any] = {
            "TableName": live.subscriptions_table,
            "KeyConditionExpression": "#pk = :pk",
            "ExpressionAttributeNames": {
                "#pk": model.PK,
                "#c": model.SUB_CONNECTION,
                "#u": model.SUB_USER_ID,
            },
            "ExpressionAttributeValues": {":pk": to_attr(model.stream_subscribers_pk(stream))},
            "ProjectionExpression": "#c, #u",
            "ConsistentRead": True,
        }
        total = mine = 0
        while True:
            response = self.dynamodb.query(**params)
            for item in response.get("Items", []):
                if item[model.SUB_CONNECTION]["S"] == connection_id:
                    return
                total += 1
                mine += item.get(model.SUB_USER_ID, {}).get("S") == user_id
            if "LastEvaluatedKey" not in response:
                break
            params["ExclusiveStartKey"] = response["LastEvaluatedKey"]
        if total >= live.max_subscribers:
            raise Refused(
                "too_many_subscribers",
                "stream",
                f"stream: {stream!r} has {total} subscribers here, its most; try later",
            )
        if mine >= live.max_user_connections:
            raise Refused(
                "too_many_connections",
                "stream",
                f"stream: you read {stream!r} on {mine} connections, the most for one user",
            )

    def _check_readers_after_replay(
        self, live: LiveTables, user_id: str, connection_id: str, stream: str, tags: list[str]
    ) -> None:
        """The replay may hold messages stored after a START that changed the readers in the
        meantime: they are read again, so nothing stored after that START was answered is
        served to a reader it excluded."""
        try:
            self._readable_row(live, stream, tags)
        except Refused:
            self.unsubscribe(user_id, connection_id, stream)
            raise

    def _check_token_after_replay(
        self, connection_id: str, stream: str, token_expires_at: int | None
    ) -> None:
        """A token that ended while the replay was read, which may hold messages stored after
        it, gets none of them on this connection (the fan-out stops its live delivery the same
        way): the client reconnects with a fresh token and subscribes again."""
        if token_expires_at is not None and token_expires_at <= self.clock.wall_ms() // 1000:
            self._stop_delivery(connection_id, stream)
            raise Refused("token_expired", "token", "token: expired; reconnect with a fresh one")

    def _readable_row(self, live: LiveTables, stream: str, tags: list[str]) -> dict[str, Any]:
        """The stream's row (readers, origin), read consistently; ``forbidden`` unless ``tags``
        may read it."""
        row = from_item(
            self.dynamodb.get_item(
                TableName=live.streams_table,
                Key={model.PK: to_attr(model.connection_pk(stream))},
                ProjectionExpression="#readers, #origin",
                ExpressionAttributeNames={"#readers": model.READERS, "#origin": model.ORIGIN_SEQ},
                ConsistentRead=True,
            ).get("Item")
        )
        if row is None or not readers.may_read(row.get(model.READERS), tags):
            # The same answer whether the stream exists or not: no probing for stream ids.
            raise Refused(
                "forbidden",
                "stream",
                f"stream: {stream!r} does not exist or you are not one of its readers",
            )
        return row

    def _add_connection_stream(
        self, live: LiveTables, connection_id: str, stream: str, now_ms: int
    ) -> None:
        """List ``stream`` among the connection's (``$disconnect`` removes its subscriptions
        from there), within :data:`~streamfleet.model.MAX_SUBSCRIPTIONS_PER_CONNECTION`."""
        try:
            self.dynamodb.update_item(
                TableName=live.subscriptions_table,
                Key={k: to_attr(v) for k, v in model.connection_streams_key(connection_id).items()},
                UpdateExpression="ADD #streams :stream SET #expires_at = :expires",
                ConditionExpression="attribute_not_exists(#streams) OR size(#streams) < :max "
                "OR contains(#streams, :one)",
                ExpressionAttributeNames=names(model.WS_STREAMS, model.SUB_EXPIRES_AT),
                ExpressionAttributeValues={
                    ":stream": to_attr({stream}),
                    ":one": to_attr(stream),
                    ":max": to_attr(model.MAX_SUBSCRIPTIONS_PER_CONNECTION),
                    ":expires": to_attr(now_ms // 1000 + self.config.connection_ttl_seconds),
                },
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise
            raise BadMessage(
                "stream",
                f"at most {model.MAX_SUBSCRIPTIONS_PER_CONNECTION} subscriptions per connection",
            ) from None

    def _query(self, table: str, stream: str, **params: Any):
        """Pages of a stream's stored messages (consistent reads)."""
        condition = params["KeyConditionExpression"]
        request: dict[str, Any] = {
            "TableName": table,
            "ExpressionAttributeNames": {
                key: name
                for key, name in (("#pk", model.PK), ("#seq", model.SEQ))
                if key in condition
            },
            "ConsistentRead": True,
            **params,
        }
        request["ExpressionAttributeValues"] = {
            ":pk": to_attr(model.connection_pk(stream)),
            **params.get("ExpressionAttributeValues", {}),
        }
        while True:
            response = self.dynamodb.query(**request)
            yield [message_from_item(from_item(raw) or {}) for raw in response.get("Items", [])]
            last = response.get("LastEvaluatedKey")
            if not last:
                return
            request["ExclusiveStartKey"] = last

    def _newest_position(self, live: LiveTables, stream: str) -> int | None:
        """The position of the newest message stored for ``stream`` (``None``: none)."""
        newest = next(
            self._query(
                live.messages_table,
                stream,
                KeyConditionExpression="#pk = :pk",
                ScanIndexForward=False,
                Limit=1,
            )
        )
        return newest[0].seq if newest else None

    def _newest(self, live: LiveTables, stream: str) -> list[StoredMessage]:
        """The newest messages: up to ``newest`` of them and ``REPLAY_MAX_BYTES`` of data."""
        pages = self._query(
            live.messages_table,
            stream,
            KeyConditionExpression="#pk = :pk",
            ScanIndexForward=False,
            Limit=live.newest,
        )
        newest_first, _ = _within_budget(next(pages), REPLAY_MAX_BYTES)
        return sorted(newest_first)

    def _replay(
        self, live: LiveTables, stream: str, after: int
    ) -> tuple[list[StoredMessage], bool]:
        """Messages after ``after``, ascending, up to ``replay_max`` of them and
        ``REPLAY_MAX_BYTES`` of data (at least one); whether more may follow."""
        messages: list[StoredMessage] = []
        pages = self._query(
            live.messages_table,
            stream,
            KeyConditionExpression="#pk = :pk AND #seq > :after",
            ExpressionAttributeValues={":after": to_attr(after)},
            Limit=min(QUERY_PAGE_ITEMS, live.replay_max),
        )
        budget = REPLAY_MAX_BYTES
        for page in pages:
            kept, cut = _within_budget(
                page[: live.replay_max - len(messages)], budget, at_least_one=not messages
            )
            messages += kept
            budget -= sum(message.data_bytes for message in kept)
            if cut or len(messages) >= live.replay_max or budget <= 0:
                return messages, True
        return messages, False

    def unsubscribe(self, user_id: str, connection_id: str, stream: str) -> dict[str, Any]:
        """Stop this connection's delivery of ``stream`` and forget the user's subscription."""
        self._stop_delivery(connection_id, stream)
        self.state.write(
            model.user_subscriptions_pk(user_id), sets={}, deletes={model.WS_STREAMS: {stream}}
        )
        return {"type": model.WS_REPLY_UNSUBSCRIBED, "stream": stream}

    def _stop_delivery(self, connection_id: str, stream: str) -> None:
        """Stop this connection's delivery of ``stream`` (the user's subscriptions stay)."""
        live = self._live()
        self.dynamodb.delete_item(
            TableName=live.subscriptions_table,
            Key={
                model.PK: to_attr(model.stream_subscribers_pk(stream)),
                model.SUB_CONNECTION: to_attr(connection_id),
            },
        )
        try:
            self.dynamodb.update_item(
                TableName=live.subscriptions_table,
                Key={k: to_attr(v) for k, v in model.connection_streams_key(connection_id).items()},
                UpdateExpression="DELETE #streams :stream",
                ConditionExpression="attribute_exists(#pk)",  # never create an empty item
                ExpressionAttributeNames=names(model.PK, model.WS_STREAMS),
                ExpressionAttributeValues={":stream": to_attr({stream})},
            )
        except ClientError as exc:
            if not is_condition_failure(exc):
                raise


def _wire_position(name: str, position: int | None) -> dict[str, int | None]:
    """A log position as the wire carries it: ``{name: seq, name + "Epoch": epoch}``."""
    if position is None:
        return {name: None, f"{name}Epoch": None}
    return {name: model.seq_of(position), f"{name}Epoch": model.epoch_of(position)}


def _within_budget(
    messages: list[StoredMessage], budget: int, *, at_least_one: bool = True
) -> tuple[list[StoredMessage], bool]:
    """The leading ``messages`` whose data fits in ``budget`` bytes (with ``at_least_one``, the
    first one whatever its size, so that every subscribe makes progress), and whether any was
    left out."""
    kept: list[StoredMessage] = []
    for message in messages:
        if (kept or not at_least_one) and message.data_bytes > budget:
            return kept, True
        kept.append(message)
        budget -= message.data_bytes
    return kept, False
