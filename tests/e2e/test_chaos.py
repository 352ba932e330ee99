"""A short chaos run in the test suite (``make chaos`` is the long soak).

Random kill -9, SIGTERM, SIGSTOP longer than the lease, restarts, STOP/START churn and DynamoDB
outages (dynalite on disk, stopped and restarted) against real worker processes; then every
STARTED stream must be owned and connected within the recovery bound, every STOPPED one closed,
the upstream must never have seen two clients on a stream, and the stored messages must have no
gap or duplicate. ``CHAOS_SEED`` repeats a run.
"""

from __future__ import annotations

import os
import random

import pytest

from streamfleet_dev.emulator.servers import LOCAL_AWS_ENV
from streamfleet_dev.local.chaos import ChaosPlan, run_chaos

pytestmark = pytest.mark.slow


async def test_nothing_is_lost_or_doubled_under_chaos(tmp_path, capsys, monkeypatch):
    # run_chaos points the AWS variables at its own servers; give them back afterwards.
    for name in (*LOCAL_AWS_ENV, "AWS_ENDPOINT_URL_DYNAMODB", "AWS_ENDPOINT_URL_SQS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    seed = int(os.environ.get("CHAOS_SEED") or random.randrange(1, 10**6))
    # Three of the streams have a hostile upstream (poison frames, gaps): nothing changes for
    # the others, and theirs hold exactly what a correct worker stores.
    plan = ChaosPlan(workers=4, streams=24, duration_seconds=20, seed=seed, hostile_streams=3)
    with capsys.disabled():
        print(f"\nchaos: CHAOS_SEED={seed} repeats this run")

    report = await run_chaos(plan, tmp_path)

    with capsys.disabled():
        print("\n" + report.summary())
    assert sum(report.injected.values()) >= 8, report.injected
    assert report.failures == [], report.summary()
