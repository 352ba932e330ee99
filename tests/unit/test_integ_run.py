"""``make integ``'s runner (integ/streamfleet_integ/run.py) with a stand-in CDK CLI, and its
preflight with a stand-in AWS session.

The stand-in records each call and plays its part: ``synth`` writes the test case's manifest,
the assertion stack's ``deploy`` writes its outputs (the assertions' results), and any call can
be made to fail. What is checked: the order of the calls and their arguments (the test case's
stacks, then its assertion stack with ``--no-rollback`` and ``--outputs-file``, then the
destroy), the verdict, and that the destroy runs whatever failed, unless ``--no-clean``.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import pytest

from streamfleet.wsapi import jwt
from streamfleet_integ import preflight, run
from streamfleet_integ.settings import CONTEXT_FILE_VARIABLE, EXAMPLE_CONTEXT_FILE

STACKS = ["StreamFleet-Primary", "StreamFleet-Secondary"]
ASSERTIONS = "StreamFleet-Integ-Assertions"

STAND_IN = f"""#!{sys.executable}
import json, os, sys
from pathlib import Path
args = sys.argv[1:]
with open(__file__ + ".calls", "a") as calls:
    calls.write(json.dumps(args) + "\\n")
fail = os.environ.get("STAND_IN_FAIL", "")
if args[0] in fail.split(","):
    sys.exit(1)
if args[0] == "synth":
    out = Path(args[args.index("--output") + 1])
    out.mkdir(parents=True, exist_ok=True)
    case = {{"stacks": {STACKS!r}, "assertionStack": "{ASSERTIONS}",
            "assertionStackName": "{ASSERTIONS}"}}
    (out / "integ.json").write_text(json.dumps({{"testCases": {{"Case/DefaultTest": case}}}}))
if args[0] == "deploy" and "--outputs-file" in args:
    if "assertions" in fail.split(","):
        second = json.dumps({{"status": "fail", "message": "Expected 403 but received 200"}})
    else:
        second = json.dumps({{"status": "success"}})
    outputs = {{"AssertionResultsHttpApiCallabc": second,
               "AssertionResultsLambdaInvokedef": json.dumps({{"status": "success"}}),
               "SomethingElse": "x"}}
    target = Path(args[args.index("--outputs-file") + 1])
    target.write_text(json.dumps({{"{ASSERTIONS}": outputs}}))
"""


@pytest.fixture
def cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stand_in = tmp_path / "cdk"
    stand_in.write_text(STAND_IN)
    stand_in.chmod(0o755)
    monkeypatch.setattr(run, "CDK_CLI", stand_in)
    monkeypatch.setattr(run, "ASSEMBLY_DIR", tmp_path / "cdk.out")
    monkeypatch.setattr(run.preflight, "main", lambda: 0)
    monkeypatch.delenv("STAND_IN_FAIL", raising=False)
    return stand_in


def calls(cli: Path) -> list[list[str]]:
    path = Path(f"{cli}.calls")
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_passing_run_deploys_the_case_then_its_assertions_reports_and_destroys(cli, capsys):
    assert run.main([]) == 0
    assembly = str(run.ASSEMBLY_DIR)
    app = ["--app", assembly, "--require-approval", "never"]
    results = str(run.ASSEMBLY_DIR / run.RESULTS_FILE_NAME)
    synth = ["--app", "python3 integ_streamfleet.py", "--output", assembly, "--quiet"]
    assertions = ["--exclusively", "--no-rollback", "--outputs-file", results, ASSERTIONS]
    assert calls(cli) == [
        ["synth", *synth, "--no-notices"],
        ["deploy", *app, *STACKS, "--no-notices"],
        ["deploy", *app, *assertions, "--no-notices"],
        ["destroy", "--app", assembly, "--all", "--force", "--no-notices"],
    ]
    out = capsys.readouterr().out
    assert "integ: PASS HttpApiCallabc\n" in out and "integ: PASS LambdaInvokedef\n" in out
    assert "SomethingElse" not in out
    assert out.endswith("integ: passed\n")


def test_a_failed_assertion_fails_the_run_and_the_stacks_are_still_destroyed(
    cli, capsys, monkeypatch
):
    monkeypatch.setenv("STAND_IN_FAIL", "assertions")
    assert run.main([]) == 1
    assert [c[0] for c in calls(cli)] == ["synth", "deploy", "deploy", "destroy"]
    out = capsys.readouterr().out
    assert "integ: FAIL HttpApiCallabc: Expected 403 but received 200\n" in out
    assert out.endswith("integ: FAILED\n")


def test_a_failed_deployment_skips_the_assertions_and_still_destroys(cli, capsys, monkeypatch):
    monkeypatch.setenv("STAND_IN_FAIL", "deploy")
    assert run.main([]) == 1
    assert [c[0] for c in calls(cli)] == ["synth", "deploy", "destroy"]
    assert capsys.readouterr().out.endswith("integ: FAILED\n")


def test_no_clean_keeps_the_stacks_and_says_how_to_delete_them(cli, capsys):
    assert run.main(["--no-clean"]) == 0
    assert [c[0] for c in calls(cli)] == ["synth", "deploy", "deploy"]
    assert "destroy --app cdk.out --all --force" in capsys.readouterr().out


def test_a_failed_destroy_fails_the_run_and_says_how_to_finish_it(cli, capsys, monkeypatch):
    monkeypatch.setenv("STAND_IN_FAIL", "destroy")
    assert run.main([]) == 1
    captured = capsys.readouterr()
    assert "the destroy failed; finish it with:" in captured.err
    assert captured.out.endswith("integ: FAILED\n")


def test_a_failed_preflight_runs_nothing(cli, monkeypatch):
    monkeypatch.setattr(run.preflight, "main", lambda: 1)
    assert run.main([]) == 1
    assert calls(cli) == []


# --- the preflight, with a stand-in AWS session ---


class Session:
    """``boto3.Session`` as the preflight uses it: credentials, and STS's answer."""

    def __init__(self, credentials: object, account: str = "210987654321") -> None:
        self._credentials = credentials
        self._account = account

    def get_credentials(self) -> object:
        return self._credentials

    def client(self, service: str, region_name: str) -> object:
        assert (service, region_name) == ("sts", "us-east-1")
        account = self._account

        class Sts:
            def get_caller_identity(self) -> dict[str, str]:
                return {"Account": account, "Arn": f"arn:aws:iam::{account}:role/tester"}

        return Sts()


@pytest.fixture
def settings_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    document = json.loads(EXAMPLE_CONTEXT_FILE.read_text())
    # The example's placeholder public key is no key: give the canary a real one.
    key = jwt.generate_signing_key(jwt.ES256, "canary")
    document["streamfleet:canary_public_keys"] = json.dumps(jwt.jwks_document([key]))
    path = tmp_path / "context.json"
    path.write_text(json.dumps(document))
    monkeypatch.setenv(CONTEXT_FILE_VARIABLE, str(path))
    return path


def test_with_credentials_the_preflight_says_what_the_run_will_do(settings_file, monkeypatch):
    monkeypatch.setattr(preflight.boto3, "Session", lambda: Session(credentials=object()))
    out, err = io.StringIO(), io.StringIO()
    assert preflight.main(out, err) == 0
    assert err.getvalue() == ""
    plan = out.getvalue()
    assert "integ: account 210987654321 (arn:aws:iam::210987654321:role/tester)" in plan
    assert "us-east-1 (primary) and us-west-2 (secondary)" in plan
    assert "wss://feed.test.example.net/stream" in plan
    assert ", served by the secondary" in plan  # the example names a custom domain
    assert "destroy --app cdk.out --all --force" in plan


@pytest.mark.parametrize(
    ("session", "change", "error"),
    [
        (Session(credentials=None), {}, "error: no AWS credentials: set AWS_PROFILE"),
        (
            Session(credentials=object()),
            {"streamfleet:account": "123456789012"},
            "error: streamfleet:account is 123456789012, the credentials are of 210987654321",
        ),
        (
            Session(credentials=object()),
            {"streamfleet:jwt_issuer": "https://issuer.example.com/"},
            "error: streamfleet:jwt_issuer: still the example.com placeholder",
        ),
        (
            Session(credentials=object()),
            {"streamfleet:worker_cpu": 300},
            "error: streamfleet:worker_cpu: expected one of",
        ),
    ],
)
def test_the_preflight_refuses_with_how_to_run_and_one_error_line(
    settings_file, monkeypatch, session, change, error
):
    settings_file.write_text(json.dumps({**json.loads(settings_file.read_text()), **change}))
    monkeypatch.setattr(preflight.boto3, "Session", lambda: session)
    out, err = io.StringIO(), io.StringIO()
    assert preflight.main(out, err) == 1
    assert out.getvalue() == ""
    lines = err.getvalue().strip().splitlines()
    assert lines[0] == preflight.HOW_TO_RUN.splitlines()[0]
    assert lines[-1].startswith(error), lines[-1]
    assert [line for line in lines if line.startswith("error:")] == [lines[-1]]
