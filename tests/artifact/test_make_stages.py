"""``make diff``, ``make deploy`` and ``make destroy``: the pinned CDK CLI on one stage's stacks.

There is no AWS account here. A dry run (``make -n``) of the repository's Makefile shows the
command each target runs. A copy of the Makefile in a scratch checkout, where the pinned CLI
(``node_modules/.bin/cdk``) is a stand-in that records its arguments, shows what runs for real:
which arguments reach the CLI, and that a destroy nobody confirmed never reaches it.
"""

from __future__ import annotations

import json
import os
import pty
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from stacks import (
    PRIMARY_STACK_NAME,
    PRIMARY_WS_STACK_NAME,
    SECONDARY_STACK_NAME,
    SECONDARY_WS_STACK_NAME,
)

REPO = Path(__file__).resolve().parents[2]
CLI = "node_modules/.bin/cdk"
STAGE_STACKS = {
    "primary": [PRIMARY_STACK_NAME, PRIMARY_WS_STACK_NAME],
    "secondary": [SECONDARY_STACK_NAME, SECONDARY_WS_STACK_NAME],
}
# What the developer's shell or an outer make could pass in: every run starts without them.
INHERITED = ("STAGE", "FORCE", "ARGS", "MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEOVERRIDES")
BAD_STAGES = ("prod", "Primary", "primary secondary", "")


def make(
    *args: str, cwd: Path = REPO, stdin: int | None = subprocess.DEVNULL, **env: str
) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in INHERITED}
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(cwd), *args],
        stdin=stdin,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def cli_call(dry_run: str) -> list[str]:
    """The arguments of the one CLI call a dry run prints (after ``node_modules/.bin/cdk``)."""
    calls = [line for line in dry_run.splitlines() if f" {CLI} " in f" {line} "]
    assert len(calls) == 1, f"expected one call of {CLI}:\n{dry_run}"
    words = shlex.split(calls[0])
    assert words[0] == f"PATH={REPO}/.venv/bin:$PATH", "not the virtualenv's python3 first"
    return words[words.index(CLI) + 1 :]


def test_the_cli_is_the_one_package_json_pins():
    pinned = json.loads((REPO / "package.json").read_text())["devDependencies"]["aws-cdk"]
    assert pinned[0].isdigit(), f"aws-cdk {pinned!r} is a range, not a pin"
    lock = json.loads((REPO / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/aws-cdk"]["version"] == pinned
    assert make("-n", "cdk").stdout == make("-n", "deploy", "STAGE=all").stdout.replace(
        " deploy --all", ""
    ), "make deploy runs another CLI than make cdk"


@pytest.mark.parametrize("target", ["diff", "deploy"])
@pytest.mark.parametrize("stage", ["primary", "secondary", "all"])
def test_diff_and_deploy_take_exactly_the_stages_stacks(target, stage):
    result = make("-n", target, f"STAGE={stage}", "ARGS=-c streamfleet:account=123456789012")
    assert result.returncode == 0, result.stderr
    assert "npx" not in result.stdout
    selection = ["--all"] if stage == "all" else ["--exclusively", *STAGE_STACKS[stage]]
    assert cli_call(result.stdout) == [
        target,
        *selection,
        "-c",
        "streamfleet:account=123456789012",
    ]


@pytest.mark.parametrize("stage", ["primary", "secondary", "all"])
def test_destroy_takes_the_stages_stacks_and_asks_unless_forced(stage):
    selection = ["--all"] if stage == "all" else STAGE_STACKS[stage]
    asks = make("-n", "destroy", f"STAGE={stage}")
    assert asks.returncode == 0, asks.stderr
    assert cli_call(asks.stdout) == ["destroy", *selection]
    forced = make("-n", "destroy", f"STAGE={stage}", "FORCE=1")
    assert cli_call(forced.stdout) == ["destroy", "--force", *selection]
    for not_forced in (
        make("-n", "destroy", f"STAGE={stage}", "FORCE=yes"),
        make("-n", "destroy", f"STAGE={stage}", FORCE="1"),  # from the environment
    ):
        assert cli_call(not_forced.stdout) == ["destroy", *selection]


@pytest.mark.parametrize("target", ["diff", "deploy", "destroy"])
@pytest.mark.parametrize("stage", [*BAD_STAGES, None])
def test_an_unknown_stage_stops_make_with_one_line(target, stage):
    result = make("-n", target, *([] if stage is None else [f"STAGE={stage}"]))
    assert result.returncode != 0
    assert result.stdout == "", "a command ran or was printed before the error"
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "STAGE: expected primary, secondary or all" in lines[0]
    assert f"got '{stage or ''}'" in lines[0]


# --- For real, against a stand-in CLI ----------------------------------------------------------

RECORDER = """#!/bin/sh
printf '%s\\n' "$@" > "$0.args"
printf '%s\\n' "$PATH" > "$0.path"
"""


@pytest.fixture
def checkout(tmp_path) -> Path:
    """The Makefile in a checkout whose every set-up step is done: the targets' prerequisites
    exist and are newer than what they are made from, so only the recipe runs."""
    shutil.copy(REPO / "Makefile", tmp_path / "Makefile")
    sources = ["requirements/runtime.txt", "requirements/cdk.txt", "package.json"]
    sources += ["package-lock.json", ".venv/bin/python"]
    stamps = [".venv/.checkout", ".venv/.installed-runtime", ".venv/.installed-cdk"]
    stamps += ["node_modules/.installed", CLI]
    for name in sources + stamps:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    for name in sources:
        os.utime(tmp_path / name, (1_000_000_000, 1_000_000_000))
    cli = tmp_path / CLI
    cli.write_text(RECORDER)
    cli.chmod(0o755)
    return tmp_path


def recorded(checkout: Path) -> list[str] | None:
    """The arguments the stand-in CLI was called with (``None``: it was not called)."""
    path = checkout / f"{CLI}.args"
    return path.read_text().splitlines() if path.exists() else None


def test_deploy_runs_the_pinned_cli_with_the_virtualenv(checkout):
    result = make(
        "deploy", "STAGE=secondary", "ARGS=-c streamfleet:secondary_active=true", cwd=checkout
    )
    assert result.returncode == 0, result.stderr
    assert recorded(checkout) == [
        "deploy",
        "--exclusively",
        *STAGE_STACKS["secondary"],
        "-c",
        "streamfleet:secondary_active=true",
    ]
    assert (checkout / f"{CLI}.path").read_text().startswith(f"{checkout}/.venv/bin:")


def test_destroy_without_a_terminal_or_force_never_reaches_the_cli(checkout):
    for result in (
        make("destroy", "STAGE=primary", cwd=checkout),
        make("destroy", "STAGE=primary", cwd=checkout, FORCE="1"),  # from the environment
    ):
        assert result.returncode != 0
        # The reason, then make's own line about the recipe that stopped.
        assert result.stderr.startswith("error: FORCE: "), result.stderr
        assert recorded(checkout) is None


def test_destroy_on_a_terminal_leaves_the_question_to_the_cli(checkout):
    controller, terminal = pty.openpty()
    try:
        result = make("destroy", "STAGE=primary", cwd=checkout, stdin=terminal)
    finally:
        os.close(terminal)
        os.close(controller)
    assert result.returncode == 0, result.stderr
    assert recorded(checkout) == ["destroy", *STAGE_STACKS["primary"]]  # CDK's own y/n


def test_destroy_with_force_deletes_without_asking(checkout):
    result = make("destroy", "STAGE=all", "FORCE=1", cwd=checkout)
    assert result.returncode == 0, result.stderr
    assert recorded(checkout) == ["destroy", "--force", "--all"]


def test_an_unknown_stage_runs_nothing(checkout):
    (checkout / ".venv/.installed-cdk").unlink()  # a set-up step would run, if anything ran
    result = make("deploy", "STAGE=prod", cwd=checkout)
    assert result.returncode != 0 and result.stdout == ""
    assert recorded(checkout) is None
    assert not (checkout / ".venv/.installed-cdk").exists()
