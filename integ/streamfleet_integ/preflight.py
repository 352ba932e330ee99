"""What ``make integ`` checks before integ-runner synthesizes or deploys anything.

It reads the run's settings (:mod:`streamfleet_integ.settings`) and the AWS credentials, then
prints what the run is about to do: the account, the Regions, the upstream, how long it takes,
roughly what it costs and how to delete what an interrupted run leaves. Without credentials, or
with a settings file that is missing or wrong, it prints how to run the test, then one line
``error: ...``, and exits 1: integ-runner is never started.

``python -m streamfleet_integ.preflight`` (from integ/, with the repository's import roots on
the path, as ``make integ`` runs it).
"""

from __future__ import annotations

import sys
from typing import TextIO

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from streamfleet_integ.settings import (
    CONTEXT_FILE_VARIABLE,
    DEFAULT_CONTEXT_FILE,
    EXAMPLE_CONTEXT_FILE,
    REPO_ROOT,
    IntegSettings,
    IntegSettingsError,
    check_config,
    context_file,
)

HOW_TO_RUN = f"""\
make integ: the integration test of both Regions, on a real AWS account (integ/README.md).

It needs:
  - credentials of a test account with nothing else of StreamFleet in it (the stacks keep
    their names), CDK-bootstrapped in both Regions: AWS_PROFILE=... or AWS_ACCESS_KEY_ID=...;
  - Docker (the worker image is built for linux/arm64 at deploy);
  - its settings in {DEFAULT_CONTEXT_FILE.relative_to(REPO_ROOT)} (or the file
    {CONTEXT_FILE_VARIABLE} names), from {EXAMPLE_CONTEXT_FILE.relative_to(REPO_ROOT)}: the test
    upstream (wss://, sending by itself), the identity provider and the probe's key secret, the
    canary's key secret and public key, and for the DNS failover assertion the custom domain.

It deploys the four stacks and a probe stack, asserts (an estimated 1 to 1.5 hours in all, never
timed, mostly deployment and deletion), then deletes them all (ARGS=--no-clean keeps them).
It runs as integ-runner would, with the pinned CDK CLI: integ/README.md says why.
"""

PLAN = """\
integ: account {account} ({arn})
integ: Regions {primary} (primary) and {secondary} (secondary); upstream {upstream}
integ: assertions: unsigned START refused, signed START, stored, delivered (replay and live),
integ:   canary healthy, primary failed, alarm and health check unhealthy{dns}, fail-back
integ: an estimated 1 to 1.5 hours (never timed). Cost: a NAT gateway per Region, one
integ:   Fargate task, a Route 53 health check, alarms, Lambda and on-demand DynamoDB for that
integ:   long: a dollar or two (list prices as remembered, not a quote)
integ: a run that stops before its destroy leaves its stacks; delete them with
integ:   cd integ && ../node_modules/.bin/cdk destroy --app cdk.out --all --force
"""


def main(out: TextIO = sys.stdout, err: TextIO = sys.stderr) -> int:
    try:
        settings = IntegSettings.from_file(context_file())
        config = _config(settings)
    except IntegSettingsError as exc:
        return _refuse(err, str(exc))
    session = boto3.Session()
    if session.get_credentials() is None:
        return _refuse(
            err,
            "no AWS credentials: set AWS_PROFILE (or AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY) for the test account, then run make integ again",
        )
    try:
        identity = session.client("sts", region_name=config.primary_region).get_caller_identity()
    except (BotoCoreError, ClientError) as exc:
        return _refuse(err, f"the AWS credentials do not work: {exc}")
    if config.account is not None and config.account != identity["Account"]:
        return _refuse(
            err,
            f"streamfleet:account is {config.account}, the credentials are of "
            f"{identity['Account']}",
        )
    out.write(
        PLAN.format(
            account=identity["Account"],
            arn=identity["Arn"],
            primary=config.primary_region,
            secondary=config.secondary_region,
            upstream=settings.upstream_url,
            dns=", served by the secondary" if config.ws_custom_domain else "",
        )
    )
    return 0


def _config(settings: IntegSettings):
    """The app's settings as the integ app will read them (AppConfig's own checks included)."""
    import aws_cdk as cdk

    from streamfleet_cdk.config import AppConfig, ContextError
    from streamfleet_integ.settings import cdk_json_context

    app = cdk.App(post_cli_context=settings.context(cdk_json_context()))
    try:
        config = AppConfig.from_context(app.node)
    except ContextError as exc:
        raise IntegSettingsError(str(exc)) from None
    check_config(config)
    return config


def _refuse(err: TextIO, reason: str) -> int:
    err.write(HOW_TO_RUN)
    err.write(f"\nerror: {reason}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
