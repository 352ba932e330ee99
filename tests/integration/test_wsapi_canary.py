"""The canary: probe, fail-back hysteresis, state in DynamoDB, PutMetricData to CloudWatch.

Probes run against the local API Gateway stand-in; state and metrics go to moto's server.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import json
import time
import uuid

import boto3
import pytest
from hypothesis import given
from hypothesis import strategies as st
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from streamfleet import model
from streamfleet.aws import AsyncClient
from streamfleet.env import ConfigError
from streamfleet.wsapi import canary as canary_module
from streamfleet.wsapi import jwt
from streamfleet.wsapi.authorizer import Authorizer
from streamfleet.wsapi.canary.config import CanaryConfig
from streamfleet.wsapi.canary.health import (
    DynamoHealthStateStore,
    FailbackHysteresis,
    HealthState,
    MemoryHealthStateStore,
)
from streamfleet.wsapi.canary.metrics import CloudWatchAlarmState, CloudWatchPublisher
from streamfleet.wsapi.canary.probe import probe
from streamfleet.wsapi.canary.run import Canary, CanaryFault
from streamfleet.wsapi.canary.sweeper import ConnectionSweeper
from streamfleet.wsapi.canary.tokens import (
    KEY_REFRESH_SECONDS,
    KEY_RELOAD_MIN_SECONDS,
    MintedToken,
    SecretToken,
    StaticToken,
    token_source_from_env,
)
from streamfleet_client import Endpoint
from streamfleet_dev.emulator.websocket_gateway import (
    FailureMode,
    GatewaySettings,
    LocalGateway,
    wsapi_gateway,
)
from tests.wsapi_support import AUDIENCE, CANARY_KEY, KEY, REGION, authorizer, user_token

TOKENS = MintedToken(CANARY_KEY, AUDIENCE, subject="canary")
# A probe expected to be answered: ten times what a loaded 2-core machine may take, so that
# only an unhealthy Region (a fault the test injects) fails it, never the machine's speed.
PROBE_TIMEOUT = 20.0


# --- Hysteresis (pure) --------------------------------------------------------------------------


def reports(hysteresis: FailbackHysteresis, probes: list[bool]) -> list[int]:
    state, values = HealthState(), []
    for ok in probes:
        state = hysteresis.next(state, ok)
        values.append(int(state.reported_healthy))
    return values


def test_failover_is_fast_and_failback_slow() -> None:
    h = FailbackHysteresis(healthy_runs_to_recover=5, failures_to_trip=2)
    assert reports(h, [True, False, False, True, True, True, True, True, True]) == [
        1, 0, 0, 0, 0, 0, 0, 1, 1
    ]  # fmt: skip


def test_a_single_blip_is_not_held_against_the_region() -> None:
    # Tripping on one failed probe would make a blip that the 2-of-2 alarm ignores fail over.
    h = FailbackHysteresis(healthy_runs_to_recover=5, failures_to_trip=2)
    assert reports(h, [True, False, True, False, True]) == [1, 0, 1, 0, 1]


def test_a_failure_while_recovering_starts_the_streak_again() -> None:
    h = FailbackHysteresis(healthy_runs_to_recover=3, failures_to_trip=2)
    assert reports(h, [False, False, True, True, False, True, True, True]) == [
        0, 0, 0, 0, 0, 0, 0, 1
    ]  # fmt: skip


def specification(probes: list[bool], recover: int, trip: int) -> list[int]:
    """The hysteresis stated without state: run ``i`` reports healthy iff its probe succeeded
    and either no ``trip`` consecutive failures ever ended at or before ``i``, or, after the
    last such run of failures, ``recover`` consecutive successes ended at or before ``i``."""
    values = []
    for i, ok in enumerate(probes):
        trips = [j for j in range(trip - 1, i + 1) if not any(probes[j - trip + 1 : j + 1])]
        if not ok:
            values.append(0)
        elif not trips:
            values.append(1)
        else:
            last = trips[-1]
            recovered = any(
                all(probes[k - recover + 1 : k + 1]) for k in range(last + recover, i + 1)
            )
            values.append(int(recovered))
    return values


@given(
    probes=st.lists(st.booleans(), max_size=60),
    recover=st.integers(min_value=1, max_value=6),
    trip=st.integers(min_value=1, max_value=3),
)
def test_hysteresis_matches_its_specification(probes: list[bool], recover: int, trip: int) -> None:
    assert reports(FailbackHysteresis(recover, trip), probes) == specification(
        probes, recover, trip
    )


# --- Against a gateway --------------------------------------------------------------------------


MINUTE_MS = 60_000


def test_a_tick_counted_already_counts_nothing() -> None:
    """EventBridge and Lambda deliver at least once: two failed probes for one minute tripped
    the canary, so one bad minute moved traffic. A late run saving after the next counts
    nothing either."""
    h = FailbackHysteresis(healthy_runs_to_recover=3, failures_to_trip=2)
    state = h.next(HealthState(), False, MINUTE_MS)
    again = h.next(state, False, MINUTE_MS)
    assert (again.tripped, again.failure_streak, again.reported_healthy) == (False, 1, False)
    late = h.next(again, False, 0)
    assert (late.tripped, late.failure_streak) == (False, 1)
    assert h.next(again, False, 2 * MINUTE_MS).tripped  # the next minute's does


def test_a_failover_on_missing_data_fails_back_only_after_a_healthy_streak() -> None:
    """Two silent minutes (the canary did not run, or could not publish) fail the Region over
    without tripping the canary: its next good datapoint failed back at once. An ALARM that
    began after its previous run trips it now, whatever caused it; the older ALARM that its own
    reports keep up, or that CloudWatch has not ended yet after the recovery, does not."""
    h = FailbackHysteresis(healthy_runs_to_recover=3, failures_to_trip=2)
    state = h.next(HealthState(), True, 0)
    silent_alarm = 150_000  # minutes 1 and 2 had no datapoint: ALARM at 2:30
    values = []
    for minute in range(3, 8):
        state = h.next(state, True, minute * MINUTE_MS, alarm_since_ms=silent_alarm)
        values.append(int(state.reported_healthy))
    assert values == [0, 0, 1, 1, 1]  # three healthy minutes after the ALARM, then back
    # A new ALARM later (a missing datapoint again) trips it again.
    state = h.next(state, True, 9 * MINUTE_MS, alarm_since_ms=8 * MINUTE_MS + 30_000)
    assert (state.tripped, state.reported_healthy) == (True, False)


def test_a_tripped_canary_that_went_silent_counts_its_streak_again() -> None:
    """The streak fail-back needs is of consecutive minutes: a tripped canary that did not run
    for minutes (the alarm breached meanwhile on missing data) starts counting again."""
    h = FailbackHysteresis(healthy_runs_to_recover=3, failures_to_trip=2)
    state = HealthState(tripped=True, reported_healthy=False, healthy_streak=2, last_tick_ms=0)
    state = h.next(state, True, 10 * MINUTE_MS)  # ten minutes later
    assert (state.tripped, state.healthy_streak, state.reported_healthy) == (True, 1, False)


class FixedAlarm:
    """The alarm as a test sets it: in ALARM since ``since`` (epoch ms), or not (``None``)."""

    def __init__(self, since: int | None = None, error: Exception | None = None):
        self.since, self.error = since, error

    async def alarm_since_ms(self) -> int | None:
        if self.error is not None:
            raise self.error
        return self.since


async def test_each_run_reads_the_alarm_and_an_unreadable_one_changes_nothing(
    gateway: LocalGateway,
) -> None:
    alarm = FixedAlarm()
    canary = Canary(
        CanaryConfig(endpoint_url=gateway.url, api_id="a", timeout_seconds=PROBE_TIMEOUT),
        tokens=TOKENS,
        store=MemoryHealthStateStore(),
        publishers=[],
        alarm=alarm,
    )
    assert (await canary.run_once(0)).value == 1
    alarm.error = RuntimeError("AccessDenied")  # unreadable: as if there were no alarm
    assert (await canary.run_once(MINUTE_MS)).value == 1
    alarm.error, alarm.since = None, MINUTE_MS + 30_000  # an ALARM since the last run
    run = await canary.run_once(2 * MINUTE_MS)
    assert (run.value, run.state.tripped) == (0, True)


class DescribedAlarm:
    """A CloudWatch client answering DescribeAlarms with one alarm in ALARM."""

    def __init__(self, **alarm: object):
        self.alarm = {"StateValue": "ALARM", **alarm}

    async def call(self, operation: str, **params: object) -> dict[str, object]:
        assert operation == "describe_alarms" and params["AlarmNames"] == ["health"]
        return {"MetricAlarms": [self.alarm]}


async def test_an_alarm_is_in_alarm_since_its_transition_not_its_last_update() -> None:
    """StateUpdatedTimestamp moves while the alarm stays in ALARM (its evaluation state or
    reason changing): read as the ALARM's start, it passed for a new ALARM after a recovery."""
    entered = datetime.datetime(2026, 12, 6, 13, 0, tzinfo=datetime.UTC)
    updated = entered + datetime.timedelta(minutes=7)
    client = DescribedAlarm(StateTransitionedTimestamp=entered, StateUpdatedTimestamp=updated)
    since = await CloudWatchAlarmState(client, "health").alarm_since_ms()  # type: ignore[arg-type]
    assert since == int(entered.timestamp() * 1000)
    older = DescribedAlarm(StateUpdatedTimestamp=updated)  # a service without the newer field
    since = await CloudWatchAlarmState(older, "health").alarm_since_ms()  # type: ignore[arg-type]
    assert since == int(updated.timestamp() * 1000)


def test_the_schedule_tick_is_read_from_the_event() -> None:
    tick = canary_module.schedule_tick_ms({"time": "2026-12-06T13:57:00Z"})
    assert tick == 1796565420000
    for event in ({}, {"time": "yesterday"}, {"time": "2026-12-06T13:57:00"}, {"time": 5}):
        assert canary_module.schedule_tick_ms(event) is None


async def test_a_datapoint_lands_in_its_ticks_minute_however_late_it_is_sent(
    moto, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A datapoint without a timestamp landed in the minute it arrived: a probe that ran past
    the minute (up to its timeout) left its own minute empty and breached the next one too."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", moto.endpoint)
    api_id = f"api-{uuid.uuid4().hex[:6]}"
    minute_ms = (int(time.time() * 1000) // MINUTE_MS - 10) * MINUTE_MS  # 10 minutes ago
    cloudwatch = AsyncClient("cloudwatch")
    try:
        await CloudWatchPublisher(cloudwatch).publish(api_id, 0, False, tick_ms=minute_ms + 57_000)
    finally:
        cloudwatch.close()

    def datapoints(start_ms: int) -> int:
        stats = boto3.client("cloudwatch", region_name=REGION).get_metric_statistics(
            Namespace=model.HEALTH_METRIC_NAMESPACE,
            MetricName=model.HEALTH_METRIC_NAME,
            Dimensions=[{"Name": model.HEALTH_METRIC_DIMENSION_API_ID, "Value": api_id}],
            StartTime=start_ms / 1000,
            EndTime=(start_ms + MINUTE_MS) / 1000,
            Period=60,
            Statistics=["SampleCount"],
        )
        return int(sum(point["SampleCount"] for point in stats["Datapoints"]))

    assert (datapoints(minute_ms), datapoints(minute_ms + MINUTE_MS)) == (1, 0)


class Recorded:
    """A publisher that keeps what it was given."""

    def __init__(self) -> None:
        self.published: list[tuple[int, bool | None, int | None]] = []

    async def publish(self, api_id, value, probe_healthy, *, tick_ms=None) -> None:
        self.published.append((value, probe_healthy, tick_ms))


class BrokenKey:
    async def token(self) -> str | None:
        raise ValueError("the signing key cannot be read")


class Sweeps:
    def __init__(self) -> None:
        self.count = 0

    async def sweep(self):
        self.count += 1


async def test_a_fault_of_the_canarys_own_pages_as_such_and_moves_no_traffic() -> None:
    """An unreadable key was a failed probe: the Region failed over and every client was swept
    each run, and the run returned normally, so the canary's Errors alarm never fired. It now
    publishes the Region's standing: unhealthy only while tripped (a single failed probe before
    it must not make two breaching minutes with it)."""
    single_failure = HealthState(False, False, 1, 0, 3, MINUTE_MS)
    tripped = HealthState(False, True, 2, 0, 3, MINUTE_MS)
    for before, published_value in ((HealthState(), 1), (single_failure, 1), (tripped, 0)):
        store = MemoryHealthStateStore(before)
        published, sweeps = Recorded(), Sweeps()
        canary = Canary(
            CanaryConfig(endpoint_url="ws://127.0.0.1:9/x", api_id="a"),
            tokens=BrokenKey(),
            store=store,
            publishers=[published],
            disconnector=sweeps,  # type: ignore[arg-type]
        )
        with pytest.raises(CanaryFault, match="signing key"):
            await canary.run_once(2 * MINUTE_MS)
        assert published.published == [(published_value, None, 2 * MINUTE_MS)]
        assert sweeps.count == 0
        assert await store.load() == before  # no probe: the hysteresis counts nothing

    class Unreadable(MemoryHealthStateStore):
        async def load(self) -> HealthState:
            raise OSError("the state table does not answer")

    published = Recorded()
    canary = Canary(
        CanaryConfig(endpoint_url="ws://127.0.0.1:9/x", api_id="a"),
        tokens=BrokenKey(),
        store=Unreadable(),
        publishers=[published],
    )
    with pytest.raises(CanaryFault):
        await canary.run_once(2 * MINUTE_MS)
    assert published.published == []  # its standing unknown: no guess either way


async def test_a_rotated_key_is_used_within_the_refresh_bound() -> None:
    """The key was read once per container: after a rotation the authorizer enforced, a warm
    canary signed with the old key until its container was recycled, with no bound."""
    keys = [jwt.generate_signing_key(jwt.HS256, kid=kid) for kid in ("old", "new")]
    now = [0.0]

    class Secrets:
        async def call(self, operation, **params):
            return {"SecretString": json.dumps(jwt.public_jwk(keys[0]))}

    source = SecretToken(
        Secrets(),  # type: ignore[arg-type]
        "arn:secret",
        audience=AUDIENCE,
        clock=lambda: now[0],
    )

    async def kid() -> str | None:
        return jwt.split_token(await source.token()).kid

    assert await kid() == "old"
    keys.reverse()  # rotated
    now[0] = KEY_REFRESH_SECONDS - 1
    assert await kid() == "old"
    now[0] = KEY_REFRESH_SECONDS
    assert await kid() == "new"
    # A refresh that fails keeps signing with the key it has: no fault, no page.
    keys[0] = None  # type: ignore[call-overload]
    now[0] = 2 * KEY_REFRESH_SECONDS
    assert await kid() == "new"


class CountedSecrets:
    """Secrets Manager on moto, its reads counted."""

    def __init__(self) -> None:
        self.client = AsyncClient("secretsmanager")
        self.reads = 0

    async def call(self, operation: str, **params: object) -> dict[str, object]:
        self.reads += operation == "get_secret_value"
        return await self.client.call(operation, **params)


def canary_authorizer(*canary_keys: jwt.SigningKey) -> Authorizer:
    """The authorizer of :func:`authorizer` deployed with other canary keys."""
    config = authorizer().config
    return Authorizer(
        dataclasses.replace(config, canary_keys=json.dumps(jwt.jwks_document(canary_keys)))
    )


@pytest.fixture
def key_secret(moto, monkeypatch: pytest.MonkeyPatch):
    """A canary key secret on moto holding a first key: (boto3 client, ARN, that key)."""
    monkeypatch.setenv("AWS_ENDPOINT_URL_SECRETS_MANAGER", moto.endpoint)
    first = jwt.generate_signing_key(jwt.HS256, kid="first")
    manager = boto3.client("secretsmanager", region_name=REGION)
    arn = manager.create_secret(
        Name=f"canary-{uuid.uuid4().hex[:8]}", SecretString=json.dumps(jwt.public_jwk(first))
    )["ARN"]
    yield manager, arn, first
    manager.delete_secret(SecretId=arn, ForceDeleteWithoutRecovery=True)
    manager.close()


def secret_canary(
    gateway: LocalGateway, arn: str, now: list[float], **config: object
) -> tuple[Canary, CountedSecrets]:
    secrets = CountedSecrets()
    tokens = SecretToken(
        secrets,  # type: ignore[arg-type]
        arn,
        audience=AUDIENCE,
        clock=lambda: now[0],
    )
    canary = Canary(
        CanaryConfig(endpoint_url=gateway.url, api_id="a", timeout_seconds=PROBE_TIMEOUT, **config),
        tokens=tokens,
        store=MemoryHealthStateStore(),
        publishers=[],
    )
    return canary, secrets


async def test_a_rotation_the_authorizer_enforced_first_is_used_by_the_next_run(
    gateway: LocalGateway, key_secret
) -> None:
    """A warm canary signed with the key it had read until its refresh (5 minutes) came due:
    once the authorizer accepted only the new key, every run was refused, and the Region failed
    over on a fault of the canary's own. A refused token now reads the secret again at once."""
    manager, arn, old = key_secret
    new = jwt.generate_signing_key(jwt.HS256, kid="new")
    now = [0.0]
    canary, secrets = secret_canary(gateway, arn, now)
    gateway.authorizer = canary_authorizer(old)
    try:
        assert (await canary.run_once(0)).value == 1
        manager.put_secret_value(SecretId=arn, SecretString=json.dumps(jwt.public_jwk(new)))
        gateway.authorizer = canary_authorizer(new)  # enforced at once
        now[0] = KEY_RELOAD_MIN_SECONDS  # long before the refresh is due
        for minute in (1, 2):
            run = await canary.run_once(minute * MINUTE_MS)
            assert (run.probe.healthy, run.value) == (True, 1), run.probe.error
        assert secrets.reads == 2  # the first read, and one after the refusal
        # A key the authorizer refuses, though it is the secret's and the one before it is
        # refused too: the Region's refusal stands, and the secret is read again at most every
        # KEY_RELOAD_MIN_SECONDS however often the canary runs.
        gateway.authorizer = canary_authorizer(jwt.generate_signing_key(jwt.HS256, kid="x"))
        for minute, elapsed in ((3, KEY_RELOAD_MIN_SECONDS), (4, 1.0)):
            now[0] += elapsed
            run = await canary.run_once(minute * MINUTE_MS)
            assert (run.probe.healthy, run.probe.refused_status) == (False, 403)
        assert secrets.reads == 3
    finally:
        secrets.client.close()


async def test_a_new_key_in_the_secret_before_the_authorizer_accepts_it_moves_nothing(
    gateway: LocalGateway, key_secret
) -> None:
    """The secret changed before the authorizer accepted the new key (the runbook's first step
    skipped): at its next refresh a warm canary signed with the new key, was refused every run,
    and failed the Region over. It now falls back to the key before it, and moves to the new
    one when the authorizer takes it."""
    manager, arn, old = key_secret
    new = jwt.generate_signing_key(jwt.HS256, kid="new")
    now = [0.0]
    canary, secrets = secret_canary(gateway, arn, now)
    gateway.authorizer = canary_authorizer(old)
    try:
        assert (await canary.run_once(0)).value == 1
        manager.put_secret_value(SecretId=arn, SecretString=json.dumps(jwt.public_jwk(new)))
        for minute in range(1, 8):  # across the refresh (5 minutes)
            now[0] = minute * 60.0
            run = await canary.run_once(minute * MINUTE_MS)
            assert (run.probe.healthy, run.value) == (True, 1), (minute, run.probe.error)
        assert canary.tokens.signing_key.kid == "first"
        gateway.authorizer = canary_authorizer(new)  # the old key dropped
        for minute in (8, 9):
            now[0] = minute * 60.0
            run = await canary.run_once(minute * MINUTE_MS)
            assert (run.probe.healthy, run.value) == (True, 1), (minute, run.probe.error)
        assert canary.tokens.signing_key.kid == "new"
    finally:
        secrets.client.close()


async def test_a_key_the_authorizer_does_not_accept_is_the_canarys_own_fault(
    gateway: LocalGateway, key_secret
) -> None:
    """With the authorizer's keys known (JWT_CANARY_KEYS, as deployed), a secret whose key the
    authorizer does not accept pages as the canary's fault and publishes the Region's standing,
    where a refused probe failed the Region over."""
    _, arn, _ = key_secret
    elsewhere = jwt.generate_signing_key(jwt.HS256, kid="elsewhere")
    gateway.authorizer = canary_authorizer(elsewhere)
    now = [0.0]
    canary, secrets = secret_canary(gateway, arn, now, accepted_keys=(elsewhere.public(),))
    published = Recorded()
    canary.publishers = (published,)
    try:
        for minute in (0, 1, 2):
            now[0] = minute * 60.0
            with pytest.raises(CanaryFault, match="JWT_CANARY_KEYS"):
                await canary.run_once(minute * MINUTE_MS)
        assert [value for value, _, _ in published.published] == [1, 1, 1]  # never 0
    finally:
        secrets.client.close()


def test_the_canary_reads_the_keys_its_authorizer_accepts() -> None:
    env = {"CANARY_ENDPOINT_URL": "wss://x/prod", "CANARY_API_ID": "a"}
    assert CanaryConfig.from_env(env).accepted_keys is None
    keys = json.dumps(jwt.jwks_document([CANARY_KEY]))
    accepted = CanaryConfig.from_env({**env, "JWT_CANARY_KEYS": keys}).accepted_keys
    assert accepted is not None and jwt.same_key(accepted[0], CANARY_KEY.public())
    with pytest.raises(ConfigError, match="JWT_CANARY_KEYS"):
        CanaryConfig.from_env({**env, "JWT_CANARY_KEYS": "garbage"})


class StandInSecret:
    """A secret whose text a test sets, answered after ``delay`` seconds."""

    def __init__(self, key: jwt.SigningKey, delay: float = 0.0):
        self.text = json.dumps(jwt.public_jwk(key))
        self.delay = delay

    async def call(self, operation: str, **params: object) -> dict[str, object]:
        await asyncio.sleep(self.delay)
        return {"SecretString": self.text}


async def test_a_slow_secret_keeps_the_key_held_and_never_stands_for_the_region() -> None:
    """A read slower than the probe's timeout paged as the canary's fault and published the
    Region's standing, so a Region failing meanwhile read as healthy; the read is now bounded
    on its own and a held key goes on signing."""
    key = jwt.generate_signing_key(jwt.HS256, kid="k")
    secret, now = StandInSecret(key), [0.0]
    source = SecretToken(
        secret,  # type: ignore[arg-type]
        "arn:secret",
        audience=AUDIENCE,
        clock=lambda: now[0],
        read_timeout_seconds=0.05,
    )
    assert jwt.split_token(await source.token()).kid == "k"
    secret.delay = 1.0
    now[0] = KEY_REFRESH_SECONDS  # the refresh is due, and slow
    assert jwt.split_token(await source.token()).kid == "k"
    cold = SecretToken(
        secret,  # type: ignore[arg-type]
        "arn:secret",
        audience=AUDIENCE,
        read_timeout_seconds=0.05,
    )
    with pytest.raises(TimeoutError):
        await cold.token()  # nothing held: the canary's own fault


async def test_a_refused_run_starts_the_next_from_its_own_key_and_a_rewrite_keeps_the_other():
    old, new = (jwt.generate_signing_key(jwt.HS256, kid=kid) for kid in ("old", "new"))
    secret, now = StandInSecret(old), [0.0]
    source = SecretToken(
        secret,  # type: ignore[arg-type]
        "arn:secret",
        audience=AUDIENCE,
        clock=lambda: now[0],
    )
    await source.token()
    secret.text = json.dumps(jwt.public_jwk(new))
    now[0] = KEY_REFRESH_SECONDS
    await source.token()  # refreshed: the new key signs, the old one is kept
    assert source.signing_key.kid == "new"
    # The same key written again in another form changes nothing: the old one stays the other.
    secret.text = json.dumps(jwt.public_jwk(new)) + "\n"
    now[0] += KEY_RELOAD_MIN_SECONDS
    assert jwt.split_token(await source.refused()).kid == "old"
    # Both refused (a Region refusing every handshake): nothing left, and the next run starts
    # from the key this one began with, not from the one refused last.
    assert await source.refused() is None
    assert source.signing_key.kid == "new"


async def test_probe_outcomes(gateway: LocalGateway) -> None:
    endpoint = Endpoint(gateway.url, await TOKENS.token())
    healthy = await probe(endpoint, timeout=PROBE_TIMEOUT)
    assert healthy.healthy and healthy.error is None
    gateway.fail(FailureMode.THROTTLED)
    throttled = await probe(endpoint, timeout=PROBE_TIMEOUT)
    assert not throttled.healthy and "HTTP 500" in (throttled.error or "")
    gateway.fail(FailureMode.DOWN)
    down = await probe(endpoint, timeout=PROBE_TIMEOUT)
    assert not down.healthy and "HTTP 503" in (down.error or "")
    gateway.recover()
    unauthenticated = await probe(Endpoint(gateway.url, None), timeout=PROBE_TIMEOUT)
    assert not unauthenticated.healthy and "HTTP 401" in (unauthenticated.error or "")


async def test_a_custom_domain_is_probed_through_the_regional_name_given(
    gateway: LocalGateway,
) -> None:
    """The probe dialled the regional execute-api URL, so the custom domain's mapping and
    certificate were never probed. It now dials the domain's URL (its name in the Host header
    and, over TLS, the SNI) connected to the regional name it is given, whatever DNS says."""
    port = gateway.url.rsplit(":", 1)[1].split("/", 1)[0]
    domain_url = f"ws://ws.streamfleet.test:{port}/"  # .test never resolves
    endpoint = Endpoint(domain_url, await TOKENS.token())
    assert (await probe(endpoint, timeout=PROBE_TIMEOUT, connect_host="127.0.0.1")).healthy
    unresolved = await probe(endpoint, timeout=2)
    assert not unresolved.healthy
    with pytest.raises(ConfigError, match="CANARY_CONNECT_HOST"):
        CanaryConfig(endpoint_url=domain_url, api_id="a", connect_host="bad host/")


async def test_a_region_whose_state_store_fails_is_unhealthy_to_the_canary(
    gateway: LocalGateway, tables: tuple[str, str]
) -> None:
    """The canary's $connect wrote nothing and its heartbeat read nothing: with every DynamoDB
    call failing, users' handshakes got HTTP 500 and the canary reported the Region healthy."""
    state, connections = tables
    endpoint_token = await TOKENS.token()
    async with wsapi_gateway(
        GatewaySettings(region=REGION),
        authorizer=authorizer(),
        state_table=state,
        connections_table="no-such-table",  # every write and read of it fails
    ) as broken:
        refused = await probe(Endpoint(broken.url, endpoint_token), timeout=PROBE_TIMEOUT)
        assert not refused.healthy and "HTTP 500" in (refused.error or "")
    url, subprotocols = Endpoint(gateway.url, endpoint_token).handshake()
    async with connect(url, subprotocols=subprotocols) as ws:
        # The store stops answering after the handshake: the heartbeat must not be ponged.
        boto3.client("dynamodb", region_name=REGION).delete_table(TableName=connections)
        await ws.send(json.dumps({"action": "heartbeat"}))
        reply = json.loads(await asyncio.wait_for(ws.recv(), 5))
    assert (reply["type"], reply["error"]) == ("error", "unavailable")
    boto3.client("dynamodb", region_name=REGION).create_table(
        TableName=connections,
        KeySchema=[{"AttributeName": model.PK, "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": model.PK, "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )  # for the fixture's clean-up


async def test_a_silent_backend_times_out() -> None:
    def silent(event: dict, context: object) -> dict:
        return {"statusCode": 200}  # connects, never replies

    async with LocalGateway(
        GatewaySettings(region=REGION), authorizer=None, handler=silent
    ) as gateway:
        started = time.monotonic()
        result = await probe(Endpoint(gateway.url), timeout=0.3)
    assert not result.healthy and "no pong within 0.3 s" in (result.error or "")
    assert time.monotonic() - started < 5  # its own timeout ended it, not the test's


async def test_runs_keep_state_in_dynamodb_and_publish_to_cloudwatch(
    gateway: LocalGateway, tables: tuple[str, str], moto, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", moto.endpoint)
    _, connections = tables
    api_id = f"api-{uuid.uuid4().hex[:6]}"
    dynamodb, cloudwatch = AsyncClient("dynamodb"), AsyncClient("cloudwatch")
    try:
        canary = Canary(
            CanaryConfig(
                endpoint_url=gateway.url,
                api_id=api_id,
                timeout_seconds=PROBE_TIMEOUT,
                healthy_runs_to_recover=2,
                state_table=connections,
            ),
            tokens=TOKENS,
            store=DynamoHealthStateStore(dynamodb, table_name=connections, api_id=api_id),
            publishers=[CloudWatchPublisher(cloudwatch)],
        )
        values = [(await canary.run_once()).value]
        gateway.fail(FailureMode.THROTTLED)
        values += [(await canary.run_once()).value for _ in range(2)]
        gateway.recover()
        values += [(await canary.run_once()).value for _ in range(2)]
        assert values == [1, 0, 0, 0, 1]
        # The state survives between runs (each Lambda invocation starts from the item).
        stored = await DynamoHealthStateStore(
            dynamodb, table_name=connections, api_id=api_id
        ).load()
        assert stored == HealthState(True, False, 0, 2, 5)
        # A stale writer cannot count a probe twice.
        store = DynamoHealthStateStore(dynamodb, table_name=connections, api_id=api_id)
        assert await store.save(HealthState(version=6), HealthState(version=1)) is False
    finally:
        dynamodb.close()
        cloudwatch.close()
    metrics = boto3.client("cloudwatch", region_name=REGION).list_metrics(
        Namespace=model.HEALTH_METRIC_NAMESPACE,
        Dimensions=[{"Name": model.HEALTH_METRIC_DIMENSION_API_ID, "Value": api_id}],
    )["Metrics"]
    assert {m["MetricName"] for m in metrics} == {
        model.HEALTH_METRIC_NAME,
        model.PROBE_METRIC_NAME,
    }


async def test_the_alarm_state_is_read_from_cloudwatch(moto, monkeypatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL_CLOUDWATCH", moto.endpoint)
    name = f"health-{uuid.uuid4().hex[:6]}"
    client = boto3.client("cloudwatch", region_name=REGION)
    client.put_metric_alarm(
        AlarmName=name,
        Namespace=model.HEALTH_METRIC_NAMESPACE,
        MetricName=model.HEALTH_METRIC_NAME,
        Statistic="Minimum",
        Period=60,
        EvaluationPeriods=2,
        Threshold=1,
        ComparisonOperator="LessThanThreshold",
        TreatMissingData="breaching",
    )
    cloudwatch = AsyncClient("cloudwatch")
    try:
        alarm = CloudWatchAlarmState(cloudwatch, name)
        client.set_alarm_state(AlarmName=name, StateValue="OK", StateReason="test")
        assert await alarm.alarm_since_ms() is None
        before = int(time.time() * 1000) - 5_000
        client.set_alarm_state(AlarmName=name, StateValue="ALARM", StateReason="test")
        since = await alarm.alarm_since_ms()
        assert since is not None and since >= before
        assert await CloudWatchAlarmState(cloudwatch, "no-such-alarm").alarm_since_ms() is None
    finally:
        cloudwatch.close()


async def test_the_lambda_entry_point_reads_its_environment(
    gateway: LocalGateway, tables: tuple[str, str], moto, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, connections = tables
    env = {
        "CANARY_ENDPOINT_URL": gateway.url,
        "CANARY_API_ID": "api-entry",
        "CANARY_TIMEOUT_SECONDS": str(PROBE_TIMEOUT),
        "CANARY_STATE_TABLE_NAME": connections,
        "CANARY_SIGNING_KEY": json.dumps(jwt.public_jwk(CANARY_KEY)),
        "JWT_AUDIENCE": AUDIENCE,
        "AWS_ENDPOINT_URL_CLOUDWATCH": moto.endpoint,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    # Lambda runs the handler in a thread of its own, with no event loop: so does the test.
    result = await asyncio.to_thread(canary_module.handler, {}, None)
    assert result["healthy"] is True and result["value"] == 1 and result["error"] is None


def test_configuration_errors_name_the_variable() -> None:
    base = {"CANARY_ENDPOINT_URL": "wss://x.test/prod", "CANARY_API_ID": "abc"}
    assert CanaryConfig.from_env(base).healthy_runs_to_recover == 5
    with pytest.raises(ConfigError, match="CANARY_ENDPOINT_URL"):
        CanaryConfig.from_env({**base, "CANARY_ENDPOINT_URL": "https://x.test"})
    with pytest.raises(ConfigError, match="CANARY_HEALTHY_RUNS_TO_RECOVER"):
        CanaryConfig.from_env({**base, "CANARY_HEALTHY_RUNS_TO_RECOVER": "many"})
    with pytest.raises(ConfigError, match="CANARY_TOKEN_TRANSPORT"):
        CanaryConfig.from_env({**base, "CANARY_TOKEN_TRANSPORT": "header"})
    assert isinstance(token_source_from_env({"CANARY_TOKEN": "t"}), StaticToken)
    with pytest.raises(ConfigError, match="at most one"):
        token_source_from_env({"CANARY_TOKEN": "t", "CANARY_SIGNING_KEY": "k"})
    with pytest.raises(ConfigError, match="JWT_AUDIENCE"):
        token_source_from_env({"CANARY_SIGNING_KEY": json.dumps(jwt.public_jwk(KEY))})
    with pytest.raises(ConfigError, match="CANARY_DISCONNECT_WHEN_UNHEALTHY"):
        CanaryConfig.from_env({**base, "CANARY_DISCONNECT_WHEN_UNHEALTHY": "maybe"})
    with pytest.raises(ConfigError, match="CANARY_MANAGEMENT_ENDPOINT"):
        CanaryConfig.from_env({**base, "CANARY_MANAGEMENT_ENDPOINT": "wss://x.test"})
    assert CanaryConfig.from_env({**base, "CANARY_DISCONNECT_WHEN_UNHEALTHY": "false"}) == (
        CanaryConfig("wss://x.test/prod", "abc", disconnect_when_unhealthy=False)
    )


def test_the_management_endpoint_is_the_regional_api_itself() -> None:
    regional = "wss://abc.execute-api.eu-west-1.amazonaws.com/prod"
    assert CanaryConfig(regional, "abc").management_url() == (
        "https://abc.execute-api.eu-west-1.amazonaws.com/prod"
    )
    local = CanaryConfig("ws://127.0.0.1:1/", "abc", management_endpoint="http://127.0.0.1:2/s")
    assert local.management_url() == "http://127.0.0.1:2/s"


async def test_the_canarys_token_has_its_own_identity() -> None:
    token = await TOKENS.token()
    claims = jwt.verify(
        token, [CANARY_KEY.public()], issuer=model.CANARY_TOKEN_ISSUER, audience=AUDIENCE
    )
    assert claims["sub"] == "canary"
    assert claims["exp"] - claims["iat"] <= model.CANARY_MAX_TOKEN_LIFETIME_SECONDS
    with pytest.raises(jwt.UnknownKey):  # the user keys never verify it
        jwt.verify(token, [KEY.public()], issuer=model.CANARY_TOKEN_ISSUER, audience=AUDIENCE)


# --- Server-driven failover ---------------------------------------------------------------------


def sweeping_canary(
    gateway: LocalGateway, connections: str, dynamodb: AsyncClient, management: AsyncClient
) -> Canary:
    return Canary(
        CanaryConfig(
            endpoint_url=gateway.url,
            api_id=f"api-{uuid.uuid4().hex[:6]}",
            timeout_seconds=PROBE_TIMEOUT,
            healthy_runs_to_recover=2,
            failures_to_trip=2,
            state_table=connections,
        ),
        tokens=TOKENS,
        store=DynamoHealthStateStore(dynamodb, table_name=connections, api_id="api-sweep"),
        publishers=[],
        disconnector=ConnectionSweeper(
            dynamodb=dynamodb, management=management, table_name=connections
        ),
    )


async def test_an_unhealthy_region_closes_every_client_connection(
    gateway: LocalGateway, tables: tuple[str, str]
) -> None:
    _, connections = tables
    dynamodb = AsyncClient("dynamodb", region_name=REGION)
    management = AsyncClient(
        "apigatewaymanagementapi", region_name=REGION, endpoint_url=gateway.management_endpoint
    )
    protocols = [model.WS_APP_SUBPROTOCOL]
    sockets = [
        await connect(
            gateway.url, subprotocols=[*protocols, f"bearer.{user_token(f'u{i}')}"], open_timeout=5
        )
        for i in range(3)
    ]
    # A record whose connection is already gone (its $disconnect was lost).
    await dynamodb.call(
        "put_item",
        TableName=connections,
        Item={
            model.PK: {"S": model.ws_connection_pk("ghost")},
            model.WS_USER_ID: {"S": "u9"},
        },
    )
    try:
        canary = sweeping_canary(gateway, connections, dynamodb, management)
        healthy = await canary.run_once()
        assert healthy.value == 1 and healthy.sweep is None  # a healthy region is left alone
        gateway.fail(FailureMode.THROTTLED)
        first = await canary.run_once()
        # One failed probe is a blip (the 2-of-2 alarm ignores it): nobody is disconnected.
        assert first.value == 0 and not first.state.tripped and first.sweep is None
        tripped = await canary.run_once()
        assert tripped.state.tripped
        assert tripped.sweep is not None
        assert (tripped.sweep.closed, tripped.sweep.gone, tripped.sweep.failed) == (3, 1, 0)
        for ws in sockets:  # each client saw its socket closed by the server
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(ws.recv(), 5)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000
        scanned = await dynamodb.call("scan", TableName=connections)
        assert not [
            i for i in scanned["Items"] if i[model.PK]["S"].startswith(model.WS_CONNECTION_PREFIX)
        ]
        again = await canary.run_once()  # every run while unhealthy: nothing left to close
        assert again.sweep is not None and again.sweep.closed == 0
    finally:
        for ws in sockets:
            await ws.close()
        dynamodb.close()
        management.close()


async def test_sweeping_can_be_turned_off(gateway: LocalGateway, tables: tuple[str, str]) -> None:
    _, connections = tables
    dynamodb = AsyncClient("dynamodb", region_name=REGION)
    management = AsyncClient(
        "apigatewaymanagementapi", region_name=REGION, endpoint_url=gateway.management_endpoint
    )
    try:
        canary = sweeping_canary(gateway, connections, dynamodb, management)
        canary = Canary(
            CanaryConfig(**{**canary.config.__dict__, "disconnect_when_unhealthy": False}),
            tokens=TOKENS,
            store=canary.store,
            publishers=[],
            disconnector=canary.disconnector,
        )
        async with await connect(
            gateway.url, subprotocols=[f"bearer.{user_token('u1')}"], open_timeout=5
        ) as ws:
            gateway.fail(FailureMode.THROTTLED)
            runs = [await canary.run_once() for _ in range(3)]
            assert runs[-1].state.tripped and all(run.sweep is None for run in runs)
            await ws.send(json.dumps({"action": "heartbeat"}))
            assert "Internal server error" in await asyncio.wait_for(ws.recv(), 5)
    finally:
        dynamodb.close()
        management.close()
