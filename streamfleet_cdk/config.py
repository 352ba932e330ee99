"""Deployment settings, read once from CDK context and validated before any construct exists.

Every setting has a context key (``streamfleet:<field>``), set in ``cdk.json`` or on the command
line (``cdk synth -c streamfleet:secondary_region=eu-west-1``). A bad value fails synth with a
``ValueError`` whose message starts with that key, instead of surfacing later as a CloudFormation
error about a Region or a table that does not exist.

``streamfleet:account`` is normally left unset: the CLI then supplies ``CDK_DEFAULT_ACCOUNT``
from the ambient credentials, and without credentials a placeholder account is used so that
``cdk synth`` (and the tests) work anywhere. Nothing can be deployed to the placeholder.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any, get_type_hints

from constructs import Node

from streamfleet import model

CONTEXT_PREFIX = "streamfleet:"

PLACEHOLDER_ACCOUNT = "111111111111"
DEFAULT_PRIMARY_REGION = "us-east-1"
DEFAULT_SECONDARY_REGION = "us-west-2"

ACCOUNT_PATTERN = re.compile(r"\d{12}")
REGION_PATTERN = re.compile(r"[a-z]{2}(-[a-z]+)+-\d")
# DynamoDB's own rule for table names.
TABLE_NAME_PATTERN = re.compile(r"[A-Za-z0-9_.\-]{3,255}")

_TRUE_WORDS = frozenset({"true", "yes", "1"})
_FALSE_WORDS = frozenset({"false", "no", "0"})


def context_key(field_name: str) -> str:
    """The CDK context key of an :class:`AppConfig` field: ``streamfleet:<field>``."""
    return f"{CONTEXT_PREFIX}{field_name}"


def _default_account(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get("CDK_DEFAULT_ACCOUNT") or PLACEHOLDER_ACCOUNT


@dataclass(frozen=True, kw_only=True)
class AppConfig:
    """Where and how the fleet is deployed.

    Attributes:
        account: the AWS account of both stacks (one account, two Regions).
        primary_region: Region whose stack declares the global tables.
        secondary_region: Region of the replica and of the standby stack.
        deletion_protection: DynamoDB deletion protection on both tables and every replica.
        lease_table_name: physical name of the lease table, shared by both Regions.
        messages_table_name: physical name of the messages table, shared by both Regions.
    """

    account: str = field(default_factory=_default_account)
    primary_region: str = DEFAULT_PRIMARY_REGION
    secondary_region: str = DEFAULT_SECONDARY_REGION
    deletion_protection: bool = True
    lease_table_name: str = model.DEFAULT_LEASE_TABLE_NAME
    messages_table_name: str = model.DEFAULT_MESSAGES_TABLE_NAME

    def __post_init__(self) -> None:
        _check_pattern("account", self.account, ACCOUNT_PATTERN, "12 digits")
        for name in ("primary_region", "secondary_region"):
            _check_pattern(name, getattr(self, name), REGION_PATTERN, "a Region like us-east-1")
        if self.primary_region == self.secondary_region:
            raise ValueError(
                f"{context_key('secondary_region')}: must differ from "
                f"{context_key('primary_region')} ({self.primary_region})"
            )
        if not isinstance(self.deletion_protection, bool):
            raise ValueError(f"{context_key('deletion_protection')}: expected true or false")
        for name in ("lease_table_name", "messages_table_name"):
            _check_pattern(
                name, getattr(self, name), TABLE_NAME_PATTERN, "3-255 of A-Z a-z 0-9 _ . -"
            )
        if self.lease_table_name == self.messages_table_name:
            raise ValueError(
                f"{context_key('messages_table_name')}: must differ from "
                f"{context_key('lease_table_name')} ({self.lease_table_name})"
            )

    @property
    def replica_regions(self) -> tuple[str, ...]:
        """Regions that hold a replica of the tables declared in the primary Region."""
        return (self.secondary_region,)

    @classmethod
    def from_context(cls, app_node: Node, *, environ: Mapping[str, str] | None = None) -> AppConfig:
        """Read every ``streamfleet:<field>`` context key; unset (or null) keys keep defaults.

        ``environ`` (default :data:`os.environ`) supplies ``CDK_DEFAULT_ACCOUNT`` when
        ``streamfleet:account`` is unset. Values given with ``-c`` arrive as strings, values
        from ``cdk.json`` as JSON types; booleans accept both (``true``/``false``).
        """
        types = get_type_hints(cls)
        values: dict[str, Any] = {}
        for spec in fields(cls):
            raw = app_node.try_get_context(context_key(spec.name))
            if raw is None:
                continue
            if types[spec.name] is bool:
                values[spec.name] = _parse_bool(spec.name, raw)
            else:
                values[spec.name] = _require_str(spec.name, raw)
        if "account" not in values:
            values["account"] = _default_account(os.environ if environ is None else environ)
        return cls(**values)


def _require_str(name: str, value: object) -> str:
    # A number in cdk.json would lose an account's leading zeros: insist on a string.
    if not isinstance(value, str):
        raise ValueError(f"{context_key(name)}: expected a string, got {type(value).__name__}")
    return value


def _parse_bool(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        word = value.strip().lower()
        if word in _TRUE_WORDS:
            return True
        if word in _FALSE_WORDS:
            return False
    raise ValueError(f"{context_key(name)}: expected true or false, got {value!r}")


def _check_pattern(name: str, value: object, pattern: re.Pattern[str], expected: str) -> None:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise ValueError(f"{context_key(name)}: expected {expected}, got {value!r}")
