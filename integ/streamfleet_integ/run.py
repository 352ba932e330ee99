"""``make integ``: integ-runner's deploy, assert and destroy, with this project's pinned CDK CLI.

integ-runner is the convention, and ``integ_streamfleet.py`` is written for it (its name, its
:class:`~aws_cdk.integ_tests_alpha.IntegTest` and the ``integ.json`` manifest it writes). But
the newest integ-runner (2.197.10) reads cloud assemblies up to schema 53, and aws-cdk-lib
2.275.0 writes 55: it stops with ``AssemblyVersionMismatch`` before deploying anything. Until a
release reads 55, this module does what integ-runner does for one test case, reading the same
manifest, with the CDK CLI ``package.json`` pins (which reads 55):

1. :mod:`~streamfleet_integ.preflight` (settings, credentials; one ``error:`` line and exit 1);
2. ``cdk synth`` of ``integ_streamfleet.py`` into ``integ/cdk.out``, once;
3. ``cdk deploy`` of the test case's stacks, then of its assertion stack with ``--no-rollback``
   and ``--outputs-file`` (as integ-runner does, so that every assertion reports);
4. each ``AssertionResults*`` output of the assertion stack: ``success`` or ``fail``;
5. ``cdk destroy`` of every stack of the assembly, whatever happened (``--no-clean`` keeps them).

Exit status 0 only if both deployments succeeded and every assertion reported ``success``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path
from typing import TextIO

from streamfleet_integ import preflight
from streamfleet_integ.settings import INTEG_DIR, REPO_ROOT

CDK_CLI = REPO_ROOT / "node_modules" / ".bin" / "cdk"
INTEG_APP = "integ_streamfleet.py"
ASSEMBLY_DIR = INTEG_DIR / "cdk.out"
RESULTS_FILE_NAME = "assertion-results.json"
RESULTS_PREFIX = "AssertionResults"


def cdk(*args: str) -> int:
    """The pinned CDK CLI from integ/, its output left on the terminal (deploys take minutes)."""
    command = [str(CDK_CLI), *args, "--no-notices"]
    print(f"integ: cdk {' '.join(args)}", flush=True)
    return subprocess.run(command, cwd=INTEG_DIR, check=False).returncode


def manifest_case(assembly: Path) -> tuple[list[str], str]:
    """The stacks under test and the assertion stack of the assembly's one test case."""
    manifest = json.loads((assembly / "integ.json").read_text())
    (case,) = manifest["testCases"].values()
    return list(case["stacks"]), case["assertionStackName"]


def assertion_results(path: Path, assertion_stack: str) -> dict[str, dict[str, str]]:
    """``AssertionResults*`` outputs of the assertion stack, each ``{"status": ..., ...}``."""
    if not path.is_file():
        return {}
    outputs = json.loads(path.read_text()).get(assertion_stack, {})
    return {
        key: json.loads(value)
        for key, value in sorted(outputs.items())
        if key.startswith(RESULTS_PREFIX)
    }


def report(results: dict[str, dict[str, str]], out: TextIO) -> bool:
    """One line per assertion; whether every one succeeded (none at all is a failure)."""
    for key, result in results.items():
        status = "PASS" if result.get("status") == "success" else "FAIL"
        message = f": {result['message']}" if result.get("message") else ""
        out.write(f"integ: {status} {key.removeprefix(RESULTS_PREFIX)}{message}\n")
    return bool(results) and all(r.get("status") == "success" for r in results.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make integ", description=__doc__.split("\n")[0])
    parser.add_argument(
        "--no-clean", action="store_true", help="keep the stacks after the run (delete them later)"
    )
    options = parser.parse_args(argv)
    if preflight.main() != 0:
        return 1
    if cdk("synth", "--app", f"python3 {INTEG_APP}", "--output", str(ASSEMBLY_DIR), "--quiet"):
        return 1
    stacks, assertion_stack = manifest_case(ASSEMBLY_DIR)
    app = ("--app", str(ASSEMBLY_DIR), "--require-approval", "never")
    results = ASSEMBLY_DIR / RESULTS_FILE_NAME
    passed = False
    try:
        results.unlink(missing_ok=True)
        deployed = cdk("deploy", *app, *stacks) == 0 and (
            cdk(
                "deploy",
                *app,
                "--exclusively",
                "--no-rollback",
                "--outputs-file",
                str(results),
                assertion_stack,
            )
            == 0
        )
        passed = report(assertion_results(results, assertion_stack), sys.stdout) and deployed
    finally:
        if options.no_clean:
            print(f"integ: --no-clean: the stacks stay; delete them with: {destroy_hint()}")
        elif cdk("destroy", "--app", str(ASSEMBLY_DIR), "--all", "--force"):
            print(f"integ: the destroy failed; finish it with: {destroy_hint()}", file=sys.stderr)
            passed = False
    print(f"integ: {'passed' if passed else 'FAILED'}")
    return 0 if passed else 1


def destroy_hint() -> str:
    return f"cd integ && {CDK_CLI} destroy --app cdk.out --all --force"


if __name__ == "__main__":
    sys.exit(main())
