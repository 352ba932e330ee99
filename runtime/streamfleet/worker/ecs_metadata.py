"""Which ECS task this worker runs in, from the task metadata endpoint (v4).

ECS sets ``ECS_CONTAINER_METADATA_URI_V4`` in every container; ``GET <uri>/task`` answers the
task's metadata, its ``TaskARN`` among it. Outside ECS the variable is absent and the worker has
no task ARN. A value that is set but does not answer with a well-formed task ARN stops the
worker with a message naming the variable: a session that claims the wrong task could be ended
by another task's STOPPED event.
"""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from collections.abc import Mapping

from .. import model

TIMEOUT_SECONDS = 2.0
MAX_BODY_BYTES = 1 << 20
# arn:aws:ecs:<region>:<account>:task/<cluster>/<task id> (also the other AWS partitions)
TASK_ARN = re.compile(
    r"arn:aws[a-z-]*:ecs:[a-z0-9-]+:\d{12}:task/[A-Za-z0-9_-]{1,255}/[a-f0-9]{32}"
)


def check_task_arn(field: str, value: object) -> str:
    """``value`` if it is an ECS task ARN (long format); ``ValueError`` naming ``field``."""
    if not isinstance(value, str) or not TASK_ARN.fullmatch(value):
        raise ValueError(f"{field}: {str(value)[:120]!r} is not an ECS task ARN")
    return value


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS) as response:
        return response.read(MAX_BODY_BYTES + 1)


async def task_arn(env: Mapping[str, str]) -> str:
    """This task's ARN, or ``""`` outside ECS. Raises ``ValueError`` naming the variable."""
    base = env.get(model.ENV_ECS_METADATA_URI, "").strip()
    if not base:
        return ""
    if not base.startswith(("http://", "https://")):
        raise ValueError(f"{model.ENV_ECS_METADATA_URI}: {base[:120]!r} is not an http URL")
    try:
        body = await asyncio.to_thread(_fetch, f"{base.rstrip('/')}/task")
    except OSError as exc:
        raise ValueError(
            f"{model.ENV_ECS_METADATA_URI}: {base}/task did not answer ({exc})"
        ) from None
    if len(body) > MAX_BODY_BYTES:
        raise ValueError(f"{model.ENV_ECS_METADATA_URI}: the task metadata is larger than 1 MiB")
    try:
        metadata = json.loads(body)
    except ValueError:
        raise ValueError(f"{model.ENV_ECS_METADATA_URI}: the task metadata is not JSON") from None
    if not isinstance(metadata, dict):
        raise ValueError(f"{model.ENV_ECS_METADATA_URI}: the task metadata is not a JSON object")
    return check_task_arn(f"{model.ENV_ECS_METADATA_URI} TaskARN", metadata.get("TaskARN"))
