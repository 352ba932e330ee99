"""Where the web client's build, Chromium and the browser tests' screenshots are."""

from __future__ import annotations

import os
from pathlib import Path

from streamfleet_dev.local.servers import REPO_ROOT

WEB = REPO_ROOT / "clients" / "web"
DIST = WEB / "dist"
CHROMIUM = Path(os.environ.get("STREAMFLEET_CHROMIUM", "/usr/bin/chromium"))
ARTIFACTS = Path(os.environ.get("STREAMFLEET_TEST_ARTIFACTS", WEB / "test-artifacts"))
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
