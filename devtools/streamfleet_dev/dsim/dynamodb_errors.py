"""The errors :class:`~streamfleet_dev.dsim.dynamodb_model.DynamoDBModel` answers with.

A refused request raises :class:`DynamoDBError` anywhere in the model (values, expressions,
tables); the model's ``call`` turns it into botocore's ``ClientError``, as DynamoDB's answer
reaches a boto3 caller.
"""

from __future__ import annotations

from typing import Any

VALIDATION = "ValidationException"
CONDITION_FAILED = "ConditionalCheckFailedException"
NOT_FOUND = "ResourceNotFoundException"
IN_USE = "ResourceInUseException"
UNKNOWN_OPERATION = "UnknownOperationException"


class DynamoDBError(Exception):
    """A request DynamoDB refuses: its error ``code`` and ``message``; ``item`` is the item a
    failed condition returns when ``ReturnValuesOnConditionCheckFailure`` is ``ALL_OLD``."""

    def __init__(self, code: str, message: str, item: dict[str, Any] | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.item = item


def invalid(message: str) -> DynamoDBError:
    """A ``ValidationException``: the request is malformed, whatever the table holds."""
    return DynamoDBError(VALIDATION, message)


def unsupported(what: str) -> DynamoDBError:
    """A ``ValidationException`` for something DynamoDB accepts that this model does not
    implement: refused by name, never answered wrongly."""
    return DynamoDBError(VALIDATION, f"DynamoDBModel does not support {what}")
