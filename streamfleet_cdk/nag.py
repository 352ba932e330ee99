"""Judging the template scanners' findings: one rule (or finding) at a time, always with a reason.

cdk-nag 3.x is a CDK policy-validation plugin; an acknowledgment is CDK's own
``Validations.of(scope).acknowledge(...)``, which applies to ``scope`` and everything below it.
Constructs acknowledge on the narrowest scope that produces the finding, so a new resource added
next to it is still checked.

checkov reads the synthesized templates; a judged check is skipped on the one resource it
concerns, in checkov's own resource metadata (``Metadata.checkov.skip``, each with its reason as
``comment``), which :func:`skip_checkov` writes. Where several resources of a kind are judged
alike, the one factory that builds them calls it (:mod:`streamfleet_cdk.functions`,
:mod:`streamfleet_cdk.at_rest`), so the reason is written once.
"""

from __future__ import annotations

import re
from typing import cast

from aws_cdk import Acknowledgment, CfnResource, Stack, Validations
from constructs import IConstruct

AWS_SOLUTIONS = "AwsSolutions"
MIN_REASON_CHARS = 40  # a reason short enough to be generic ("not needed") is no reason
CHECKOV = "checkov"  # the resource metadata key checkov reads its skips from
CHECKOV_CHECK_ID = re.compile(r"CKV2?_[A-Z0-9]+_\d+")


def acknowledge(scope: IConstruct, rule: str, reason: str) -> None:
    """Acknowledge ``AwsSolutions-<rule>`` (``rule`` like ``"ECS2"`` or
    ``"IAM5[Resource::*]"``) on ``scope`` and its children."""
    if len(reason.strip()) < MIN_REASON_CHARS:
        raise ValueError(f"reason: acknowledging {rule} needs a specific reason, got {reason!r}")
    Validations.of(scope).acknowledge(Acknowledgment(id=f"{AWS_SOLUTIONS}-{rule}", reason=reason))


def skip_checkov(resource: IConstruct, check: str, reason: str) -> None:
    """Skip checkov's ``check`` (like ``"CKV_AWS_117"``) on ``resource`` (a ``CfnResource``, or
    an L2 construct whose default child is one), and on nothing else, with ``reason``.

    Merges with the skips already on the resource. Skipping a check again with the same
    reason changes nothing (a provider CDK shares between constructs of a stack); with another
    reason it is an error.
    """
    if len(reason.strip()) < MIN_REASON_CHARS:
        raise ValueError(f"reason: skipping {check} needs a specific reason, got {reason!r}")
    if not CHECKOV_CHECK_ID.fullmatch(check):
        raise ValueError(f"check: expected a checkov check id like CKV_AWS_117, got {check!r}")
    child = resource if CfnResource.is_cfn_resource(resource) else resource.node.default_child
    if child is None or not CfnResource.is_cfn_resource(child):
        raise ValueError(f"resource: {resource.node.path} is not a CloudFormation resource")
    target = cast(CfnResource, child)
    metadata = dict(target.get_metadata(CHECKOV) or {})
    skips = list(metadata.get("skip") or [])
    for skip in skips:
        if skip.get("id") == check:
            if skip.get("comment") == reason:
                return
            raise ValueError(f"check: {check} is already skipped on {target.node.path}")
    metadata["skip"] = [*skips, {"id": check, "comment": reason}]
    target.add_metadata(CHECKOV, metadata)


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
