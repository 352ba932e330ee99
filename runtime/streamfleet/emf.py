"""CloudWatch Embedded Metric Format: metrics written as log lines, no PutMetricData call.

The worker, the fan-out and the authorizer publish their metrics this way: no IAM permission
and no request on the hot path. :func:`document` builds one document, :func:`line` makes it
one line, and :func:`write` writes that where CloudWatch Logs reads it, as a line of its own on
stdout (through :mod:`logging` it would be wrapped in the runtime's JSON log record, and
CloudWatch would not extract it).

In a Lambda function with the JSON log format and an application log level, Lambda filters
stdout lines too: a JSON line's ``level`` decides, and a line without one counts as INFO, so at
WARN every metric would be dropped. A document therefore carries the function's own level
(``AWS_LAMBDA_LOG_LEVEL``, the lowest that passes its filter) when there is one.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Mapping
from typing import Any

COUNT = "Count"
MILLISECONDS = "Milliseconds"
# Set by Lambda (a reserved variable) when the function logs JSON at an application log level.
LAMBDA_LOG_LEVEL_ENV = "AWS_LAMBDA_LOG_LEVEL"
LEVEL = "level"  # the key Lambda's log-level filter reads on a JSON line of stdout


def document(
    namespace: str,
    dimensions: Mapping[str, str],
    metrics: Mapping[str, tuple[float, str]],
    *,
    timestamp_ms: int | None = None,
    **properties: Any,
) -> dict[str, Any]:
    """One EMF document: ``metrics`` is ``name -> (value, unit)``, all under one dimension set
    (``dimensions``); ``properties`` are logged beside them, not published as metrics. A name
    used twice is a ``ValueError`` (the later one would silently replace the earlier)."""
    names = [*dimensions, *metrics, *properties, "_aws", LEVEL]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:
        raise ValueError(f"EMF document: {', '.join(repeated)} used more than once")
    level = os.environ.get(LAMBDA_LOG_LEVEL_ENV)
    return {
        **({LEVEL: level} if level else {}),
        "_aws": {
            "Timestamp": time.time_ns() // 1_000_000 if timestamp_ms is None else timestamp_ms,
            "CloudWatchMetrics": [
                {
                    "Namespace": namespace,
                    "Dimensions": [list(dimensions)],
                    "Metrics": [
                        {"Name": name, "Unit": unit} for name, (_, unit) in metrics.items()
                    ],
                }
            ],
        },
        **dimensions,
        **{name: value for name, (value, _) in metrics.items()},
        **properties,
    }


def line(doc: Mapping[str, Any]) -> str:
    """``doc`` as one compact JSON line (without its newline)."""
    return json.dumps(doc, separators=(",", ":"), default=str)


def write(text: str) -> None:
    """``text`` as a line of its own on stdout, flushed (a Lambda may freeze right after)."""
    sys.stdout.write(text + "\n")
    sys.stdout.flush()
