"""The WebSocket API's stacks as tests build them, and helpers for reading their templates."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from aws_cdk import cx_api
from aws_cdk.assertions import Template

from stacks import WebSocketApiStack, add_websocket_stacks
from streamfleet_cdk.config import AppConfig, context_key
from tests.app_support import TEST_ACCOUNT, cdk_json_context, logical_id


@dataclass(frozen=True)
class BuiltWebSocketApp:
    app: cdk.App
    primary: WebSocketApiStack
    secondary: WebSocketApiStack
    assembly: cx_api.CloudAssembly

    @property
    def stacks(self) -> tuple[WebSocketApiStack, WebSocketApiStack]:
        return self.primary, self.secondary

    def template(self, stack: WebSocketApiStack) -> Template:
        return Template.from_stack(stack)

    def template_file(self, stack: WebSocketApiStack) -> Path:
        return Path(self.assembly.directory) / stack.template_file


def build_websocket_app(context: dict[str, Any] | None = None) -> BuiltWebSocketApp:
    """The WebSocket stacks as ``app.py`` adds them, with ``cdk.json``'s context."""
    app = cdk.App(
        context={**cdk_json_context(), context_key("account"): TEST_ACCOUNT, **(context or {})}
    )
    primary, secondary = add_websocket_stacks(app, AppConfig.from_context(app.node))
    return BuiltWebSocketApp(app, primary, secondary, app.synth())


@functools.cache
def default_websocket_app() -> BuiltWebSocketApp:
    return build_websocket_app()


# The stacks with a custom domain and failover records, and the canary's keys.
PRIMARY_REGION, SECONDARY_REGION = "us-east-1", "us-west-2"
DOMAIN = "ws.example.com"
ZONE_NAME = "example.com"
ZONE_ID = "Z0123456789ABCDEFGHIJ"
CERT_PRIMARY = f"arn:aws:acm:{PRIMARY_REGION}:{TEST_ACCOUNT}:certificate/11111111-aaaa"
CERT_SECONDARY = f"arn:aws:acm:{SECONDARY_REGION}:{TEST_ACCOUNT}:certificate/22222222-bbbb"
SECRET_NAME = "streamfleet/canary-signing-key"
# The public half of a canary signing key (fixed, so the snapshots do not change with it).
CANARY_PUBLIC_KEYS = (
    '{"keys":[{"alg":"ES256","use":"sig","kid":"canary-1","kty":"EC","crv":"P-256",'
    '"x":"GAgudWH6Vm9s8iNR4XqnWfcfFxnNH8TozCwC5lHoJt8",'
    '"y":"kH4vJBDjruLYPtJ39BibmJ9MHElZSrG7Y_FnxIUL4tQ"}]}'
)
DOMAIN_CONTEXT = {
    context_key("ws_domain_name"): DOMAIN,
    context_key("hosted_zone_id"): ZONE_ID,
    context_key("hosted_zone_name"): ZONE_NAME,
    context_key("ws_certificate_arn_primary"): CERT_PRIMARY,
    context_key("ws_certificate_arn_secondary"): CERT_SECONDARY,
    context_key("canary_signing_key_secret_name"): SECRET_NAME,
    context_key("canary_public_keys"): CANARY_PUBLIC_KEYS,
    context_key("jwt_issuer"): "https://login.example.org/",
    context_key("jwt_audience"): "auction-clients",
    context_key("jwt_jwks_url"): "https://login.example.org/.well-known/jwks.json",
    context_key("canary_healthy_runs_to_recover"): 7,
}


@functools.cache
def domain_websocket_app() -> BuiltWebSocketApp:
    return build_websocket_app(DOMAIN_CONTEXT)


def stacks_of(built: BuiltWebSocketApp) -> list[tuple[WebSocketApiStack, Template]]:
    return [(stack, built.template(stack)) for stack in built.stacks]


def resources(template: Template, resource_type: str) -> dict[str, dict[str, Any]]:
    return {
        key: value.get("Properties", {})
        for key, value in template.find_resources(resource_type).items()
    }


def function_of(template: Template, stack: cdk.Stack, function: Any) -> dict[str, Any]:
    return template.to_json()["Resources"][logical_id(stack, function)]["Properties"]


def variables_of(properties: dict[str, Any]) -> dict[str, Any]:
    return properties["Environment"]["Variables"]
