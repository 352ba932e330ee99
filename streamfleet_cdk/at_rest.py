"""Log groups and SQS queues, built one way wherever they are created: encrypted at rest with
their service's own keys, not a customer managed KMS key, and judged for checkov once, here.

* :func:`log_group`: every log group of the app (the functions', the APIs' access logs, the
  workers', the VPC's flow logs). checkov's CKV_AWS_158 asks for a KMS key on each.
* :func:`queue`: every SQS queue of the app, SSE-SQS and TLS only. checkov's CKV_AWS_27 asks for
  a KMS key and does not recognise SSE-SQS as encryption.

A queue a team brings may use its own KMS key: :func:`grant_queue_key` grants what its senders
and receivers need of it. :func:`check_removal_policy` is every props class's check of a
table's or a log group's ``RemovalPolicy``.

Where a key *is* needed, the app has one: the alarm topic's (:mod:`streamfleet_cdk.alarms`),
because CloudWatch can publish to an encrypted topic only through a key policy that allows it.
"""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sqs as sqs
from constructs import Construct

from streamfleet_cdk.nag import skip_checkov

LOG_GROUP_KMS_REASON = (
    "Operational records: the functions' JSON decisions and errors (bearer tokens are redacted "
    "before a line is written, streamfleet.logs), the APIs' access logs (request and "
    "connection ids, caller IP, principal, status), the workers' lines and VPC flow records. "
    "CloudWatch Logs encrypts every log group at rest and IAM decides who reads it; a customer "
    "managed key would add a key and a key policy for the logs service in every Region, and "
    "make the logs unreadable whenever the key is disabled, for no data that needs it."
)
QUEUE_KMS_REASON = (
    "Encrypted at rest with SSE-SQS (SqsManagedSseEnabled: SQS's own keys), which this check "
    "does not count as encryption; SSE-SQS, not KMS, so that the router, the workers, the "
    "task-events handler and Lambda's on-failure delivery need no KMS grants to send or receive. "
    "They carry claim notifications (a connection id) and the positions of stream batches given "
    "up on (shard and sequence numbers), no secrets."
)


def check_removal_policy(field: str, value: object) -> RemovalPolicy:
    """A ``RemovalPolicy`` for a table or a log group; ``ValueError`` naming ``field``
    otherwise. ``SNAPSHOT`` is refused too: CloudFormation snapshots neither, so the policy
    could not do what it says (CDK's ``validateSnapshotRemovalPolicy`` flag, where an app sets
    it, refuses it only later, at synth)."""
    if not isinstance(value, RemovalPolicy):
        raise ValueError(f"{field}: expected an aws_cdk.RemovalPolicy, got {value!r}")
    if value is RemovalPolicy.SNAPSHOT:
        raise ValueError(f"{field}: SNAPSHOT is not supported by DynamoDB tables or log groups")
    return value


def log_group(
    scope: Construct,
    construct_id: str,
    *,
    retention: logs.RetentionDays,
    removal_policy: RemovalPolicy,
) -> logs.LogGroup:
    """A log group kept for ``retention``, encrypted by CloudWatch Logs (see the module), and
    retained or deleted with its stack as ``removal_policy`` says (each construct's
    ``log_removal_policy``)."""
    group = logs.LogGroup(scope, construct_id, retention=retention, removal_policy=removal_policy)
    skip_checkov(group, "CKV_AWS_158", LOG_GROUP_KMS_REASON)
    return group


def queue(scope: Construct, construct_id: str, **options: Any) -> sqs.Queue:
    """An SQS queue with SSE-SQS and TLS only; ``options``: the other ``sqs.Queue`` props."""
    for fixed in ("encryption", "encryption_master_key", "enforce_ssl"):
        if fixed in options:
            raise ValueError(f"{fixed}: every queue of the app is SSE-SQS and TLS only")
    created = sqs.Queue(
        scope,
        construct_id,
        encryption=sqs.QueueEncryption.SQS_MANAGED,
        enforce_ssl=True,
        **options,
    )
    skip_checkov(created, "CKV_AWS_27", QUEUE_KMS_REASON)
    return created


def grant_queue_key(queue: sqs.IQueue, grantee: iam.IGrantable) -> iam.Grant | None:
    """What sending to and receiving from ``queue`` needs of its KMS key, if it has one: a team
    may bring a queue encrypted with its own key, and SQS then refuses ``SendMessage`` without
    ``kms:GenerateDataKey`` and ``ReceiveMessage`` without ``kms:Decrypt``. ``None`` for the
    queues this library builds (SSE-SQS needs no grant)."""
    key = queue.encryption_master_key
    if key is None:
        return None
    return key.grant(grantee, "kms:Decrypt", "kms:GenerateDataKey")
