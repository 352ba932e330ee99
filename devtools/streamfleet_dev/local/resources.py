"""A stack's tables and queues on local servers, created from its template, and the bindings
that map the template's references to them.

:func:`create_local_stack` creates every table (:mod:`streamfleet_dev.tables`, from the
synthesized definition) and every queue (with the template's attributes and redrive policy)
of one stack under local names, and returns a :class:`LocalStack`: the :class:`Bindings` that
turn the template's ``Ref``/``Fn::GetAtt`` into those local names, URLs and ARNs (what a
function's or a container's environment needs), and the :class:`~streamfleet_dev.iam.NameMap`
that turns local names back into the template's (what an IAM comparison needs).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from streamfleet_dev.assembly import Bindings, Stack, TableDefinition, resolve
from streamfleet_dev.iam import NameMap
from streamfleet_dev.tables import CreatedTable, create_table

# SQS attributes CloudFormation's AWS::SQS::Queue properties map to (strings, as SQS wants).
_QUEUE_ATTRIBUTES = {
    "VisibilityTimeout": "VisibilityTimeout",
    "MessageRetentionPeriod": "MessageRetentionPeriod",
    "DelaySeconds": "DelaySeconds",
    "MaximumMessageSize": "MaximumMessageSize",
    "ReceiveMessageWaitTimeSeconds": "ReceiveMessageWaitTimeSeconds",
    "SqsManagedSseEnabled": "SqsManagedSseEnabled",
}


@dataclass
class LocalStack:
    """One stack's resources on local servers.

    Attributes:
        stack: the stack.
        bindings: template references -> local values (names, URLs, ARNs).
        names: local names -> the template's (for IAM comparisons).
        tables: logical id -> the created table.
        queues: logical id -> local queue URL.
    """

    stack: Stack
    bindings: Bindings
    names: NameMap
    tables: dict[str, CreatedTable] = field(default_factory=dict)
    queues: dict[str, str] = field(default_factory=dict)

    def environment(self, variables: Mapping[str, Any]) -> dict[str, str]:
        """A function's or container's ``Environment`` with every reference made local."""
        return {name: str(resolve(value, self.bindings)) for name, value in variables.items()}

    def table_name(self, template_name: str) -> str:
        """The local name of the table the template calls ``template_name``."""
        for local, template in self.names.tables.items():
            if template == template_name:
                return local
        raise KeyError(f"table_name: {template_name!r} has no local table")


def create_local_stack(
    stack: Stack,
    *,
    suffix: str,
    dynamodb_for: Callable[[TableDefinition], Any],
    sqs: Any,
    account: str,
    refs: Mapping[str, Any] | None = None,
    shared_tables: Mapping[str, str] | None = None,
    values: Mapping[str, str] | None = None,
) -> LocalStack:
    """Create ``stack``'s tables and queues locally, named ``<template name>-<suffix>``.

    Args:
        suffix: makes the names unique on a shared server.
        dynamodb_for: the boto3 DynamoDB client of the server a table goes to.
        sqs: the boto3 SQS client (of the stack's Region).
        account: the account local ARNs carry.
        refs: extra ``Ref`` bindings (an API's local id, say).
        shared_tables: template ``TableName`` -> local name, for tables this stack refers to by
            name but another stack declares (a global table's replica).
        values: whole strings to replace in resolved values (an AWS URL with a local one).
    """
    region = stack.region
    template = stack.template_bindings()
    ref_map: dict[str, Any] = dict(template.refs)
    attributes: dict[tuple[str, str], Any] = dict(template.attributes)
    value_map: dict[str, str] = dict(values or {})
    table_names: dict[str, str] = {}
    queue_names: dict[str, str] = {}
    local = LocalStack(stack=stack, bindings=Bindings(), names=NameMap())
    for definition in stack.tables():
        template_name = definition.table_name or definition.logical_id
        name = f"{template_name}-{suffix}"
        local.tables[definition.logical_id] = create_table(
            dynamodb_for(definition), definition, name
        )
        ref_map[definition.logical_id] = name
        attributes[(definition.logical_id, "Arn")] = (
            f"arn:aws:dynamodb:{region}:{account}:table/{name}"
        )
        table_names[name] = template_name
    for template_name, name in (shared_tables or {}).items():
        value_map.setdefault(template_name, name)
        table_names.setdefault(name, template_name)
    pending_bindings = Bindings(ref_map, attributes, stack.pseudo_parameters(), value_map)
    for queue in stack.queues():
        name = f"{queue.logical_id}-{suffix}"[:80]
        attributes_out = {
            sqs_name: _attribute_text(queue.properties[cfn_name])
            for cfn_name, sqs_name in _QUEUE_ATTRIBUTES.items()
            if cfn_name in queue.properties
        }
        redrive = queue.properties.get("RedrivePolicy")
        if redrive:
            attributes_out["RedrivePolicy"] = json.dumps(resolve(redrive, pending_bindings))
        url = sqs.create_queue(QueueName=name, Attributes=attributes_out)["QueueUrl"]
        arn = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])["Attributes"][
            "QueueArn"
        ]
        local.queues[queue.logical_id] = url
        ref_map[queue.logical_id] = url
        attributes[(queue.logical_id, "Arn")] = arn
        attributes[(queue.logical_id, "QueueName")] = name
        queue_names[name] = queue.logical_id
    ref_map.update(refs or {})
    local.bindings = Bindings(ref_map, attributes, stack.pseudo_parameters(), value_map)
    local.names = NameMap(tables=table_names, queues=queue_names)
    return local


def _attribute_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def delete_local_stack(
    local: LocalStack, *, dynamodb_for: Callable[[TableDefinition], Any], sqs: Any
) -> None:
    """Delete what :func:`create_local_stack` created (tests clean up after themselves)."""
    for created in local.tables.values():
        dynamodb_for(created.definition).delete_table(TableName=created.name)
    for url in local.queues.values():
        sqs.delete_queue(QueueUrl=url)
