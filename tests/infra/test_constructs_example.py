"""The construct library's example in docs/constructs.md, run exactly as a reader copies it: the
Python block under "Use one construct in your own stack", in a fresh interpreter, in an empty
directory. It must synthesize what it says it builds, so the page cannot drift from the library.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "constructs.md"
SECTION = "## Use one construct in your own stack"


def example() -> str:
    text = PAGE.read_text()
    section = text[text.index(SECTION) :]
    [block] = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.DOTALL)
    return block


def test_the_docs_example_synthesizes_what_it_says(tmp_path):
    script = tmp_path / "app.py"
    script.write_text(example())
    out = tmp_path / "cdk.out"
    result = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join((str(REPO / "runtime"), str(REPO))),
            "CDK_OUTDIR": str(out),
        },
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    resources = json.loads((out / "Streams.template.json").read_text())["Resources"]
    kinds = {resource["Type"] for resource in resources.values()}
    assert {
        "AWS::ApiGateway::Account",
        "AWS::DynamoDB::GlobalTable",
        "AWS::ApiGateway::RestApi",
        "AWS::SQS::Queue",
        "AWS::IAM::Role",
    } <= kinds
    # The producer's grants: it may invoke the API and send to the queue.
    granted = {
        action
        for resource in resources.values()
        if resource["Type"] == "AWS::IAM::Policy"
        for statement in resource["Properties"]["PolicyDocument"]["Statement"]
        for action in (
            statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]
        )
    }
    assert {"execute-api:Invoke", "sqs:SendMessage"} <= granted
    # The stage logs from its first deployment: it waits for the account's logging role.
    [stage] = [r for r in resources.values() if r["Type"] == "AWS::ApiGateway::Stage"]
    [account_id] = [k for k, r in resources.items() if r["Type"] == "AWS::ApiGateway::Account"]
    assert account_id in stage.get("DependsOn", [])
