"""Reading a Lambda's configuration from its environment: one error that names the variable."""

from __future__ import annotations

from collections.abc import Mapping


class ConfigError(ValueError):
    """A missing or invalid environment variable: every invocation fails, naming it."""

    def __init__(self, variable: str, message: str):
        super().__init__(f"{variable}: {message}")
        self.variable = variable


def required(env: Mapping[str, str], name: str) -> str:
    """``env[name]``, stripped; :class:`ConfigError` naming ``name`` when unset or blank."""
    value = env.get(name, "").strip()
    if not value:
        raise ConfigError(name, "required but not set")
    return value
