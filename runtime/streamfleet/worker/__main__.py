"""``python -m streamfleet.worker``: run one worker with configuration from the environment."""

from __future__ import annotations

import asyncio
import json
import sys

from .config import WorkerConfig
from .fleet import Worker


def main() -> int:
    try:
        config = WorkerConfig.from_env()
    except ValueError as exc:
        print(json.dumps({"event": "config_error", "error": str(exc)}), file=sys.stderr)
        return 2
    asyncio.run(Worker(config).run())
    return 0


if __name__ == "__main__":
    sys.exit(main())
