"""``python -m streamfleet.worker``: run one worker with configuration from the environment."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import sys

from botocore.exceptions import NoCredentialsError, NoRegionError

from .config import WorkerConfig
from .ecs_metadata import task_arn
from .fleet import Worker


def _fail(error: str) -> int:
    print(json.dumps({"event": "config_error", "error": error}), file=sys.stderr)
    return 2


def main() -> int:
    try:
        config = WorkerConfig.from_env()
        config = dataclasses.replace(config, task_arn=asyncio.run(task_arn(os.environ)))
    except ValueError as exc:
        return _fail(str(exc))
    try:
        worker = Worker(config)
    except NoRegionError:
        return _fail("AWS_REGION: not set (nor AWS_DEFAULT_REGION, nor a profile's region)")
    try:
        asyncio.run(worker.run())
    except NoCredentialsError:
        return _fail("AWS credentials: none found (environment, profile or task role)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
