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
