"""What the in-process DynamoDB stores (the model and moto's reference) share: boto3-style calls
and tables created as the synthesized templates declare them, both over ``call``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class StoreCalls:
    """``store.put_item(**params)`` as a boto3 client is called, and ``create_table``; a
    subclass answers ``call(operation, params)``."""

    def call(self, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def __getattr__(self, operation: str) -> Callable[..., dict[str, Any]]:
        if operation.startswith("_"):
            raise AttributeError(operation)
        return lambda **params: self.call(operation, params)

    def create_table(self, table: Any, table_name: str) -> None:
        """``table_name`` as the synthesized template declares ``table`` (a model spec or a
        definition from the assembly), its TTL included."""
        from streamfleet_dev.tables import create_table_request, table_definition

        self.call("create_table", create_table_request(table, table_name))
        ttl = table_definition(table).ttl_attribute
        if ttl:
            self.call(
                "update_time_to_live",
                {
                    "TableName": table_name,
                    "TimeToLiveSpecification": {"Enabled": True, "AttributeName": ttl},
                },
            )
