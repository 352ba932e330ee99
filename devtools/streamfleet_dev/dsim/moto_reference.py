"""DynamoDB in process through moto's own request handlers, called directly, without HTTP or
botocore: the reference the simulations' store (:mod:`.dynamodb_model`) is compared with.

:class:`MotoDynamoDB` answers the data-plane calls the runtime makes (``put_item``,
``update_item``, ``query``, ``batch_write_item``...) with the parameters botocore takes, which
are exactly the JSON body DynamoDB's protocol sends, and evaluates key, condition, update and
filter expressions with moto's parser: the same evaluator as the moto server the conformance
tests run against, without the server's threads. Errors come back as botocore's
``ClientError`` with DynamoDB's code (``ConditionalCheckFailedException`` with the item when
``ReturnValuesOnConditionCheckFailure`` asks for it), as the runtime's error handling expects.

Each instance has an account of its own, so simulations that run one after another (or side by
side) never see each other's tables; :meth:`MotoDynamoDB.close` drops it.

It is several milliseconds a request (moto parses every expression again), too slow to run the
simulations on; the differential tests and the store's benchmark run it beside the model.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from botocore.exceptions import ClientError
from moto.core.exceptions import JsonRESTError
from moto.dynamodb.models import dynamodb_backends
from moto.dynamodb.responses import DynamoHandler

from streamfleet_dev.dsim.store_calls import StoreCalls

_ACCOUNTS = itertools.count(900_000_000_000)
_ACCOUNTS_LOCK = threading.Lock()


class MotoDynamoDB(StoreCalls):
    """One DynamoDB "Region" of its own, answered synchronously in the caller's thread."""

    def __init__(self, region: str = "us-east-1"):
        with _ACCOUNTS_LOCK:
            self.account = str(next(_ACCOUNTS))
        self.region = region
        self.meta = SimpleNamespace(endpoint_url=f"inprocess://dynamodb/{self.account}")
        self._handler = DynamoHandler()
        self._handler.current_account = self.account
        self._handler.region = region

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """``operation`` (botocore's snake_case name) with ``params``; the answer, or
        ``ClientError`` as DynamoDB would raise it."""
        method = getattr(self._handler, operation, None)
        if method is None or operation.startswith("_"):
            raise ValueError(f"{operation}: not a DynamoDB operation moto answers")
        # The handler reads its request from ``body`` and may keep references into it.
        self._handler.body = copy.deepcopy(params)
        try:
            result = method()
        except JsonRESTError as exc:
            raise _client_error(operation, exc) from None
        except Exception as exc:  # moto's server answers these with a 500: retryable
            error = {"Code": "InternalServerError", "Message": f"{type(exc).__name__}: {exc}"}
            raise ClientError(
                {"Error": error, "ResponseMetadata": {"HTTPStatusCode": 500}},
                _operation_name(operation),
            ) from None
        answer = getattr(result, "_result", result)
        if isinstance(answer, (str, bytes)):
            answer = json.loads(answer) if answer else {}
        return copy.deepcopy(answer)

    def stream_records(self, table_name: str) -> Callable[[], list[dict[str, Any]]]:
        """A reader of ``table_name``'s change stream: every record so far, in order, as
        Lambda's event source hands them to a function.

        As DynamoDB Streams, and unlike moto, no record for a write that left its item as it
        was (a put of the same item again). Moto's random event ids and wall-clock creation
        times are replaced, so that a simulation's records are the same on every run."""
        table = dynamodb_backends[self.account][self.region].get_table(table_name)
        converted: list[dict[str, Any]] = []
        images: dict[str, Any] = {}  # by key: the item as the stream last showed it
        read = 0

        def records() -> list[dict[str, Any]]:
            nonlocal read
            shard = table.stream_shard
            held = shard.items if shard is not None else []
            for record in held[read:]:
                read += 1
                lambda_record = copy.deepcopy(record.to_json())
                change = lambda_record["dynamodb"]
                key = json.dumps(change["Keys"], sort_keys=True)
                image = change.get("NewImage")
                if lambda_record["eventName"] == "MODIFY" and images.get(key) == image:
                    continue
                images[key] = image
                lambda_record["eventID"] = str(len(converted))
                lambda_record["awsRegion"] = self.region
                change.pop("ApproximateCreationDateTime", None)
                converted.append(lambda_record)
            return converted

        return records

    def close(self) -> None:
        """Forget every table of this instance."""
        backends = dynamodb_backends[self.account]
        if self.region in backends:
            backends[self.region].reset()


def _client_error(operation: str, exc: JsonRESTError) -> ClientError:
    body = json.loads(exc.get_body() or "{}")
    code = str(exc.error_type).rsplit("#", 1)[-1]
    response: dict[str, Any] = {
        "Error": {"Code": code, "Message": body.get("message") or body.get("Message", "")},
        "ResponseMetadata": {"HTTPStatusCode": exc.code},
    }
    if "Item" in body:
        response["Item"] = body["Item"]
    if "CancellationReasons" in body:
        response["CancellationReasons"] = body["CancellationReasons"]
    return ClientError(response, _operation_name(operation))


def _operation_name(operation: str) -> str:
    return "".join(part.capitalize() for part in operation.split("_"))
