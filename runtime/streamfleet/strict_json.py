"""JSON as the edges accept it: no duplicated member, no NaN or Infinity.

Parsers disagree on which value of a duplicated member wins, so a message that names one twice
means different things to different readers; it is refused instead.
"""

from __future__ import annotations

import json
from typing import Any


class DuplicateMember(Exception):
    """An object names ``member`` more than once."""

    def __init__(self, member: str):
        super().__init__(member)
        self.member = member


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise DuplicateMember(key)
        result[key] = value
    return result


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN, Infinity: Python-only extensions


def loads(text: str) -> Any:
    """Parse strictly. Raises :class:`DuplicateMember`, ``ValueError`` (not JSON) or
    ``RecursionError`` (absurdly deep nesting)."""
    return json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


def json_type(value: object) -> str:
    """The JSON name of a parsed value's type, for error messages."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, dict):
        return "object"
    if isinstance(value, list):
        return "array"
    return "string" if isinstance(value, str) else "null"
