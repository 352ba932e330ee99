"""Where the local tools keep what they fetched from PyPI across runs."""

from __future__ import annotations

import os
from pathlib import Path


def download_cache() -> Path:
    """``$XDG_CACHE_HOME/streamfleet``, by default ``~/.cache/streamfleet``: each entry is keyed
    by what it holds (pinned versions, interpreter), so a second run downloads nothing."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "streamfleet"
