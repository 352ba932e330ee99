"""Acknowledging cdk-nag findings: one rule (or finding) at a time, always with a reason.

cdk-nag 3.x is a CDK policy-validation plugin; an acknowledgment is CDK's own
``Validations.of(scope).acknowledge(...)``, which applies to ``scope`` and everything below it.
Constructs acknowledge on the narrowest scope that produces the finding, so a new resource added
next to it is still checked.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Stack, Validations
from constructs import IConstruct

AWS_SOLUTIONS = "AwsSolutions"
MIN_REASON_CHARS = 40  # a reason short enough to be generic ("not needed") is no reason


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge ``AwsSolutions-<rule>`` (``rule`` like ``"ECS2"`` or
    ``"IAM5[Resource::*]"``) on ``scope`` and its children."""
    if len(reason.strip()) < MIN_REASON_CHARS:
        raise ValueError(f"reason: acknowledging {rule} needs a specific reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{AWS_SOLUTIONS}-{rule}", reason=reason))


def nag_text(stack: Stack, value: str) -> str:
    """A CloudFormation value as cdk-nag spells it in a finding id: intrinsics flattened,
    ``Ref`` as ``<Id>`` and ``GetAtt`` as ``<Id.Attr>`` (to acknowledge one finding only)."""

    def flatten(item: object) -> str:
        if isinstance(item, str):
            return item
        if isinstance(item, dict) and len(item) == 1:
            ((function, argument),) = item.items()
            if function == "Fn::Join":
                return str(argument[0]).join(flatten(part) for part in argument[1])
            if function == "Ref":
                return f"<{argument}>"
            if function == "Fn::GetAtt":
                return f"<{argument[0]}.{argument[1]}>"
        raise ValueError(f"no cdk-nag spelling for {item!r}")

    return flatten(stack.resolve(value))
