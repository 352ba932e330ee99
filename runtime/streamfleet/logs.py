"""Structured log records: the one way every Lambda function of the app, and the code it
shares with the CLI and the local harness, writes a log line.

One call, :func:`log_event`, emits a record through :mod:`logging` (never ``basicConfig``: the
Lambda runtime installs its handler, and a library must not configure logging for its host):

* the message is ``"<event> key=value ..."``, readable in text logs and in test output;
* the same fields go in ``extra``, which the Lambda runtime's JSON log format (``awslambdaric``'s
  ``JsonFormatter``) writes as top-level keys of the JSON log line, so CloudWatch Logs Insights
  can filter on ``decision``, ``reason``, ``route``... without parsing the message.

Field names that the runtime's formatter or :class:`logging.LogRecord` reserve (``message``,
``level``, ``requestId``...) are prefixed with ``field_``; values that are not JSON scalars are
turned into strings (the formatter would fail on them). ``secrets`` are strings that must never
appear in a log line (a bearer token, its payload segment): any value containing one of them is
replaced by ``[redacted]``.

:func:`configured` is how an entry point gets its configuration: a bad variable is reported as
one ``config_error`` record naming it, never as a traceback. Metrics are not log records: they
are EMF documents, built and written by :mod:`streamfleet.emf`.

Standard library only: the authorizer imports it, and loads no AWS SDK on a cold start.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any, Protocol, TypeVar

from .env import ConfigError

T = TypeVar("T", covariant=True)

REDACTED = "[redacted]"
# What LogRecord already has, plus the keys awslambdaric's JsonFormatter writes itself.
_RESERVED = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "timestamp",
    "level",
    "logger",
    "stackTrace",
    "errorType",
    "errorMessage",
    "requestId",
    "location",
    "tenantId",
    "aws_request_id",
    "tenant_id",
}
MIN_SECRET_CHARS = 8  # shorter fragments would redact innocent values by accident


def _scalar(value: Any) -> str | int | float | bool | None:
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def log_event(
    logger: logging.Logger,
    level: int,
    event: str,
    *,
    secrets: Iterable[str | None] = (),
    **fields: Any,
) -> None:
    """Log ``event`` with ``fields`` (``None`` values are left out) at ``level``."""
    if not logger.isEnabledFor(level):
        return
    hidden = [s for s in secrets if s and len(s) >= MIN_SECRET_CHARS]
    record: dict[str, Any] = {}
    for key, value in fields.items():
        if value is None:
            continue
        value = _scalar(value)
        if isinstance(value, str) and any(secret in value for secret in hidden):
            value = REDACTED
        record[key] = value
    text = " ".join(f"{key}={value}" for key, value in record.items())
    extra = {("field_" + k if k in _RESERVED else k): v for k, v in record.items()}
    extra["event"] = event
    logger.log(level, f"{event} {text}".rstrip(), extra=extra)


class Configuration(Protocol[T]):
    """What an entry point builds from its environment, and keeps while it does not change
    (:class:`~streamfleet.env.EnvironmentCache`, :class:`~streamfleet.warm.WarmContainer`)."""

    def get(self) -> T: ...


def configured(source: Configuration[T], logger: logging.Logger, context: Any) -> T:
    """``source.get()``, for a Lambda entry point: a :class:`ConfigError` is logged as the one
    ``config_error`` record of the invocation (ERROR, naming the variable) and raised again
    without the frames that found it, so the invocation still fails as before (the Lambda
    runtime reports its type and message, not a walk through the configuration code)."""
    try:
        return source.get()
    except ConfigError as bad:
        log_event(
            logger,
            logging.ERROR,
            "config_error",
            variable=bad.variable,
            error=str(bad),
            requestId=getattr(context, "aws_request_id", None),
        )
        raise bad.with_traceback(None) from None
