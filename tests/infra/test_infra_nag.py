"""Static checks of the synthesized app: cdk-nag (AwsSolutions) and cfn-lint.

cdk-nag 3.x is a CDK policy-validation plugin; ``AwsSolutionsChecks().validate_scope(app)`` runs
the same rules ``app.py`` registers, on the construct tree, after synth (so resources CDK adds
late are seen too). Acknowledgments are CDK's own ``Validations.of(scope).acknowledge``; every
one must carry a specific reason and must still be needed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from aws_cdk import Validations
from aws_cdk import aws_sqs as sqs
from cdk_nag import AwsSolutionsChecks
from cfnlint.api import ManualArgs, lint_file

from streamfleet_cdk import api_gateway_account, event_ingestion, worker_fleet
from streamfleet_cdk.nag import AWS_SOLUTIONS, MIN_REASON_CHARS
from tests.app_support import TEST_ACCOUNT, BuiltApp, build_app, default_app

# Every acknowledgment in the app, per stack (both stacks hold the same constructs). A new one
# fails this list on purpose: adding it is a decision for review, with its reason in the code.
EXPECTED_ACKNOWLEDGMENTS = {
    f"{AWS_SOLUTIONS}-COG4",  # IAM SigV4 auth, no Cognito end users
    f"{AWS_SOLUTIONS}-APIG3",  # no WAF by default (IAM auth + throttling); web_acl_arn adds one
    f"{AWS_SOLUTIONS}-ECS2",  # the worker's environment holds names and timings, no secrets
    f"{AWS_SOLUTIONS}-IAM5[Resource::*]",  # ecr:GetAuthorizationToken has no resource scope
    # The Region's API Gateway CloudWatch role writes every stage's logs in this Region (its
    # full finding id names the Region and account, see test_the_log_group_finding_is_specific).
    f"{AWS_SOLUTIONS}-IAM5[Resource::arn:aws:logs:...:log-group:*]",
}


def generalized(rule: str) -> str:
    """The API Gateway role's IAM5 finding without its Region and account."""
    prefix = f"{AWS_SOLUTIONS}-IAM5[Resource::arn:aws:logs:"
    return f"{prefix}...:log-group:*]" if rule.startswith(prefix) else rule


# cfn-lint checks turned off, each for a reason.
CFN_LINT_IGNORED = {
    # W3005: CDK adds an explicit DependsOn on a Lambda's role (so the role's policy exists
    # before the function is invoked) next to the GetAtt on it; the duplicate is harmless.
    "W3005",
}


def violations(report: Any) -> list[str]:
    return [
        f"{violation.rule_name} at {resource.construct_path}"
        for violation in report.violations
        for resource in violation.violating_resources
    ]


def acknowledgments(built: BuiltApp) -> dict[str, dict[str, str]]:
    """``{stack name: {rule id: reason}}`` of every AwsSolutions acknowledgment in the app.

    (CDK's own constructs acknowledge some of CDK's built-in ``CloudFormation-Validate`` rules,
    for example the flow log's; those are CDK's business, not cdk-nag findings.)
    """
    found: dict[str, dict[str, str]] = {}
    for stack in (built.primary, built.secondary):
        acknowledged = found.setdefault(stack.stack_name, {})
        for construct in stack.node.find_all():
            for entry in construct.node.metadata:
                if entry.type == Validations.ACKNOWLEDGED_RULES_METADATA_KEY:
                    for key, reason in entry.data.items():
                        rule = key.split("::", 1)[-1]
                        if not rule.startswith(f"{AWS_SOLUTIONS}-"):
                            continue
                        assert rule not in acknowledged, f"{rule} acknowledged twice in {stack}"
                        acknowledged[rule] = reason
    return found


# --- cdk-nag ---


def test_the_app_has_no_unacknowledged_aws_solutions_finding():
    report = AwsSolutionsChecks().validate_scope(default_app().app)
    assert violations(report) == []
    assert report.success is True


def test_the_check_sees_a_finding_in_the_app():
    # Not vacuous: the same call on the same kind of app reports a resource that breaks a rule.
    built = build_app()
    sqs.Queue(built.primary, "UnencryptedQueue", encryption=sqs.QueueEncryption.UNENCRYPTED)
    found = violations(AwsSolutionsChecks().validate_scope(built.app))
    assert sorted(found) == [
        f"{AWS_SOLUTIONS}-{rule} at StreamFleet-Primary/UnencryptedQueue/Resource"
        for rule in ("SQS2", "SQS3", "SQS4")
    ]


def test_every_acknowledgment_is_expected_and_gives_a_specific_reason():
    for stack_name, acknowledged in acknowledgments(default_app()).items():
        assert {generalized(rule) for rule in acknowledged} == EXPECTED_ACKNOWLEDGMENTS, stack_name
        for rule, reason in acknowledged.items():
            assert len(reason) >= MIN_REASON_CHARS, (stack_name, rule, reason)


def test_every_acknowledgment_is_still_needed(monkeypatch):
    """Without the acknowledgments, exactly the acknowledged rules are reported."""
    for module in (event_ingestion, worker_fleet, api_gateway_account):
        monkeypatch.setattr(module, "acknowledge", lambda *args, **kwargs: None)
    report = AwsSolutionsChecks().validate_scope(build_app().app)
    reported = {generalized(violation.rule_name) for violation in report.violations}
    assert reported == EXPECTED_ACKNOWLEDGMENTS


def test_the_log_group_finding_is_specific():
    # Acknowledged for this Region's and account's log groups, nothing broader.
    for stack_name, acknowledged in acknowledgments(default_app()).items():
        region = default_app().primary.region if "Primary" in stack_name else "us-west-2"
        arn = f"arn:aws:logs:{region}:{TEST_ACCOUNT}:log-group:*"
        assert f"{AWS_SOLUTIONS}-IAM5[Resource::{arn}]" in acknowledged, stack_name


def test_execution_logging_turned_off_is_reported_unless_acknowledged(monkeypatch):
    # The construct's default logs execution errors (APIG6 satisfied); a caller who turns it off
    # gets APIG6 acknowledged with that reason, and without the acknowledgment it is reported.
    import aws_cdk as cdk

    from streamfleet_cdk.event_ingestion import EventIngestion, EventIngestionProps
    from streamfleet_cdk.tables import FleetTables, FleetTablesProps

    def ingestion_app(level: Any) -> cdk.App:
        app = cdk.App()
        stack = cdk.Stack(app, "Ingestion", env=cdk.Environment(region="eu-west-1"))
        tables = FleetTables(stack, "Tables", props=FleetTablesProps())
        EventIngestion(
            stack,
            "Ingestion",
            props=EventIngestionProps(
                lease_table=tables.lease_table,
                allowed_upstreams=("wss://*.example.com",),
                **({} if level == "default" else {"execution_logging_level": level}),
            ),
        )
        return app

    def apig6(app: cdk.App) -> list[str]:
        report = AwsSolutionsChecks().validate_scope(app)
        return [v.rule_name for v in report.violations if v.rule_name.endswith("-APIG6")]

    assert apig6(ingestion_app("default")) == []
    assert apig6(ingestion_app(None)) == []
    monkeypatch.setattr(event_ingestion, "acknowledge", lambda *args, **kwargs: None)
    assert apig6(ingestion_app(None)) == [f"{AWS_SOLUTIONS}-APIG6"]


def test_acknowledging_needs_a_reason():
    from streamfleet_cdk.nag import acknowledge

    with pytest.raises(ValueError, match=r"^reason: "):
        acknowledge(default_app().primary, "ECS2", "not needed")


# --- cfn-lint ---


@pytest.mark.parametrize("role", ["primary", "secondary"])
def test_cfn_lint_is_clean(role):
    built = default_app()
    stack = getattr(built, role)
    template: Path = built.template_file(stack)
    matches = lint_file(
        template,
        ManualArgs(regions=[stack.region], ignore_checks=sorted(CFN_LINT_IGNORED)),
    )
    assert [str(match) for match in matches] == []
