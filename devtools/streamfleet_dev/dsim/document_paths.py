"""Values at DynamoDB document paths: the actions of an update expression, and projections.

A path is a resolved document path (:func:`resolve`): attribute and map member names, and list
indexes. Stored items are never modified in place: an update copies the item and every
container along the paths it writes (copy on write), so the item it started from, which a
stream record or a caller may still hold, stays as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from streamfleet_dev.dsim.attribute_values import TYPE_NAMES, add_numbers, binary, kind_of, number
from streamfleet_dev.dsim.dynamodb_errors import invalid

if TYPE_CHECKING:
    from streamfleet_dev.dsim.expressions import ParsedUpdate

Value = dict[str, Any]
Item = dict[str, Value]
Names = dict[str, str]
Values = dict[str, Value]
# A document path as written: names (``#n`` placeholders or bare) and list indexes.
Elements = tuple[str | int, ...]
# A document path with its placeholders replaced by the attribute names they stand for.
Path = tuple[str | int, ...]

UPDATE = "UpdateExpression"
_INVALID_PATH = "The document path provided in the update expression is invalid for update"
_WRONG_TYPE = "An operand in the update expression has an incorrect data type"


def resolve(elements: Elements, names: Names) -> Path:
    """``elements`` with each ``#placeholder`` replaced by its attribute name."""
    return tuple(
        names[element] if type(element) is str and element[0] == "#" else element
        for element in elements
    )


def value_at(item: Item, path: Path) -> Value | None:
    """The value at a resolved document path, or ``None`` where there is none."""
    value = item.get(path[0])  # type: ignore[arg-type]
    for element in path[1:]:
        if value is None:
            return None
        if type(element) is int:
            elements = value.get("L")
            if elements is None or element >= len(elements):
                return None
            value = elements[element]
        else:
            members = value.get("M")
            if members is None:
                return None
            value = members.get(element)
    return value


def plan_update(
    parsed: ParsedUpdate, names: Names, values: Values, key_names: tuple[str, ...]
) -> tuple[Path, ...]:
    """The paths ``parsed`` acts on, after the checks DynamoDB makes whatever the item: no key
    attribute updated, no two actions on overlapping paths, ``ADD`` given a number or a set and
    ``DELETE`` a set."""
    targets = tuple(resolve(action.target, names) for action in parsed.actions)
    for target in targets:
        if target[0] in key_names:
            raise invalid(
                f"One or more parameter values were invalid: Cannot update attribute "
                f"{target[0]}. This attribute is part of the key"
            )
    check_disjoint(targets, UPDATE, top_level_only=parsed.top_level_only)
    for action in parsed.actions:
        if action.value_name is None:
            continue
        kind = kind_of(values[action.value_name])
        allowed = kind in _SET_IDENTITY or (action.clause == "ADD" and kind == "N")
        if not allowed:
            raise invalid(
                "Invalid UpdateExpression: Incorrect operand type for operator or function; "
                f"operator: {action.clause}, operand type: {TYPE_NAMES[kind]}"
            )
    return targets


def apply_update(
    parsed: ParsedUpdate, targets: tuple[Path, ...], item: Item, names: Names, values: Values
) -> Item:
    """A new item: ``item`` (``{}`` if there is none) with ``parsed`` applied at ``targets``
    (from :func:`plan_update`), every right-hand side computed from ``item`` as it was."""
    computed = [
        action.value(item, names, values) if action.value is not None else None
        for action in parsed.actions
    ]
    updated = dict(item)
    removals: list[Path] = []
    for action, target, value in zip(parsed.actions, targets, computed, strict=True):
        if action.clause == "SET":
            _assign(updated, target, value)  # type: ignore[arg-type]
        elif action.clause == "REMOVE":
            removals.append(target)
        elif action.clause == "ADD":
            _add(updated, target, values[action.value_name])  # type: ignore[index]
        else:
            _delete(updated, target, values[action.value_name])  # type: ignore[index]
    # List indexes name elements of the list as it was: remove the highest first.
    removals.sort(key=lambda path: [(1, -e) if type(e) is int else (0, e) for e in path])
    for target in removals:
        _remove(updated, target)
    return updated


def check_disjoint(
    paths: tuple[Path, ...] | list[Path], label: str, *, top_level_only: bool = False
) -> None:
    """No path equal to or inside another: DynamoDB refuses such an expression."""
    if top_level_only and len({path[0] for path in paths}) == len(paths):
        return
    for index, first in enumerate(paths):
        for second in paths[index + 1 :]:
            shorter = min(len(first), len(second))
            if first[:shorter] == second[:shorter]:
                # DynamoDB says "overlap" for equal paths too ([a] and [a]).
                raise invalid(
                    f"Invalid {label}: Two document paths overlap with each other; must remove "
                    f"or rewrite one of these paths; path one: {_show(first)}, path two: "
                    f"{_show(second)}"
                )


def _show(path: Path) -> str:
    return "[" + ", ".join(f"[{e}]" if type(e) is int else str(e) for e in path) + "]"


def _assign(item: Item, path: Path, value: Value) -> None:
    name = path[0]
    if len(path) == 1:
        item[name] = value  # type: ignore[index]
    else:
        item[name] = _assign_within(item.get(name), path[1:], value)  # type: ignore[index, arg-type]


def _assign_within(container: Value | None, rest: Path, value: Value) -> Value:
    """A new container: ``container`` with ``value`` at ``rest`` (copy on write)."""
    element = rest[0]
    if type(element) is int:
        if container is None or "L" not in container:
            raise invalid(_INVALID_PATH)
        elements = list(container["L"])
        if len(rest) == 1:
            if element < len(elements):
                elements[element] = value
            else:  # past the end: DynamoDB appends
                elements.append(value)
        else:
            if element >= len(elements):
                raise invalid(_INVALID_PATH)
            elements[element] = _assign_within(elements[element], rest[1:], value)
        return {"L": elements}
    if container is None or "M" not in container:
        raise invalid(_INVALID_PATH)
    members = dict(container["M"])
    if len(rest) == 1:
        members[element] = value  # type: ignore[index]
    else:
        members[element] = _assign_within(members.get(element), rest[1:], value)  # type: ignore
    return {"M": members}


def _remove(item: Item, path: Path) -> None:
    name = path[0]
    if len(path) == 1:
        item.pop(name, None)  # type: ignore[call-overload]
        return
    container = item.get(name)  # type: ignore[call-overload]
    if container is not None:
        replaced = _remove_within(container, path[1:])
        if replaced is not None:
            item[name] = replaced  # type: ignore[index]


def _remove_within(container: Value, rest: Path) -> Value | None:
    """A new container without what ``rest`` names; ``None`` when there is nothing there."""
    element = rest[0]
    if type(element) is int:
        elements = container.get("L")
        if elements is None or element >= len(elements):
            return None
        copied = list(elements)
        if len(rest) == 1:
            del copied[element]
        else:
            inner = _remove_within(copied[element], rest[1:])
            if inner is None:
                return None
            copied[element] = inner
        return {"L": copied}
    members = container.get("M")
    if members is None or element not in members:
        return None
    copied_members = dict(members)
    if len(rest) == 1:
        del copied_members[element]
    else:
        inner = _remove_within(copied_members[element], rest[1:])
        if inner is None:
            return None
        copied_members[element] = inner
    return {"M": copied_members}


_SET_IDENTITY: dict[str, Callable[[Any], Any]] = {
    "SS": lambda element: element,
    "NS": number,
    "BS": binary,
}


def _add(item: Item, path: Path, operand: Value) -> None:
    kind = kind_of(operand)
    current = value_at(item, path)
    if kind == "N":
        if current is None:
            result = {"N": add_numbers("0", operand["N"])}
        elif "N" in current:
            result = {"N": add_numbers(current["N"], operand["N"])}
        else:
            raise invalid(_WRONG_TYPE)
    elif kind in _SET_IDENTITY:
        if current is None:
            result = operand
        elif kind in current:
            identity = _SET_IDENTITY[kind]
            present = {identity(element) for element in current[kind]}
            added = [element for element in operand[kind] if identity(element) not in present]
            result = {kind: sorted([*current[kind], *added], key=identity)} if added else current
        else:
            raise invalid(_WRONG_TYPE)
    else:
        raise AssertionError("plan_update admits only numbers and sets")
    _assign(item, path, result)


def _delete(item: Item, path: Path, operand: Value) -> None:
    kind = kind_of(operand)
    current = value_at(item, path)
    if current is None:
        return
    if kind not in current:
        raise invalid(_WRONG_TYPE)
    identity = _SET_IDENTITY[kind]
    removed = {identity(element) for element in operand[kind]}
    remaining = [element for element in current[kind] if identity(element) not in removed]
    if remaining:
        _assign(item, path, {kind: remaining})
    else:  # DynamoDB has no empty sets: the attribute goes
        _remove(item, path)


# --- Projections ----------------------------------------------------------------------------


def project(item: Item, paths: list[Path], copy: Callable[[Value], Value]) -> Item:
    """The parts of ``item`` that ``paths`` name, copied with ``copy``, in DynamoDB's shape: a
    nested path keeps its enclosing maps and lists (list elements keep their order, compacted)."""
    if all(len(path) == 1 for path in paths):
        return {
            path[0]: copy(item[path[0]])  # type: ignore[index]
            for path in paths
            if path[0] in item
        }
    tree: dict[Any, Any] = {}
    for path in paths:
        node = tree
        for element in path[:-1]:
            node = node.setdefault(element, {})
            if node is True:
                break
        else:
            node[path[-1]] = True
    projected = {}
    for name, wanted in tree.items():
        if name in item:
            value = _project_value(item[name], wanted, copy)
            if value is not None:
                projected[name] = value
    return projected


def _project_value(value: Value, wanted: Any, copy: Callable[[Value], Value]) -> Value | None:
    if wanted is True:
        return copy(value)
    if "M" in value:
        members = {}
        for name, inner_wanted in wanted.items():
            if type(name) is str and name in value["M"]:
                inner = _project_value(value["M"][name], inner_wanted, copy)
                if inner is not None:
                    members[name] = inner
        return {"M": members} if members else None
    if "L" in value:
        elements = []
        for index in sorted(key for key in wanted if type(key) is int):
            if index < len(value["L"]):
                inner = _project_value(value["L"][index], wanted[index], copy)
                if inner is not None:
                    elements.append(inner)
        return {"L": elements} if elements else None
    return None
