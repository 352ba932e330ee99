"""Acknowledging cdk-nag findings: one rule (or finding) at a time, always with a reason.

cdk-nag 3.x is a CDK policy-validation plugin; an acknowledgment is CDK's own
``Validations.of(scope).acknowledge(...)``, which applies to ``scope`` and everything below it.
Constructs acknowledge on the narrowest scope that produces the finding, so a new resource added
next to it is still checked.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, Validations
from constructs import IConstruct

AWS_SOLUTIONS = "AwsSolutions"
MIN_REASON_CHARS = 40  # a reason short enough to be generic ("not needed") is no reason


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge ``AwsSolutions-<rule>`` (``rule`` like ``"ECS2"`` or
    ``"IAM5[Resource::*]"``) on ``scope`` and its children."""
    if len(reason.strip()) < MIN_REASON_CHARS:
        raise ValueError(f"reason: acknowledging {rule} needs a specific reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{AWS_SOLUTIONS}-{rule}", reason=reason))
