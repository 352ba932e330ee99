"""Least privilege, checked against behaviour: the calls a component made vs. its role's policy.

Input: the requests a component made (recorded by :mod:`streamfleet_dev.emulator.aws_proxy`, one
access key id per component) turned into :class:`Call` (IAM action, resource ARN, condition
values), and the statements of the component's synthesized role with their resources resolved
in the template's own terms (:meth:`streamfleet_dev.assembly.Stack.template_bindings`: a table's
ARN from its ``TableName``, a queue's from its logical id). Local names (a test's table
``test-leases-1a2b``) are mapped back to those template names before comparing, so the check
compares the ARNs the deployed role would be asked about.

:func:`check` answers both questions a reviewer asks: which call would the role refuse
(*missing*), and which granted action or resource did the component never use (*unused*).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamfleet_dev.assembly import Bindings, Stack, resolve
from streamfleet_dev.emulator.aws_proxy import RecordedRequest

# Signing name -> IAM service prefix, where they differ.
IAM_PREFIX = {"monitoring": "cloudwatch"}
# Operations authorized as another action (AWS's service authorization reference).
ACTION_OF = {
    ("sqs", "SendMessageBatch"): "sqs:SendMessage",
    ("sqs", "DeleteMessageBatch"): "sqs:DeleteMessage",
    ("sqs", "ChangeMessageVisibilityBatch"): "sqs:ChangeMessageVisibility",
    ("execute-api", "PostToConnection"): "execute-api:ManageConnections",
    ("execute-api", "GetConnection"): "execute-api:ManageConnections",
    ("execute-api", "DeleteConnection"): "execute-api:ManageConnections",
}
# What the Lambda service itself does with a function's role (its log stream): granted on
# purpose, never called by the function's code.
PLATFORM_ACTIONS = frozenset({"logs:CreateLogStream", "logs:PutLogEvents"})


@dataclass(frozen=True)
class Call:
    """One authorization question: may this action be done on this resource?"""

    action: str
    resource: str
    conditions: tuple[tuple[str, str], ...] = ()

    def __str__(self) -> str:
        extra = "".join(f" [{k}={v}]" for k, v in self.conditions)
        return f"{self.action} on {self.resource}{extra}"


@dataclass(frozen=True)
class ResolvedStatement:
    """A policy statement with its resources as ARN patterns."""

    effect: str
    actions: tuple[str, ...]
    resources: tuple[str, ...]
    conditions: Mapping[str, Mapping[str, Any]]
    source: str


def statements_of(
    stack: Stack, role: str, bindings: Bindings | None = None
) -> list[ResolvedStatement]:
    """The role's statements, resources resolved (default: in the template's own terms)."""
    bindings = bindings or stack.template_bindings()
    return [
        ResolvedStatement(
            effect=statement.effect,
            actions=statement.actions,
            resources=tuple(str(resolve(r, bindings)) for r in statement.resources),
            conditions=statement.conditions,
            source=statement.source,
        )
        for statement in stack.statements(role)
    ]


@dataclass(frozen=True)
class NameMap:
    """How a local run's names translate to the template's (for ARNs).

    Attributes:
        tables: local table name -> template ``TableName``.
        queues: local queue name -> the template's queue logical id.
        secrets: ``SecretId`` as the code passed it -> the secret's full ARN.
        api_id: the WebSocket API's id in the template's terms (its logical id).
    """

    tables: Mapping[str, str] = field(default_factory=dict)
    queues: Mapping[str, str] = field(default_factory=dict)
    secrets: Mapping[str, str] = field(default_factory=dict)
    api_id: str = ""


def call_of(record: RecordedRequest, account: str, names: NameMap) -> list[Call]:
    """The authorization questions one recorded request asks (one per resource)."""
    prefix = IAM_PREFIX.get(record.service, record.service)
    action = ACTION_OF.get((record.service, record.operation), f"{prefix}:{record.operation}")
    region = record.region
    conditions = tuple(sorted(record.conditions.items()))
    found = []
    for resource in record.resources:
        arn = resource
        if record.service == "dynamodb" and resource.startswith("table/"):
            _, table, *rest = resource.split("/")
            table = names.tables.get(table, table)
            arn = f"arn:aws:dynamodb:{region}:{account}:table/{'/'.join([table, *rest])}"
        elif record.service == "sqs" and resource.startswith("queue/"):
            queue = resource.removeprefix("queue/")
            arn = f"arn:aws:sqs:{region}:{account}:{names.queues.get(queue, queue)}"
        elif record.service == "secretsmanager" and resource.startswith("secret/"):
            secret = resource.removeprefix("secret/")
            arn = names.secrets.get(secret, secret)
        elif record.service == "monitoring" and resource.startswith("alarm:"):
            arn = f"arn:aws:cloudwatch:{region}:{account}:{resource}"
        elif record.service == "execute-api" and "/@connections/" in resource:
            arn = f"arn:aws:execute-api:{region}:{account}:{names.api_id}/{resource}"
        found.append(Call(action, arn, conditions))
    return found


def calls_of(records: Iterable[RecordedRequest], account: str, names: NameMap) -> set[Call]:
    return {call for record in records for call in call_of(record, account, names)}


def _glob(pattern: str, text: str, *, case: bool) -> bool:
    translated = fnmatch.translate(pattern)  # * and ? as IAM means them ([ ] never occur)
    return re.match(translated, text, 0 if case else re.IGNORECASE) is not None


def _conditions_hold(conditions: Mapping[str, Mapping[str, Any]], call: Call) -> bool:
    seen = dict(call.conditions)
    for operator, tests in conditions.items():
        for key, expected in tests.items():
            options = expected if isinstance(expected, list) else [expected]
            value = seen.get(key)
            if operator == "StringEquals":
                ok = value is not None and value in options
            elif operator == "StringLike":
                ok = value is not None and any(_glob(o, value, case=True) for o in options)
            elif operator == "StringNotEquals":
                ok = value is not None and value not in options
            else:
                ok = False  # an operator this check cannot evaluate never grants
            if not ok:
                return False
    return True


def matches(statement: ResolvedStatement, call: Call) -> bool:
    """Whether ``statement`` covers ``call`` (action, resource and conditions)."""
    return (
        any(_glob(a, call.action, case=False) for a in statement.actions)
        and any(_glob(r, call.resource, case=True) for r in statement.resources)
        and _conditions_hold(statement.conditions, call)
    )


def allowed(statements: Iterable[ResolvedStatement], call: Call) -> bool:
    """IAM's rule within one policy set: some Allow covers it and no Deny does."""
    statements = list(statements)
    if any(s.effect == "Deny" and matches(s, call) for s in statements):
        return False
    return any(s.effect == "Allow" and matches(s, call) for s in statements)


@dataclass(frozen=True)
class Finding:
    """One difference between what the code does and what the role grants."""

    kind: str  # "missing" or "unused"
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.detail}"


def check(
    calls: Iterable[Call],
    statements: Iterable[ResolvedStatement],
    *,
    platform_actions: frozenset[str] = PLATFORM_ACTIONS,
    describe: Callable[[ResolvedStatement], str] | None = None,
) -> list[Finding]:
    """Every call the role would refuse, and every granted action and resource no call used.

    An Allow statement's action is *used* when some call matched it on one of the statement's
    resources; a resource likewise. ``platform_actions`` (what the Lambda service does with the
    role) are not expected in the calls.
    """
    calls = sorted(set(calls), key=str)
    statements = list(statements)
    describe = describe or (lambda s: s.source)
    findings = [
        Finding("missing", f"{call} is not granted")
        for call in calls
        if not allowed(statements, call)
    ]
    for statement in statements:
        if statement.effect != "Allow":
            continue
        for action in statement.actions:
            if action in platform_actions:
                continue
            one = ResolvedStatement(
                "Allow", (action,), statement.resources, statement.conditions, ""
            )
            if not any(matches(one, call) for call in calls):
                findings.append(
                    Finding(
                        "unused",
                        f"{action} on {', '.join(statement.resources)} is granted "
                        f"({describe(statement)}) but never called",
                    )
                )
        actions = tuple(a for a in statement.actions if a not in platform_actions)
        if not actions:
            continue
        for resource in statement.resources:
            one = ResolvedStatement("Allow", actions, (resource,), statement.conditions, "")
            if not any(matches(one, call) for call in calls):
                findings.append(
                    Finding(
                        "unused",
                        f"{resource} is granted for {', '.join(actions)} "
                        f"({describe(statement)}) but never touched",
                    )
                )
    return findings
