"""DynamoDB's typed attribute values as the wire JSON carries them (``{"S": "x"}``, ``{"N": "5"}``):
validation, copies, equality, ordering, sizes and number arithmetic.

What holds for a value that :func:`import_value` returned (every value the model stores):

* it is well formed (one known type; numbers within DynamoDB's 38 digits and range; sets not
  empty and without duplicates; ``NULL`` true) and shares nothing with the request it came from;
* its set elements are sorted (strings by code point, which is UTF-8 byte order; numbers by
  value; binaries by bytes), so an answer never depends on the order a client listed them in
  (DynamoDB's sets are unordered; boto3 serializes a Python set in hash order);
* numbers keep the text they were given (``"5.0"`` stays ``"5.0"``) but compare by value.

Stored values are never modified in place (an update builds new containers), so one value may
be shared by several items or records; whatever leaves the model is a copy (:func:`copy_value`).
"""

from __future__ import annotations

import base64
import decimal
import functools
import re
from decimal import Decimal
from typing import Any

from streamfleet_dev.dsim.dynamodb_errors import invalid

TYPES = ("S", "N", "B", "SS", "NS", "BS", "M", "L", "NULL", "BOOL")
SCALAR_TYPES = frozenset(("S", "N", "B", "BOOL", "NULL"))
# The type names DynamoDB's messages use.
TYPE_NAMES = {
    "S": "STRING",
    "N": "NUMBER",
    "B": "BINARY",
    "SS": "STRING_SET",
    "NS": "NUMBER_SET",
    "BS": "BINARY_SET",
    "M": "MAP",
    "L": "LIST",
    "NULL": "NULL",
    "BOOL": "BOOLEAN",
}
MAX_ITEM_BYTES = 400 * 1024

_NUMBER_TEXT = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
# Arithmetic as DynamoDB does it: 38 significant digits, and an error rather than rounding.
_ARITHMETIC = decimal.Context(
    prec=38, traps=[decimal.Inexact, decimal.Overflow, decimal.InvalidOperation]
)


# --- Numbers --------------------------------------------------------------------------------


@functools.lru_cache(maxsize=1 << 16)
def number(text: str) -> Decimal:
    """The value of number text DynamoDB accepts; ``ValidationException`` otherwise.

    Cached: the same numbers (versions, sequence numbers, flags) come back again and again."""
    if type(text) is not str or not _NUMBER_TEXT.fullmatch(text):
        raise invalid("A value provided cannot be converted into a number")
    value = Decimal(text)
    if value:
        significant = "".join(map(str, value.as_tuple().digits)).rstrip("0")
        if len(significant) > 38:
            raise invalid("Attempting to store more than 38 significant digits in a Number")
        if value.adjusted() > 125:
            raise invalid(
                "Number overflow. Attempting to store a number with magnitude larger than "
                "supported range"
            )
        if value.adjusted() < -130:
            raise invalid(
                "Number underflow. Attempting to store a number with magnitude smaller than "
                "supported range"
            )
    return value


def number_text(value: Decimal) -> str:
    """``value`` as DynamoDB writes a computed number: no exponent, no trailing zeros (``3``,
    never ``3.0``)."""
    if not value:
        return "0"
    text = format(value, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text


def add_numbers(left: str, right: str, *, negate_right: bool = False) -> str:
    """``left + right`` (or ``left - right``) as number text, within DynamoDB's precision."""
    try:
        if negate_right:
            result = _ARITHMETIC.subtract(number(left), number(right))
        else:
            result = _ARITHMETIC.add(number(left), number(right))
    except decimal.DecimalException:
        raise invalid(
            "Number overflow. Attempting to store a number with magnitude larger than "
            "supported range"
        ) from None
    text = number_text(result)
    number(text)  # the range DynamoDB stores
    return text


# --- Binary ---------------------------------------------------------------------------------


def binary(value: Any) -> bytes:
    """The bytes of a ``B`` value: ``bytes`` as botocore takes them, base64 text as the wire
    carries it, or boto3's ``Binary`` wrapper."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str):
        try:
            return base64.b64decode(value, validate=True)
        except ValueError:
            raise invalid("Invalid binary value: not base64") from None
    inner = getattr(value, "value", None)
    if isinstance(inner, bytes | bytearray):
        return bytes(inner)
    raise invalid(f"Invalid binary value of type {type(value).__name__}")


# --- Import (validation and copy in) and copy out -------------------------------------------


def import_item(item: Any) -> dict[str, dict[str, Any]]:
    """A request's item as the model stores it (validated, copied, sets sorted)."""
    if type(item) is not dict:
        raise invalid("Item: expected a map of attribute names to attribute values")
    imported = {}
    for name, value in item.items():
        if type(name) is not str or not name:
            raise invalid("One or more parameter values were invalid: an attribute name is empty")
        imported[name] = import_value(value)
    return imported


def import_value(value: Any) -> dict[str, Any]:
    """A request's attribute value as the model stores it: validated and copied."""
    if type(value) is dict and len(value) == 1:  # strings and numbers first: most values
        if "S" in value and type(value["S"]) is str:
            return {"S": value["S"]}
        if "N" in value:
            number(value["N"])
            return {"N": value["N"]}
    return _import_other(value)


def _import_other(value: Any) -> dict[str, Any]:
    if type(value) is not dict or not value:
        raise invalid(
            "Supplied AttributeValue is empty, must contain exactly one of the supported datatypes"
        )
    if len(value) != 1:
        raise invalid(
            "Supplied AttributeValue has more than one datatypes set, must contain exactly one "
            "of the supported datatypes"
        )
    ((kind, inner),) = value.items()
    if kind == "S":
        if type(inner) is not str:
            raise invalid("Invalid S value: expected a string")
        return {"S": inner}
    if kind == "N":
        number(inner)
        return {"N": inner}
    if kind == "B":
        binary(inner)
        return {"B": inner}
    if kind == "BOOL":
        if type(inner) is not bool:
            raise invalid("Invalid BOOL value: expected true or false")
        return {"BOOL": inner}
    if kind == "NULL":
        if inner is not True:
            raise invalid(
                "One or more parameter values were invalid: Null attribute value types must "
                "have the value of true"
            )
        return {"NULL": True}
    if kind == "M":
        if type(inner) is not dict:
            raise invalid("Invalid M value: expected a map")
        return {"M": {name: import_value(element) for name, element in inner.items()}}
    if kind == "L":
        if type(inner) is not list:
            raise invalid("Invalid L value: expected a list")
        return {"L": [import_value(element) for element in inner]}
    if kind in ("SS", "NS", "BS"):
        return {kind: _import_set(kind, inner)}
    raise invalid(f"Supplied AttributeValue has an unknown datatype: {kind}")


_SET_ELEMENT = {"SS": "string", "NS": "number", "BS": "binary"}


def _import_set(kind: str, elements: Any) -> list[Any]:
    if type(elements) is not list:
        raise invalid(f"Invalid {kind} value: expected a list")
    if not elements:
        raise invalid(
            f"One or more parameter values were invalid: An {_SET_ELEMENT[kind]} set  may not "
            "be empty"
        )
    if kind == "SS":
        if any(type(element) is not str for element in elements):
            raise invalid("Invalid SS value: expected strings")
        order = sorted(elements)
        identities: list[Any] = order
    elif kind == "NS":
        order = sorted(elements, key=number)
        identities = [number(element) for element in order]
    else:
        order = sorted(elements, key=binary)
        identities = [binary(element) for element in order]
    if len(set(identities)) != len(identities):
        listed = ", ".join(str(element) for element in elements)
        raise invalid(
            f"One or more parameter values were invalid: Input collection [{listed}] contains "
            "duplicates."
        )
    return order


def copy_value(value: dict[str, Any]) -> dict[str, Any]:
    """A copy of a stored value that shares nothing mutable with it."""
    if "S" in value or "N" in value:  # the common case first: strings and numbers
        return value.copy()
    for kind, inner in value.items():
        if kind in SCALAR_TYPES:
            return {kind: inner}
        if kind == "M":
            return {"M": {name: copy_value(element) for name, element in inner.items()}}
        if kind == "L":
            return {"L": [copy_value(element) for element in inner]}
        return {kind: list(inner)}
    raise AssertionError("an empty attribute value was stored")


def copy_item(item: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """A copy of a stored item that shares nothing mutable with it."""
    copied = {}
    for name, value in item.items():
        copied[name] = value.copy() if "S" in value or "N" in value else copy_value(value)
    return copied


# --- Types, equality, order ------------------------------------------------------------------


def kind_of(value: dict[str, Any]) -> str:
    """The type letter(s) of a value: ``"S"``, ``"NS"``..."""
    for kind in value:
        return kind
    raise AssertionError("an empty attribute value")


def values_equal(left: dict[str, Any], right: dict[str, Any]) -> bool:
    """DynamoDB's ``=``: same type and same value; numbers by value, sets whatever the order,
    lists and maps element by element."""
    if left == right:
        return True
    ((left_kind, left_inner),) = left.items()
    ((right_kind, right_inner),) = right.items()
    if left_kind != right_kind:
        return False
    if left_kind == "N":
        return number(left_inner) == number(right_inner)
    if left_kind == "B":
        return binary(left_inner) == binary(right_inner)
    if left_kind == "SS":
        return set(left_inner) == set(right_inner)
    if left_kind == "NS":
        return set(map(number, left_inner)) == set(map(number, right_inner))
    if left_kind == "BS":
        return set(map(binary, left_inner)) == set(map(binary, right_inner))
    if left_kind == "L":
        return len(left_inner) == len(right_inner) and all(
            values_equal(a, b) for a, b in zip(left_inner, right_inner, strict=True)
        )
    if left_kind == "M":
        return left_inner.keys() == right_inner.keys() and all(
            values_equal(element, right_inner[name]) for name, element in left_inner.items()
        )
    return False  # S, BOOL, NULL: equal only when ``==`` (checked first)


def items_equal(left: dict[str, Any] | None, right: dict[str, Any] | None) -> bool:
    """Whether two items hold the same data (what decides a write changed nothing)."""
    if left is None or right is None:
        return left is right
    if left.keys() != right.keys():
        return False
    return all(values_equal(value, right[name]) for name, value in left.items())


def order_key(value: dict[str, Any]) -> Any:
    """What a scalar orders by: numbers by value, strings by code point (the same order as
    their UTF-8 bytes, DynamoDB's order), binaries by bytes. ``None`` for other types."""
    for kind, inner in value.items():
        if kind == "S":
            return inner
        if kind == "N":
            return number(inner)
        if kind == "B":
            return binary(inner)
    return None


def compare(left: dict[str, Any] | None, right: dict[str, Any] | None) -> int | None:
    """-1, 0 or 1 as ``left`` orders before, with or after ``right``; ``None`` when they do not
    compare (either missing, types differ, or not a number, string or binary): DynamoDB's
    ``<`` and friends are then false, not an error."""
    if left is None or right is None:
        return None
    ((left_kind, left_inner),) = left.items()
    ((right_kind, right_inner),) = right.items()
    if left_kind != right_kind:
        return None
    if left_kind == "N":
        a, b = number(left_inner), number(right_inner)
    elif left_kind == "S":
        a, b = left_inner, right_inner
    elif left_kind == "B":
        a, b = binary(left_inner), binary(right_inner)
    else:
        return None
    return (a > b) - (a < b)


# --- Sizes ----------------------------------------------------------------------------------


def text_size(text: str) -> int:
    """UTF-8 length of ``text``."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def value_size(value: dict[str, Any]) -> int:
    """Bytes DynamoDB counts for a value (its documented item-size rules): strings and
    binaries their length, numbers one byte per two significant digits plus one, booleans and
    nulls one, lists and maps three plus one per element plus their elements."""
    ((kind, inner),) = value.items()
    if kind == "S":
        return text_size(inner)
    if kind == "N":
        return _number_size(inner)
    if kind == "B":
        return len(binary(inner))
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "SS":
        return sum(map(text_size, inner))
    if kind == "NS":
        return sum(map(_number_size, inner))
    if kind == "BS":
        return sum(len(binary(element)) for element in inner)
    if kind == "L":
        return 3 + sum(1 + value_size(element) for element in inner)
    return 3 + sum(1 + text_size(name) + value_size(element) for name, element in inner.items())


@functools.lru_cache(maxsize=1 << 16)
def _number_size(text: str) -> int:
    digits = number(text).as_tuple().digits
    significant = "".join(map(str, digits)).strip("0") or "0"
    return (len(significant) + 1) // 2 + 1


def item_size(item: dict[str, dict[str, Any]]) -> int:
    """Bytes DynamoDB counts for an item: its attribute names and values."""
    total = 0
    for name, value in item.items():
        # Strings and numbers inline: this runs for every item written.
        total += len(name) if name.isascii() else text_size(name)
        for kind, inner in value.items():
            if kind == "S":
                total += len(inner) if inner.isascii() else text_size(inner)
            elif kind == "N":
                total += _number_size(inner)
            else:
                total += value_size(value)
    return total
