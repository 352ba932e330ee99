"""Where alarms go: one SNS topic per Region, and every alarm of a stack wired to it.

:class:`AlarmTopic` is the Region's topic (encrypted with its own KMS key, TLS only, optionally
with an e-mail subscription). :class:`AlarmNotifications` is an aspect: added to a stack, it
sends the ALARM and OK transitions of *every* CloudWatch alarm in it to the topic, including
alarms added later by someone extending the stack, so no alarm can be forgotten.

Why a customer managed key: CloudWatch can publish to an encrypted topic only if the key's
policy lets ``cloudwatch.amazonaws.com`` use it, which the AWS managed ``alias/aws/sns`` key
never does (its policy cannot be changed).
"""

from __future__ import annotations

import re

import jsii
from aws_cdk import AspectPriority, Aspects, IAspect, RemovalPolicy, Stack
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct, IConstruct

# One name per Region, so a stack that does not own the topic can address it without a
# cross-stack reference (the WebSocket API stacks, next to the fleet's).
ALARM_TOPIC_NAME = "StreamFleet-Alarms"
EMAIL_PATTERN = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")


class AlarmTopic(Construct):
    """The Region's alarm topic.

    Attributes:
        key: the topic's KMS key (rotation on), usable by CloudWatch to publish.
        topic: the SNS topic (``ALARM_TOPIC_NAME``), publishing over TLS only.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        email: str | None = None,
        topic_name: str = ALARM_TOPIC_NAME,
    ) -> None:
        super().__init__(scope, construct_id)
        if email is not None and not EMAIL_PATTERN.fullmatch(email):
            raise ValueError(f"email: expected an e-mail address, got {email!r}")
        self.key = kms.Key(
            self,
            "Key",
            description="StreamFleet alarm topic: CloudWatch publishes alarm notifications",
            enable_key_rotation=True,
            removal_policy=RemovalPolicy.DESTROY,
        )
        # Alarm notifications are produced by CloudWatch itself; SNS encrypts them with this key
        # on its behalf, so CloudWatch must be allowed to generate data keys and decrypt.
        self.key.add_to_resource_policy(
            iam.PolicyStatement(
                principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],  # in a key policy, "*" is this key
            )
        )
        self.topic = sns.Topic(
            self,
            "Topic",
            topic_name=topic_name,
            display_name="StreamFleet alarms",
            master_key=self.key,
            enforce_ssl=True,
        )
        if email is not None:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))


def topic_by_name(scope: Construct, construct_id: str, name: str = ALARM_TOPIC_NAME) -> sns.ITopic:
    """The Region's alarm topic, declared by another stack of the same account and Region."""
    arn = Stack.of(scope).format_arn(service="sns", resource=name)
    return sns.Topic.from_topic_arn(scope, construct_id, arn)


@jsii.implements(IAspect)
class AlarmNotifications:
    """Sends every alarm's ALARM and OK transitions to ``topic``."""

    def __init__(self, topic: sns.ITopic) -> None:
        self._action = cloudwatch_actions.SnsAction(topic)
        self._wired: set[str] = set()

    def visit(self, node: IConstruct) -> None:
        # Every synthesis of the app runs the aspect again (tests synthesize more than once):
        # each alarm gets its actions once.
        if isinstance(node, cloudwatch.Alarm) and node.node.path not in self._wired:
            self._wired.add(node.node.path)
            node.add_alarm_action(self._action)
            node.add_ok_action(self._action)

    @classmethod
    def apply(cls, scope: IConstruct, topic: sns.ITopic) -> None:
        """Add the aspect to ``scope`` (it changes the tree, so it runs with mutating priority)."""
        Aspects.of(scope).add(cls(topic), priority=AspectPriority.MUTATING)
