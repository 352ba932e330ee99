"""The app as tests build it, and helpers for reading its templates.

:func:`build_app` builds an app with ``cdk.json``'s context, as ``cdk synth`` does (a bare
``cdk.App()`` would miss the feature flags, and test a template nobody deploys);
:func:`default_app` synthesizes the default app once per test run, so the fine-grained,
cdk-nag, cfn-lint and snapshot tests share one synth.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import cx_api
from aws_cdk.assertions import Template

import app as app_module
from stacks import FleetStack, add_fleet_stacks
from streamfleet_cdk.config import AppConfig, context_key

REPO_ROOT = Path(__file__).resolve().parents[1]
CDK_JSON = REPO_ROOT / "cdk.json"
TEST_ACCOUNT = "123456789012"


def cdk_json_context() -> dict[str, Any]:
    """The ``context`` of ``cdk.json``: feature flags and ``streamfleet:`` settings."""
    return json.loads(CDK_JSON.read_text())["context"]


@dataclass(frozen=True)
class BuiltApp:
    """An app with both stacks, synthesized."""

    app: cdk.App
    primary: FleetStack
    secondary: FleetStack
    assembly: cx_api.CloudAssembly

    def template(self, stack: FleetStack) -> Template:
        return Template.from_stack(stack)

    def template_file(self, stack: FleetStack) -> Path:
        return Path(self.assembly.directory) / stack.template_file


def build_app(context: dict[str, Any] | None = None) -> BuiltApp:
    """Both stacks, built as ``app.py`` builds them under ``cdk synth`` with ``cdk.json``."""
    app = cdk.App(
        context={**cdk_json_context(), context_key("account"): TEST_ACCOUNT, **(context or {})}
    )
    primary, secondary = add_fleet_stacks(app, AppConfig.from_context(app.node))
    return BuiltApp(app, primary, secondary, app.synth())


@functools.cache
def default_app() -> BuiltApp:
    """The app with ``cdk.json``'s settings, synthesized once per test run."""
    return build_app()


def stacks_of(built: BuiltApp) -> list[tuple[FleetStack, Template]]:
    return [(stack, built.template(stack)) for stack in (built.primary, built.secondary)]


def only(template: Template, resource_type: str, props: Any = None) -> tuple[str, dict[str, Any]]:
    """The logical id and properties of the one resource of a type (matching ``props``)."""
    found = template.find_resources(resource_type, {"Properties": props} if props else None)
    assert len(found) == 1, f"expected one {resource_type}, found {sorted(found)}"
    logical_id, resource = next(iter(found.items()))
    return logical_id, resource.get("Properties", {})


def logical_id(stack: cdk.Stack, construct: Any) -> str:
    return stack.get_logical_id(construct.node.default_child)


def flatten(value: Any) -> str:
    """A CloudFormation value as one string, intrinsics as ``<Id.Attr>``/``<Ref>`` (cdk-nag's
    notation), so policy resources compare as text."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and len(value) == 1:
        (function, argument), *_ = value.items()
        if function == "Fn::Join":
            return argument[0].join(flatten(item) for item in argument[1])
        if function == "Fn::GetAtt":
            return f"<{argument[0]}.{argument[1]}>"
        if function == "Ref":
            return f"<{argument}>"
    return json.dumps(value, sort_keys=True)


def arn_text(stack: cdk.Stack, arn: str) -> str:
    return flatten(stack.resolve(arn))


def as_list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else [value]


def role_statements(template: Template, role_id: str) -> list[dict[str, Any]]:
    """The role's statements, from its inline and attached policies, resources flattened."""
    role = template.to_json()["Resources"][role_id]["Properties"]
    assert not role.get("ManagedPolicyArns"), f"{role_id} has managed policies"
    documents = [policy["PolicyDocument"] for policy in role.get("Policies", [])]
    for policy in template.find_resources("AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"].get("Roles", []):
            documents.append(policy["Properties"]["PolicyDocument"])
    statements = []
    for document in documents:
        for statement in document["Statement"]:
            assert statement["Effect"] == "Allow", statement
            assert "NotAction" not in statement and "NotResource" not in statement, statement
            for resource in as_list(statement["Resource"]):
                statements.append({**statement, "Resource": flatten(resource)})
    return statements


def role_grants(template: Template, role_id: str) -> dict[str, set[str]]:
    """Every action the role is allowed, by resource: from its inline and attached policies."""
    grants: dict[str, set[str]] = {}
    for statement in role_statements(template, role_id):
        grants.setdefault(statement["Resource"], set()).update(as_list(statement["Action"]))
    return grants


def deployed(value: Any, placeholder: str) -> str:
    """A literal value as is; an intrinsic as what CloudFormation would put there."""
    return value if isinstance(value, str) else placeholder


def synthesize(outdir: Path, context: dict[str, Any] | None = None) -> Path:
    """The app as ``cdk synth`` builds it (``app.py``, ``cdk.json``'s context) into ``outdir``."""
    app = cdk.App(context={**cdk_json_context(), **(context or {})}, outdir=str(outdir))
    app_module.add_stacks(app)
    return Path(app.synth().directory)


# Snapshots mask asset hashes: a change of runtime code alone leaves them as they are.
ASSET_HASH = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")
MASK = "<asset-hash>"


def mask_asset_hashes(value: Any) -> Any:
    """``value`` with every 64-hex-digit asset hash replaced by :data:`MASK`, in keys too."""
    if isinstance(value, str):
        return ASSET_HASH.sub(MASK, value)
    if isinstance(value, dict):
        return {mask_asset_hashes(key): mask_asset_hashes(item) for key, item in value.items()}
    if isinstance(value, list):
        return [mask_asset_hashes(item) for item in value]
    return value
