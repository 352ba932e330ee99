"""checkov, the other template scanner, on the synthesized templates.

cdk-nag (``test_infra_nag.py``) checks the construct tree; checkov reads the templates as
CloudFormation gets them. A check judged not to apply is skipped in the template, on its
resource, with its reason (``Metadata.checkov.skip``, written by
:func:`streamfleet_cdk.nag.skip_checkov`); any other failed check fails the gate.

checkov takes seconds to start, so it runs once for this module, over one directory holding:

* ``judged/``: every template of the app (the fleet's and the WebSocket API's stacks of both
  Regions, built as ``app.py`` builds them, with ``cdk.json``'s context) and the WebSocket stacks
  with a custom domain (the failover deployment);
* ``unjudged/``: the same templates without their checkov skips, to show that each skip is still
  needed: without them, exactly the skipped checks fail.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
import pytest
from aws_cdk import aws_sqs as sqs
from aws_cdk.assertions import Template

from streamfleet.wsapi import jwt as jwt_runtime
from streamfleet_cdk.nag import CHECKOV, MIN_REASON_CHARS, skip_checkov
from tests.app_support import default_app
from tests.wsapi_app_support import default_websocket_app, domain_websocket_app

# Every check judged somewhere in the app. A new one fails this list on purpose: skipping a
# check is a decision for review, with its reason in the code.
EXPECTED_SKIPS = {
    "CKV_AWS_27",  # SQS queues: SSE-SQS, which the check does not count (at_rest.queue)
    "CKV_AWS_115",  # CDK's default-security-group provider: no reserved concurrency
    "CKV_AWS_116",  # Lambda dead-letter queues, by how each function is invoked
    "CKV_AWS_117",  # Lambda outside a VPC: public AWS endpoints only (functions.py)
    "CKV_AWS_120",  # the REST stage's cache: GET /connections/{id} is live state
    "CKV_AWS_158",  # log groups: CloudWatch Logs' own encryption (at_rest.log_group)
    "CKV_AWS_173",  # Lambda environments hold no secret (functions.py)
}
# Variables that hold a secret in a local run only (streamfleet.wsapi.canary): never a template's.
LOCAL_SECRET_VARIABLES = {"CANARY_TOKEN", "CANARY_SIGNING_KEY"}
# Variables that hold keys: public keys only in a template.
KEY_VARIABLES = {"JWT_KEYS", "JWT_CANARY_KEYS"}


@dataclass(frozen=True)
class Finding:
    check: str
    template: str  # variant/stack, e.g. "default/StreamFleet-Primary"
    resource: str  # type.logical id
    reason: str = ""

    def __str__(self) -> str:
        return f"{self.check} on {self.resource} in {self.template}"


@dataclass(frozen=True)
class Scan:
    templates: dict[str, dict[str, Any]]  # the judged templates, by variant/stack
    failed: dict[str, list[Finding]]  # "judged" / "unjudged" -> failed checks
    skipped: dict[str, list[Finding]]
    passed: dict[str, int]


def app_templates() -> dict[str, Path]:
    """Every stack of the app, by ``variant/stack name``, from the session's shared synths."""
    templates: dict[str, Path] = {}
    for variant, built in (
        ("default", default_app()),
        ("default", default_websocket_app()),
        ("domain", domain_websocket_app()),
    ):
        for stack in (built.primary, built.secondary):
            templates[f"{variant}/{stack.stack_name}"] = built.template_file(stack)
    return templates


def without_skips(template: dict[str, Any]) -> dict[str, Any]:
    stripped = json.loads(json.dumps(template))
    for resource in stripped["Resources"].values():
        metadata = resource.get("Metadata", {})
        metadata.pop(CHECKOV, None)
        if "Metadata" in resource and not metadata:
            del resource["Metadata"]
    return stripped


def run_checkov(directory: Path) -> dict[str, Any]:
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "checkov.main",
            "--directory",
            str(directory),
            "--framework",
            "cloudformation",
            "--output",
            "json",
            "--compact",
            "--skip-download",  # nothing from the network: policies and skips are local
        ],
        cwd=directory,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    # 0: nothing failed; 1: something did (the unjudged copies always do).
    assert completed.returncode in (0, 1), completed.stderr[-2000:]
    report = json.loads(completed.stdout)
    reports = report if isinstance(report, list) else [report]
    (cloudformation,) = [r for r in reports if r.get("check_type") == "cloudformation"]
    return cloudformation


def findings(checks: list[dict[str, Any]]) -> dict[str, list[Finding]]:
    """``{"judged": [...], "unjudged": [...]}`` from checkov's results."""
    found: dict[str, list[Finding]] = {"judged": [], "unjudged": []}
    for check in checks:
        part, variant, file_name = Path(check["file_path"]).parts[-3:]
        found[part].append(
            Finding(
                check=check["check_id"],
                template=f"{variant}/{file_name.removesuffix('.template.json')}",
                resource=check["resource"],
                reason=check["check_result"].get("suppress_comment", ""),
            )
        )
    return found


@pytest.fixture(scope="module")
def scan(tmp_path_factory) -> Scan:
    root = tmp_path_factory.mktemp("checkov")
    templates: dict[str, dict[str, Any]] = {}
    for name, path in app_templates().items():
        template = json.loads(path.read_text())
        templates[name] = template
        for part, content in (("judged", None), ("unjudged", without_skips(template))):
            target = root / part / f"{name}.template.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            if content is None:
                shutil.copyfile(path, target)
            else:
                target.write_text(json.dumps(content))
    report = run_checkov(root)
    results = report["results"]
    passed: dict[str, int] = {"judged": 0, "unjudged": 0}
    for check in results["passed_checks"]:
        passed[Path(check["file_path"]).parts[-3]] += 1
    assert results["parsing_errors"] == [], results["parsing_errors"]
    return Scan(
        templates=templates,
        failed=findings(results["failed_checks"]),
        skipped=findings(results["skipped_checks"]),
        passed=passed,
    )


def test_checkov_reports_no_unjudged_finding(scan):
    assert [str(finding) for finding in scan.failed["judged"]] == []


def test_checkov_scanned_every_template_and_sees_findings(scan):
    # Not vacuous: every template was read, and without the skips the same scan fails.
    assert len(scan.templates) == 6
    scanned = {f.template for f in scan.skipped["judged"]} | {
        f.template for f in scan.failed["unjudged"]
    }
    assert scanned == set(scan.templates)
    assert scan.passed["judged"] > 0
    assert scan.failed["unjudged"]


def test_every_skip_is_still_needed(scan):
    """Without the skips, exactly the skipped checks fail, on the same resources."""

    def keys(found: list[Finding]) -> set[tuple[str, str, str]]:
        return {(f.check, f.template, f.resource) for f in found}

    assert keys(scan.failed["unjudged"]) == keys(scan.skipped["judged"])
    assert scan.skipped["unjudged"] == []


def test_every_skip_is_expected_and_gives_a_specific_reason(scan):
    skipped: set[str] = set()
    for name, template in scan.templates.items():
        for logical_id, resource in template["Resources"].items():
            for skip in resource.get("Metadata", {}).get(CHECKOV, {}).get("skip", []):
                assert set(skip) == {"id", "comment"}, (name, logical_id, skip)
                assert len(skip["comment"].strip()) >= MIN_REASON_CHARS, (name, logical_id, skip)
                skipped.add(skip["id"])
    assert skipped == EXPECTED_SKIPS
    # checkov read the same reasons.
    assert all(len(f.reason) >= MIN_REASON_CHARS for f in scan.skipped["judged"])


def test_no_function_environment_holds_a_secret(scan):
    """What the CKV_AWS_173 skip says: names, URLs, limits and public keys only."""
    for name, template in scan.templates.items():
        for logical_id, resource in template["Resources"].items():
            if resource["Type"] != "AWS::Lambda::Function":
                continue
            variables = resource["Properties"].get("Environment", {}).get("Variables", {})
            where = f"{logical_id} in {name}"
            assert not set(variables) & LOCAL_SECRET_VARIABLES, where
            for variable, value in variables.items():
                assert "PRIVATE KEY" not in json.dumps(value), f"{variable} of {where}"
                if variable in KEY_VARIABLES:
                    jwt_runtime.parse_key_material(value, allow_symmetric=False)


# --- The helper ---


def queue_stack() -> tuple[cdk.Stack, sqs.Queue]:
    stack = cdk.Stack(cdk.App(), "T", env=cdk.Environment(region="eu-west-1"))
    return stack, sqs.Queue(stack, "Queue")


def test_skipping_a_check_needs_a_reason_and_a_check_id():
    _, queue = queue_stack()
    with pytest.raises(ValueError, match=r"^reason: skipping CKV_AWS_27 needs a specific"):
        skip_checkov(queue, "CKV_AWS_27", "not needed")
    with pytest.raises(ValueError, match=r"^check: expected a checkov check id"):
        skip_checkov(queue, "AwsSolutions-SQS3", "x" * MIN_REASON_CHARS)


def test_skips_on_one_resource_are_merged():
    stack, queue = queue_stack()
    first, second = "a reason that is long enough to be specific, one", "the other" * 10
    skip_checkov(queue, "CKV_AWS_27", first)
    skip_checkov(queue.node.default_child, "CKV2_AWS_73", second)  # the L1 resource itself
    skip_checkov(queue, "CKV_AWS_27", first)  # the same judgement again: no change
    with pytest.raises(ValueError, match=r"^check: CKV_AWS_27 is already skipped"):
        skip_checkov(queue, "CKV_AWS_27", second)
    (resource,) = Template.from_stack(stack).find_resources("AWS::SQS::Queue").values()
    assert resource["Metadata"][CHECKOV] == {
        "skip": [
            {"id": "CKV_AWS_27", "comment": first},
            {"id": "CKV2_AWS_73", "comment": second},
        ]
    }
