"""What the integration test needs from the tester, and the context the stacks are built with.

integ-runner cannot pass ``-c`` to the app, and what a run needs is the tester's own (an
upstream, an identity provider, key secrets), so it comes from a JSON file of context keys:
``integ/context.json`` (``STREAMFLEET_INTEG_CONTEXT`` names another), copied from
``integ/context.example.json``. It holds the app's own ``streamfleet:`` settings, read by
:class:`~streamfleet_cdk.config.AppConfig` exactly as ``-c`` would give them, and the test's
``streamfleet-integ:`` keys.

The context is ``cdk.json``'s, then :data:`INTEG_DEFAULTS`, then the file, then
:data:`INTEG_FORCED`, all given to the app as *post-CLI* context: integ-runner passes its own
set of feature flags, which must not replace the ones ``cdk.json`` fixes, or the stacks under
test would not be the ones ``cdk deploy`` deploys.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from streamfleet.validation import check_id, check_ws_url
from streamfleet_cdk.config import SECRET_NAME_PATTERN, AppConfig, context_key

INTEG_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = INTEG_DIR.parent
CDK_JSON = REPO_ROOT / "cdk.json"
CONTEXT_FILE_VARIABLE = "STREAMFLEET_INTEG_CONTEXT"
DEFAULT_CONTEXT_FILE = INTEG_DIR / "context.json"
EXAMPLE_CONTEXT_FILE = INTEG_DIR / "context.example.json"

# The stack of the probe and the assertions (the four under test keep the app's names).
ASSERTIONS_STACK_NAME = "StreamFleet-Integ-Assertions"

INTEG_PREFIX = "streamfleet-integ:"
UPSTREAM_URL = f"{INTEG_PREFIX}upstream_url"
USER_KEY_SECRET_NAME = f"{INTEG_PREFIX}user_key_secret_name"
USER_KEY_ID = f"{INTEG_PREFIX}user_key_id"
SUBJECT = f"{INTEG_PREFIX}subject"
CONNECTION_ID = f"{INTEG_PREFIX}connection_id"
INTEG_KEYS = (UPSTREAM_URL, USER_KEY_SECRET_NAME, USER_KEY_ID, SUBJECT, CONNECTION_ID)

DEFAULT_SUBJECT = "streamfleet-integ"
DEFAULT_CONNECTION_ID = "integ-streamfleet"

# Without these the run proves nothing: the probe's token would be refused (the example.com
# issuer), and a canary without a key reports unhealthy from the start, so "failing" the
# primary would change nothing Route 53 sees.
REQUIRED_APP_SETTINGS = (
    "jwt_issuer",
    "jwt_jwks_url",
    "canary_signing_key_secret_name",
    "canary_public_keys",
)

# Smaller than the app's defaults, the same constructs: one NAT gateway per Region instead of
# two, a fleet of at most two tasks, logs and messages kept a day. The file may set any of them.
INTEG_DEFAULTS: dict[str, Any] = {
    context_key("nat_gateways"): 1,
    context_key("max_tasks"): 2,
    context_key("log_retention_days"): 1,
    context_key("message_retention_days"): 1,
}
# Whatever the file says. Deletion protection would make the run's tables undeletable by the
# runner's destroy. Named invoke principals would deny the probe (its role is created by the
# run, after the API whose resource policy would have to name it), so the API is left to IAM.
INTEG_FORCED: dict[str, Any] = {
    context_key("deletion_protection"): False,
    context_key("invoke_principals"): [],
}


class IntegSettingsError(ValueError):
    """The context file is missing or wrong; the message names the file or the key."""


def context_file() -> Path:
    """The context file this run reads: ``$STREAMFLEET_INTEG_CONTEXT`` or integ/context.json."""
    named = os.environ.get(CONTEXT_FILE_VARIABLE)
    return Path(named).expanduser().resolve() if named else DEFAULT_CONTEXT_FILE


def cdk_json_context() -> dict[str, Any]:
    """The ``context`` of the repository's ``cdk.json``: feature flags and settings."""
    return json.loads(CDK_JSON.read_text())["context"]


@dataclass(frozen=True)
class IntegSettings:
    """The tester's settings for one run.

    Attributes:
        upstream_url: the ``wss://`` upstream the run STARTs a stream against; it must send
            messages by itself, at least one every few seconds, from the handshake on.
        user_key_secret_name: a Secrets Manager secret in the primary Region holding the
            private key (PEM) the probe signs its user token with; the JWKS at
            ``streamfleet:jwt_jwks_url`` must publish its public half.
        user_key_id: the ``kid`` of that key in the JWKS (``None``: no ``kid`` header).
        subject: the probe's ``sub``, named as the stream's reader (``user:<sub>``).
        connection_id: the fleet connection id of the stream the run STARTs.
        app_context: every other key of the file (the app's ``streamfleet:`` settings).
    """

    upstream_url: str
    user_key_secret_name: str
    user_key_id: str | None = None
    subject: str = DEFAULT_SUBJECT
    connection_id: str = DEFAULT_CONNECTION_ID
    app_context: Mapping[str, Any] | None = None

    @classmethod
    def from_file(cls, path: Path) -> IntegSettings:
        if not path.is_file():
            raise IntegSettingsError(
                f"{CONTEXT_FILE_VARIABLE}: {path} does not exist: copy "
                f"{EXAMPLE_CONTEXT_FILE.relative_to(REPO_ROOT)} to "
                f"{DEFAULT_CONTEXT_FILE.relative_to(REPO_ROOT)} (or name another file) and fill "
                "it in"
            )
        try:
            document = json.loads(path.read_text())
        except ValueError as exc:
            raise IntegSettingsError(f"{path}: not JSON ({exc})") from None
        if not isinstance(document, dict):
            raise IntegSettingsError(f"{path}: expected one JSON object of context keys")
        return cls.from_context(document, source=str(path))

    @classmethod
    def from_context(cls, document: Mapping[str, Any], *, source: str) -> IntegSettings:
        unknown = sorted(k for k in document if k.startswith(INTEG_PREFIX) and k not in INTEG_KEYS)
        if unknown:
            raise IntegSettingsError(f"{unknown[0]}: not a setting of the integration test")
        missing = [k for k in (UPSTREAM_URL, USER_KEY_SECRET_NAME) if document.get(k) is None]
        missing += [
            context_key(name)
            for name in REQUIRED_APP_SETTINGS
            if document.get(context_key(name)) is None
        ]
        if missing:
            raise IntegSettingsError(f"{missing[0]}: required, set it in {source}")
        values = {key: document.get(key) for key in INTEG_KEYS}
        for key, value in values.items():
            if value is not None and not isinstance(value, str):
                raise IntegSettingsError(f"{key}: expected a string, got {value!r}")
        try:
            check_ws_url(UPSTREAM_URL, values[UPSTREAM_URL])
            check_id(CONNECTION_ID, values[CONNECTION_ID] or DEFAULT_CONNECTION_ID)
        except ValueError as exc:
            raise IntegSettingsError(str(exc)) from None
        if not SECRET_NAME_PATTERN.fullmatch(values[USER_KEY_SECRET_NAME]):
            raise IntegSettingsError(
                f"{USER_KEY_SECRET_NAME}: not a Secrets Manager secret name: "
                f"{values[USER_KEY_SECRET_NAME]!r}"
            )
        return cls(
            upstream_url=values[UPSTREAM_URL],
            user_key_secret_name=values[USER_KEY_SECRET_NAME],
            user_key_id=values[USER_KEY_ID],
            subject=values[SUBJECT] or DEFAULT_SUBJECT,
            connection_id=values[CONNECTION_ID] or DEFAULT_CONNECTION_ID,
            app_context={k: v for k, v in document.items() if k not in INTEG_KEYS},
        )

    @property
    def upstream_origin(self) -> str:
        """``scheme://host[:port]`` of the upstream: the allow-list entry it needs."""
        parts = urlsplit(self.upstream_url)
        return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}"

    def context(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (``cdk.json``'s context), the run's defaults, the file, the forced keys;
        the upstream's origin is the allow-list unless the file names one."""
        upstreams = {context_key("allowed_upstreams"): [self.upstream_origin]}
        return {
            **base,
            **INTEG_DEFAULTS,
            **upstreams,
            **(self.app_context or {}),
            **INTEG_FORCED,
        }


def check_config(config: AppConfig) -> None:
    """What the file set must add up to for the run to prove anything (the key-by-key checks
    are :class:`AppConfig`'s own)."""
    if config.jwt_placeholders:
        key = context_key(config.jwt_placeholders[0])
        raise IntegSettingsError(
            f"{key}: still the example.com placeholder: the probe's token would be refused; "
            "name the identity provider whose JWKS publishes the probe's key"
        )
