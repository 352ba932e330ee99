#!/usr/bin/env python3
"""Integration test of both Regions on a real account: integ-runner's Python test case.

``make integ`` runs it (``integ-runner --language python --directory integ``, which runs
``python3 integ_streamfleet.py``); ``tests/infra/test_integ_synth.py`` synthesizes it in the
gate. What it deploys and asserts: integ/README.md and :mod:`streamfleet_integ.build`. What it
needs from the tester: :mod:`streamfleet_integ.settings`.
"""

import sys
from pathlib import Path

# integ-runner runs this file from integ/, without PYTHONPATH: put the app's import roots (as
# app.py does for `cdk synth`), the repository itself (app.py, stacks/) and this directory's
# package on the path.
_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent
for _root in (_HERE, _REPO, _REPO / "examples" / "auction", _REPO / "runtime"):
    if str(_root) not in sys.path:
        sys.path.insert(0, str(_root))

import aws_cdk as cdk  # noqa: E402

from streamfleet_cdk.config import ContextError  # noqa: E402
from streamfleet_integ.settings import (  # noqa: E402
    IntegSettings,
    IntegSettingsError,
    cdk_json_context,
    context_file,
)


def main() -> int:
    try:
        settings = IntegSettings.from_file(context_file())
        try:
            from streamfleet_integ.build import build
        except ModuleNotFoundError as missing:
            if not (missing.name or "").startswith("aws_cdk.integ_tests_alpha"):
                raise
            # The one package only this file needs: a virtualenv from before it was pinned.
            print(
                "error: aws-cdk.integ-tests-alpha is not installed: make setup installs it "
                "(requirements/cdk.txt pins it)",
                file=sys.stderr,
            )
            return 1
        # Post-CLI: over the feature flags integ-runner passes, so that the stacks under test
        # are built with cdk.json's, as `cdk deploy` builds them.
        app = cdk.App(post_cli_context=settings.context(cdk_json_context()))
        build(app, settings)
    except (IntegSettingsError, ContextError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
