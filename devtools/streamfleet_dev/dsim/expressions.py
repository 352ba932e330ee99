"""DynamoDB's expression languages: parsed once per expression text, evaluated per request.

Condition expressions (``ConditionExpression``, ``FilterExpression``, and the restricted
``KeyConditionExpression``), update expressions and projection expressions are tokenized and
parsed by recursive descent into a small tree, which is compiled into closures. The result
depends on the text alone (``#name`` placeholders and ``:value`` references are looked up when
the expression is evaluated), so it is cached by text: a simulation sends the same few dozen
expressions millions of times, and parsing is what made moto slow.

What the grammar accepts is DynamoDB's (Developer Guide, "Condition and filter expressions,
operators, and functions" and "Update expressions"): comparators ``= <> < <= > >=``,
``BETWEEN``, ``IN``, ``AND``, ``OR``, ``NOT``, parentheses (``((x))`` refused as redundant),
the functions ``attribute_exists``, ``attribute_not_exists``, ``attribute_type``,
``begins_with``, ``contains`` and ``size``; document paths of names (``#n`` or a bare name that
is not a reserved word), map members (``a.b``) and list elements (``a[0]``); ``SET`` (``=`` a
value, ``+``, ``-``, ``if_not_exists``, ``list_append``), ``REMOVE``, ``ADD`` and ``DELETE``
clauses in any order, each at most once. Anything else is a ``ValidationException`` naming what
was not understood; nothing is guessed.

Evaluation follows DynamoDB's semantics: comparing values of different types is false (not an
error), numbers compare by value, a missing attribute makes every comparison false except
``<>``; every right-hand side of an update is computed from the item as it was before the
update, as DynamoDB does.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamfleet_dev.dsim.attribute_values import (
    TYPE_NAMES,
    TYPES,
    add_numbers,
    binary,
    compare,
    kind_of,
    number,
    values_equal,
)
from streamfleet_dev.dsim.document_paths import (
    UPDATE,
    Elements,
    Item,
    Names,
    Value,
    Values,
    resolve,
    value_at,
)
from streamfleet_dev.dsim.dynamodb_errors import invalid
from streamfleet_dev.dsim.reserved_words import RESERVED_WORDS

Operand = Callable[[Item, Names, Values], Value | None]
Condition = Callable[[Item, Names, Values], bool]

CONDITION = "ConditionExpression"
FILTER = "FilterExpression"
KEY_CONDITION = "KeyConditionExpression"
PROJECTION = "ProjectionExpression"

_CONDITION_FUNCTIONS = frozenset(
    ("attribute_exists", "attribute_not_exists", "attribute_type", "begins_with", "contains")
)
_UPDATE_FUNCTIONS = frozenset(("if_not_exists", "list_append"))
_COMPARATORS = frozenset(("=", "<>", "<", "<=", ">", ">="))
_CLAUSES = ("SET", "REMOVE", "ADD", "DELETE")
_MAX_IN_OPERANDS = 100
_WRONG_TYPE = "An operand in the update expression has an incorrect data type"


# --- Tokens ---------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    \s*(?:
        (?P<name>\#[A-Za-z0-9_]+)
      | (?P<value>:[A-Za-z0-9_]+)
      | (?P<word>[A-Za-z_][A-Za-z0-9_]*)
      | (?P<number>[0-9]+)
      | (?P<op><>|<=|>=|[=<>(),.\[\]+\-])
      | (?P<end>$)
    )
    """,
    re.VERBOSE,
)


@dataclass(frozen=True, slots=True)
class _Token:
    kind: str  # name, value, word, number, end, or the operator's own text
    text: str
    at: int


def _tokenize(text: str, label: str) -> list[_Token]:
    tokens: list[_Token] = []
    at = 0
    while True:
        match = _TOKEN.match(text, at)
        if match is None:
            bad = text[at:].lstrip()[:1]
            raise invalid(
                f'Invalid {label}: Syntax error; token: "{bad}", near: "{_near(text, at)}"'
            )
        kind = match.lastgroup or "end"
        token_text = match.group(kind)
        tokens.append(_Token(token_text if kind == "op" else kind, token_text, match.start(kind)))
        if kind == "end":
            return tokens
        at = match.end()


def _near(text: str, at: int) -> str:
    return text[max(0, at - 10) : at + 10].strip()


# --- Parser ---------------------------------------------------------------------------------


class _Parser:
    """Recursive descent over one expression's tokens; records the placeholders it meets."""

    def __init__(self, text: str, label: str):
        self.text = text
        self.label = label
        self.tokens = _tokenize(text, label)
        self.position = 0
        self.names: set[str] = set()
        self.values: set[str] = set()

    # Tokens

    def peek(self, ahead: int = 0) -> _Token:
        return self.tokens[min(self.position + ahead, len(self.tokens) - 1)]

    def take(self) -> _Token:
        token = self.peek()
        self.position += 1
        return token

    def expect(self, kind: str) -> _Token:
        token = self.take()
        if token.kind != kind:
            raise self.syntax_error(token)
        return token

    def keyword(self, word: str) -> bool:
        """Consume ``word`` (any case) if it comes next."""
        token = self.peek()
        if token.kind == "word" and token.text.upper() == word:
            self.position += 1
            return True
        return False

    def at_end(self) -> bool:
        return self.peek().kind == "end"

    def syntax_error(self, token: _Token) -> Exception:
        shown = "<EOF>" if token.kind == "end" else token.text
        return invalid(
            f'Invalid {self.label}: Syntax error; token: "{shown}", near: '
            f'"{_near(self.text, token.at)}"'
        )

    def fail(self, message: str) -> Exception:
        return invalid(f"Invalid {self.label}: {message}")

    # Operands

    def path(self) -> tuple:
        elements: list[str | int] = [self.path_name()]
        while True:
            if self.peek().kind == ".":
                self.take()
                elements.append(self.path_name())
            elif self.peek().kind == "[":
                self.take()
                index = self.expect("number")
                self.expect("]")
                elements.append(int(index.text))
            else:
                return ("path", tuple(elements))

    def path_name(self) -> str:
        token = self.take()
        if token.kind == "name":
            self.names.add(token.text)
            return token.text
        if token.kind == "word":
            if token.text.upper() in RESERVED_WORDS:
                raise self.fail(
                    f"Attribute name is a reserved keyword; reserved keyword: {token.text}"
                )
            return token.text
        raise self.syntax_error(token)

    def value(self) -> tuple:
        token = self.expect("value")
        self.values.add(token.text)
        return ("value", token.text)

    def operand(self) -> tuple:
        """A condition's operand: a path, a ``:value`` or ``size(path)``."""
        token = self.peek()
        if token.kind == "value":
            return self.value()
        if token.kind == "word" and self.peek(1).kind == "(":
            if token.text != "size":
                if token.text in _CONDITION_FUNCTIONS:
                    raise self.fail(
                        "The function is not allowed to be used this way in an expression; "
                        f"function: {token.text}"
                    )
                raise self.fail(f"Invalid function name; function: {token.text}")
            self.take()
            self.take()
            argument = self.document_path_argument("size")
            self.expect(")")
            return ("size", argument)
        return self.path()

    def document_path_argument(self, function: str) -> tuple:
        if self.peek().kind not in ("name", "word"):
            raise self.fail(
                f"Operator or function requires a document path; operator or function: {function}"
            )
        return self.path()

    # Conditions

    def condition(self) -> tuple:
        node = self.conjunction()
        while self.keyword("OR"):
            node = ("or", node, self.conjunction())
        return node

    def conjunction(self) -> tuple:
        node = self.negation()
        while self.keyword("AND"):
            node = ("and", node, self.negation())
        return node

    def negation(self) -> tuple:
        if self.keyword("NOT"):
            return ("not", self.negation())
        return self.primary()

    def primary(self) -> tuple:
        token = self.peek()
        if token.kind == "(":
            self.take()
            inner = self.condition()
            self.expect(")")
            if inner[0] == "paren":
                raise self.fail("The expression has redundant parentheses;")
            return ("paren", inner)
        if token.kind == "word" and self.peek(1).kind == "(" and token.text in _CONDITION_FUNCTIONS:
            return self.condition_function()
        left = self.operand()
        token = self.peek()
        if token.kind in _COMPARATORS:
            self.take()
            return ("compare", token.kind, left, self.operand())
        if self.keyword("BETWEEN"):
            low = self.operand()
            if not self.keyword("AND"):
                raise self.syntax_error(self.peek())
            return ("between", left, low, self.operand())
        if self.keyword("IN"):
            self.expect("(")
            options = [self.operand()]
            while self.peek().kind == ",":
                self.take()
                options.append(self.operand())
            self.expect(")")
            if len(options) > _MAX_IN_OPERANDS:
                raise self.fail(
                    "The IN operator is provided with too many operands; number of operands: "
                    f"{len(options)}"
                )
            return ("in", left, tuple(options))
        raise self.syntax_error(token)

    def condition_function(self) -> tuple:
        name = self.take().text
        self.expect("(")
        arguments = [self.operand()]
        while self.peek().kind == ",":
            self.take()
            arguments.append(self.operand())
        self.expect(")")
        wanted = 1 if name in ("attribute_exists", "attribute_not_exists") else 2
        if len(arguments) != wanted:
            raise self.fail(
                "Incorrect number of operands for operator or function; operator or function: "
                f"{name}, number of operands: {len(arguments)}"
            )
        if arguments[0][0] != "path":
            raise self.fail(
                f"Operator or function requires a document path; operator or function: {name}"
            )
        if name == "attribute_type" and arguments[1][0] != "value":
            raise self.fail(
                "Incorrect operand type for operator or function; operator or function: "
                "attribute_type"
            )
        return ("call", name, tuple(arguments))

    # Updates

    def update(self) -> list[tuple]:
        if self.at_end():
            raise self.fail("The expression can not be empty;")
        actions: list[tuple] = []
        seen: set[str] = set()
        while not self.at_end():
            token = self.take()
            clause = token.text.upper() if token.kind == "word" else ""
            if clause not in _CLAUSES:
                raise self.syntax_error(token)
            if clause in seen:
                raise self.fail(
                    f'The "{clause}" section can only be used once in an update expression;'
                )
            seen.add(clause)
            while True:
                actions.append(self.update_action(clause))
                if self.peek().kind != ",":
                    break
                self.take()
        return actions

    def update_action(self, clause: str) -> tuple:
        target = self.path()
        if clause == "SET":
            self.expect("=")
            return ("SET", target, self.set_value())
        if clause == "REMOVE":
            return ("REMOVE", target)
        return (clause, target, self.value())

    def set_value(self) -> tuple:
        left = self.set_operand()
        if self.peek().kind in ("+", "-"):
            operator = self.take().kind
            return (operator, left, self.set_operand())
        return left

    def set_operand(self) -> tuple:
        token = self.peek()
        if token.kind == "value":
            return self.value()
        if token.kind == "word" and self.peek(1).kind == "(":
            if token.text not in _UPDATE_FUNCTIONS:
                raise self.fail(f"Invalid function name; function: {token.text}")
            self.take()
            self.take()
            if token.text == "if_not_exists":
                first = self.document_path_argument("if_not_exists")
            else:
                first = self.set_operand()
            self.expect(",")
            second = self.set_operand()
            self.expect(")")
            return ("call", token.text, (first, second))
        return self.path()

    # Projections

    def projection(self) -> list[Elements]:
        paths = [self.path()[1]]
        while self.peek().kind == ",":
            self.take()
            paths.append(self.path()[1])
        return paths

    def finish(self) -> None:
        if not self.at_end():
            raise self.syntax_error(self.peek())


# --- Parsed expressions ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ParsedCondition:
    """A condition or filter expression: ``evaluate(item, names, values)``; ``item`` is ``{}``
    when there is none."""

    names: frozenset[str]
    values: frozenset[str]
    evaluate: Condition
    # (:value, types it may have, the function that takes it): checked per request.
    value_types: tuple[tuple[str, frozenset[str], str], ...]
    paths: tuple[Elements, ...]  # every document path it reads


@dataclass(frozen=True, slots=True)
class UpdateAction:
    clause: str  # SET, REMOVE, ADD, DELETE
    target: Elements
    value: Operand | None  # SET's right-hand side
    value_name: str | None  # ADD's or DELETE's :value


@dataclass(frozen=True, slots=True)
class ParsedUpdate:
    names: frozenset[str]
    values: frozenset[str]
    actions: tuple[UpdateAction, ...]
    top_level_only: bool  # no action targets a nested path (the common, fast case)


@dataclass(frozen=True, slots=True)
class ParsedProjection:
    names: frozenset[str]
    paths: tuple[Elements, ...]
    values: frozenset[str] = frozenset()  # a projection uses none


@dataclass(frozen=True, slots=True)
class KeyTerm:
    """One condition of a key condition: ``name`` (written) compared with ``values``."""

    name: str
    operator: str  # = < <= > >= BETWEEN begins_with
    values: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ParsedKeyCondition:
    names: frozenset[str]
    values: frozenset[str]
    terms: tuple[KeyTerm, ...]


_CACHE: dict[tuple[str, str], Any] = {}
_CACHE_LIMIT = 20_000  # distinct expression texts; a bound, never reached by a simulation


def _cached(label: str, text: Any, parse: Callable[[str, str], Any]) -> Any:
    key = (label, text)
    parsed = _CACHE.get(key)
    if parsed is None:
        if type(text) is not str:
            raise invalid(f"{label}: expected a string")
        parsed = parse(text, label)
        if len(_CACHE) >= _CACHE_LIMIT:
            _CACHE.clear()
        _CACHE[key] = parsed
    return parsed


def parse_condition(text: str, label: str = CONDITION) -> ParsedCondition:
    """A condition (``ConditionExpression``) or filter (``FilterExpression``) expression."""
    return _cached(label, text, _parse_condition)


def parse_update(text: str) -> ParsedUpdate:
    return _cached(UPDATE, text, _parse_update)


def parse_projection(text: str) -> ParsedProjection:
    return _cached(PROJECTION, text, _parse_projection)


def parse_key_condition(text: str) -> ParsedKeyCondition:
    return _cached(KEY_CONDITION, text, _parse_key_condition)


def _parse_condition(text: str, label: str) -> ParsedCondition:
    parser = _Parser(text, label)
    if parser.at_end():
        raise parser.fail("The expression can not be empty;")
    tree = parser.condition()
    parser.finish()
    value_types: list[tuple[str, frozenset[str], str]] = []
    paths: list[Elements] = []
    evaluate = _compile_condition(tree, value_types, paths)
    return ParsedCondition(
        frozenset(parser.names),
        frozenset(parser.values),
        evaluate,
        tuple(value_types),
        tuple(paths),
    )


def _parse_update(text: str, label: str) -> ParsedUpdate:
    parser = _Parser(text, label)
    tree = parser.update()
    parser.finish()
    actions = []
    for action in tree:
        clause, (_, target) = action[0], action[1]
        value = _compile_set_value(action[2]) if clause == "SET" else None
        value_name = action[2][1] if clause in ("ADD", "DELETE") else None
        actions.append(UpdateAction(clause, target, value, value_name))
    return ParsedUpdate(
        frozenset(parser.names),
        frozenset(parser.values),
        tuple(actions),
        all(len(action.target) == 1 for action in actions),
    )


def _parse_projection(text: str, label: str) -> ParsedProjection:
    parser = _Parser(text, label)
    if parser.at_end():
        raise parser.fail("The expression can not be empty;")
    paths = parser.projection()
    parser.finish()
    return ParsedProjection(frozenset(parser.names), tuple(paths))


def _parse_key_condition(text: str, label: str) -> ParsedKeyCondition:
    parser = _Parser(text, label)
    if parser.at_end():
        raise parser.fail("The expression can not be empty;")
    tree = _unwrap(parser.condition())
    parser.finish()
    parts = [_unwrap(tree[1]), _unwrap(tree[2])] if tree[0] == "and" else [tree]
    terms = tuple(_key_term(part) for part in parts)
    return ParsedKeyCondition(frozenset(parser.names), frozenset(parser.values), terms)


def _unwrap(node: tuple) -> tuple:
    while node[0] == "paren":
        node = node[1]
    return node


def _key_term(node: tuple) -> KeyTerm:
    kind = node[0]
    if kind == "and":
        raise invalid("KeyConditionExpressions must only contain one condition per key")
    if kind in ("or", "not", "in"):
        raise invalid(f"Invalid operator used in KeyConditionExpression: {kind.upper()}")
    if kind == "call" and node[1] != "begins_with":
        raise invalid(f"Invalid operator used in KeyConditionExpression: {node[1]}")
    if kind == "compare" and node[1] == "<>":
        raise invalid("Unsupported operator on KeyConditionExpression: operator: <>")
    if kind == "compare":
        operator, target, operands = node[1], node[2], (node[3],)
    elif kind == "between":
        operator, target, operands = "BETWEEN", node[1], (node[2], node[3])
    else:
        operator, target, operands = "begins_with", node[2][0], (node[2][1],)
    if target[0] != "path" or any(operand[0] != "value" for operand in operands):
        raise invalid(
            "Invalid KeyConditionExpression: DynamoDBModel supports key conditions only as "
            "<key attribute> <operator> <:value>"
        )
    if len(target[1]) != 1:
        raise invalid("KeyConditionExpressions cannot have conditions on nested attributes")
    return KeyTerm(target[1][0], operator, tuple(operand[1] for operand in operands))


# --- Compiling conditions -------------------------------------------------------------------


def _getter(elements: Elements) -> Operand:
    first = elements[0]
    if len(elements) == 1:
        if type(first) is str and first[0] == "#":
            return lambda item, names, values: item.get(names[first])
        return lambda item, names, values: item.get(first)

    def get(item: Item, names: Names, values: Values) -> Value | None:
        return value_at(item, resolve(elements, names))

    return get


def _compile_operand(node: tuple, paths: list[Elements]) -> Operand:
    kind = node[0]
    if kind == "value":
        name = node[1]
        return lambda item, names, values: values[name]
    if kind == "path":
        paths.append(node[1])
        return _getter(node[1])
    # size(path): a number; an attribute without a size (a number, a boolean, null) has none.
    paths.append(node[1][1])
    get = _getter(node[1][1])

    def size(item: Item, names: Names, values: Values) -> Value | None:
        value = get(item, names, values)
        if value is None:
            return None
        return _size_of(value)

    return size


def _size_of(value: Value) -> Value | None:
    kind = kind_of(value)
    inner = value[kind]
    if kind == "S":
        return {"N": str(len(inner))}
    if kind == "B":
        return {"N": str(len(binary(inner)))}
    if kind in ("SS", "NS", "BS", "L", "M"):
        return {"N": str(len(inner))}
    return None


_ORDERINGS: dict[str, Callable[[int], bool]] = {
    "<": lambda order: order < 0,
    "<=": lambda order: order <= 0,
    ">": lambda order: order > 0,
    ">=": lambda order: order >= 0,
}


def _compile_condition(
    node: tuple, value_types: list[tuple[str, frozenset[str], str]], paths: list[Elements]
) -> Condition:
    kind = node[0]
    if kind == "paren":
        return _compile_condition(node[1], value_types, paths)
    if kind in ("and", "or"):
        left = _compile_condition(node[1], value_types, paths)
        right = _compile_condition(node[2], value_types, paths)
        if kind == "and":
            return lambda item, names, values: (
                left(item, names, values) and right(item, names, values)
            )
        return lambda item, names, values: left(item, names, values) or right(item, names, values)
    if kind == "not":
        inner = _compile_condition(node[1], value_types, paths)
        return lambda item, names, values: not inner(item, names, values)
    if kind == "compare":
        return _compile_comparison(node[1], node[2], node[3], paths)
    if kind == "between":
        subject = _compile_operand(node[1], paths)
        low = _compile_operand(node[2], paths)
        high = _compile_operand(node[3], paths)

        def between(item: Item, names: Names, values: Values) -> bool:
            value = subject(item, names, values)
            above = compare(value, low(item, names, values))
            below = compare(value, high(item, names, values))
            return above is not None and below is not None and above >= 0 and below <= 0

        return between
    if kind == "in":
        subject = _compile_operand(node[1], paths)
        options = [_compile_operand(option, paths) for option in node[2]]

        def is_in(item: Item, names: Names, values: Values) -> bool:
            value = subject(item, names, values)
            if value is None:
                return False
            for option in options:
                candidate = option(item, names, values)
                if candidate is not None and values_equal(value, candidate):
                    return True
            return False

        return is_in
    return _compile_function(node[1], node[2], value_types, paths)


def _compile_comparison(operator: str, left: tuple, right: tuple, paths: list) -> Condition:
    first = _compile_operand(left, paths)
    second = _compile_operand(right, paths)
    if operator == "=":

        def equal(item: Item, names: Names, values: Values) -> bool:
            a, b = first(item, names, values), second(item, names, values)
            return a is not None and b is not None and values_equal(a, b)

        return equal
    if operator == "<>":
        # A missing attribute is "not equal" to anything, as DynamoDB answers.
        def not_equal(item: Item, names: Names, values: Values) -> bool:
            a, b = first(item, names, values), second(item, names, values)
            return a is None or b is None or not values_equal(a, b)

        return not_equal
    holds = _ORDERINGS[operator]

    def ordered(item: Item, names: Names, values: Values) -> bool:
        order = compare(first(item, names, values), second(item, names, values))
        return order is not None and holds(order)

    return ordered


def _compile_function(
    name: str,
    arguments: tuple,
    value_types: list[tuple[str, frozenset[str], str]],
    paths: list[Elements],
) -> Condition:
    get = _compile_operand(arguments[0], paths)
    if name == "attribute_exists":
        return lambda item, names, values: get(item, names, values) is not None
    if name == "attribute_not_exists":
        return lambda item, names, values: get(item, names, values) is None
    other = _compile_operand(arguments[1], paths)
    if name == "attribute_type":
        value_types.append((arguments[1][1], frozenset(("S",)), name))

        def has_type(item: Item, names: Names, values: Values) -> bool:
            value = get(item, names, values)
            return value is not None and kind_of(value) == other(item, names, values)["S"]

        return has_type
    if name == "begins_with":
        if arguments[1][0] == "value":
            value_types.append((arguments[1][1], frozenset(("S", "B")), name))

        def begins_with(item: Item, names: Names, values: Values) -> bool:
            value, prefix = get(item, names, values), other(item, names, values)
            if value is None or prefix is None:
                return False
            kind = kind_of(value)
            if kind != kind_of(prefix):
                return False
            if kind == "S":
                return value["S"].startswith(prefix["S"])
            if kind == "B":
                return binary(value["B"]).startswith(binary(prefix["B"]))
            return False

        return begins_with

    def contains(item: Item, names: Names, values: Values) -> bool:
        value, operand = get(item, names, values), other(item, names, values)
        if value is None or operand is None:
            return False
        kind, operand_kind = kind_of(value), kind_of(operand)
        inner, wanted = value[kind], operand[operand_kind]
        if kind == "S":
            return operand_kind == "S" and wanted in inner
        if kind == "B":
            return operand_kind == "B" and binary(wanted) in binary(inner)
        if kind == "SS":
            return operand_kind == "S" and wanted in inner
        if kind == "NS":
            return operand_kind == "N" and number(wanted) in set(map(number, inner))
        if kind == "BS":
            return operand_kind == "B" and binary(wanted) in set(map(binary, inner))
        if kind == "L":
            return any(values_equal(element, operand) for element in inner)
        return False

    return contains


def check_value_types(parsed: ParsedCondition, values: Values, label: str) -> None:
    """The request's values where a function needs a particular type (``begins_with``'s prefix
    is a string or binary): DynamoDB refuses the request whatever the item."""
    for name, kinds, function in parsed.value_types:
        kind = kind_of(values[name])
        if kind not in kinds:
            raise invalid(
                f"Invalid {label}: Incorrect operand type for operator or function; operator or "
                f"function: {function}, operand type: {TYPE_NAMES[kind]}"
            )
        if function == "attribute_type" and values[name]["S"] not in TYPES:
            raise invalid(
                f"Invalid {label}: Invalid attribute type name found in type: "
                f"{values[name]['S']}, valid types: {{{','.join(TYPES)}}}"
            )


# --- Updates --------------------------------------------------------------------------------


def _compile_set_value(node: tuple) -> Operand:
    kind = node[0]
    if kind == "value":
        name = node[1]
        return lambda item, names, values: values[name]
    if kind == "path":
        get = _getter(node[1])

        def existing(item: Item, names: Names, values: Values) -> Value:
            value = get(item, names, values)
            if value is None:
                raise invalid(
                    "The provided expression refers to an attribute that does not exist in the item"
                )
            return value

        return existing
    if kind in ("+", "-"):
        left, right = _compile_set_value(node[1]), _compile_set_value(node[2])
        negate = kind == "-"

        def arithmetic(item: Item, names: Names, values: Values) -> Value:
            a, b = left(item, names, values), right(item, names, values)
            if "N" not in a or "N" not in b:
                raise invalid(_WRONG_TYPE)
            return {"N": add_numbers(a["N"], b["N"], negate_right=negate)}

        return arithmetic
    function, (first, second) = node[1], node[2]
    if function == "if_not_exists":
        get = _getter(first[1])
        fallback = _compile_set_value(second)

        def if_not_exists(item: Item, names: Names, values: Values) -> Value:
            value = get(item, names, values)
            return value if value is not None else fallback(item, names, values)

        return if_not_exists
    head, tail = _compile_set_value(first), _compile_set_value(second)

    def list_append(item: Item, names: Names, values: Values) -> Value:
        a, b = head(item, names, values), tail(item, names, values)
        if "L" not in a or "L" not in b:
            raise invalid(_WRONG_TYPE)
        return {"L": [*a["L"], *b["L"]]}

    return list_append
