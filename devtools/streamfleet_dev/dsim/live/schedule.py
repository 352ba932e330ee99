"""What one seed plays: streams, clients and their plans, the faults' rates."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TypeVar

from streamfleet.wsapi.handlers import config as handlers_config
from streamfleet_dev.dsim.live.failover import Failover

T = TypeVar("T")
GROUPS = ("team:red", "team:blue")  # the claim tags readers name


def _unless(heavy: bool, heavy_value: T, drawn: T) -> T:
    """``heavy_value`` in a heavy schedule, else ``drawn`` (drawn either way, so that every
    later draw of the seed is the same)."""
    return heavy_value if heavy else drawn


@dataclass(frozen=True)
class ClientPlan:
    user: str
    group: str
    # (stream, when it subscribes, whether from the origin: the whole log, else the newest)
    streams: tuple[tuple[str, float, bool], ...]
    drops: tuple[float, ...]  # when the client drops its connection itself
    unsubscribe: tuple[str, float, float] | None  # (stream, when, when it subscribes again)
    token_seconds: float  # how long each token it connects with lasts


@dataclass(frozen=True)
class Schedule:
    seed: int
    streams: tuple[str, ...]
    clients: tuple[ClientPlan, ...]
    duration: float  # upstreams write and faults happen until then
    message_every: float
    large_share: float
    restart_share: float
    rewrite_share: float
    hole_share: float  # the share of messages stored after the one that follows them
    lost_answers: float  # the share of requests whose answer is lost after they applied
    throttles: float  # the share of Management API calls refused with a 429
    crash_share: float  # the share of fan-out invocations killed part-way
    max_batch: int
    newest: int
    replay_max: int
    # Readers changes: (stream, group excluded, from when, until when or for good).
    revocations: tuple[tuple[str, str, float, float | None], ...]
    racing_changes: float  # the share of subscribes raced by a readers change of their group
    racing_writes: float  # the share of subscribes raced by a message in parts
    # How long stored messages live (their TTL), or None: for ever. A short one makes TTL
    # delete messages while clients replay them.
    retention_s: int | None
    failover: Failover | None  # a regional failover, or None: one Region only
    # Clients whose process restarts: (user, when). It comes back knowing only the positions
    # its application kept; its subscriptions it must take from getState.
    client_restarts: tuple[tuple[str, float], ...] = ()

    @classmethod
    def generate(cls, seed: int) -> Schedule:
        rng = random.Random(seed)
        streams = tuple(f"s{n}" for n in range(rng.randint(1, 3)))
        duration = rng.uniform(15.0, 40.0)
        clients = []
        for n in range(rng.randint(1, 4)):
            chosen = rng.sample(streams, rng.randint(1, len(streams)))
            unsubscribe = None
            if rng.random() < 0.3:
                when = rng.uniform(2.0, duration)
                unsubscribe = (chosen[0], when, when + rng.uniform(0.5, 30.0))
            clients.append(
                ClientPlan(
                    user=f"u{n}",
                    group=rng.choice(GROUPS),
                    streams=tuple(
                        (s, rng.uniform(0.0, duration), rng.random() < 0.3) for s in chosen
                    ),
                    drops=tuple(
                        sorted(rng.uniform(1.0, duration) for _ in range(rng.randint(0, 3)))
                    ),
                    unsubscribe=unsubscribe,
                    token_seconds=rng.choice((3.0, 15.0, 40.0, 3600.0, 3600.0)),
                )
            )
        revocations = []
        if rng.random() < 0.5:
            for _ in range(rng.randint(1, 3)):
                begins = rng.uniform(2.0, duration)
                ends = begins + rng.uniform(0.5, 8.0) if rng.random() < 0.7 else None
                revocations.append((rng.choice(streams), rng.choice(GROUPS), begins, ends))
        replay_max = rng.choice((3, 7, 50, handlers_config.DEFAULT_REPLAY_MAX_MESSAGES))
        # Drawn apart, so the other draws of a seed are the same whether it has a TTL or not.
        retention_s = random.Random(f"retention-{seed}").choice((None, None, None, 3, 6, 12))
        # One schedule in ten is heavy: a fast stream of large messages and no message limit
        # on a replay, so that a client subscribing from the origin late has a log longer
        # than a replay's byte budget (the other draws stay as they were).
        heavy = random.Random(f"heavy-{seed}").random() < 0.1
        return cls(
            seed=seed,
            streams=streams,
            clients=tuple(clients),
            duration=duration,
            message_every=_unless(heavy, 0.2, rng.choice((0.25, 0.5, 1.0))),
            large_share=_unless(heavy, 0.3, rng.choice((0.0, 0.02, 0.1))),
            restart_share=rng.choice((0.0, 0.01, 0.03)),
            rewrite_share=rng.choice((0.0, 0.05)),
            hole_share=rng.choice((0.0, 0.05, 0.2)),
            lost_answers=rng.choice((0.0, 0.01, 0.05)),
            throttles=rng.choice((0.0, 0.02, 0.1)),
            crash_share=rng.choice((0.0, 0.1, 0.3)),
            max_batch=rng.choice((1, 3, 10, 100)),
            newest=rng.randint(1, min(replay_max, handlers_config.DEFAULT_SUBSCRIBE_NEWEST)),
            replay_max=_unless(heavy, handlers_config.DEFAULT_REPLAY_MAX_MESSAGES, replay_max),
            revocations=tuple(revocations),
            racing_changes=rng.choice((0.0, 0.0, 0.1, 0.3)),
            racing_writes=rng.choice((0.0, 0.0, 0.1, 0.3)),
            retention_s=retention_s,
            failover=Failover.draw(seed, duration, tuple(c.user for c in clients)),
            client_restarts=_client_restarts(seed, duration, tuple(c.user for c in clients)),
        )

    def describe(self) -> str:
        clients = "; ".join(
            f"{c.user}({c.group}) "
            + ",".join(s + ("@0" if whole else "") for s, _, whole in c.streams)
            + f" drops={len(c.drops)} token={c.token_seconds:g}s"
            + (f" unsub={c.unsubscribe[0]}" if c.unsubscribe else "")
            for c in self.clients
        )
        changes = [(s, g, round(b, 3), e and round(e, 3)) for s, g, b, e in self.revocations]
        settings = ", ".join(
            f"{name} {value:g}"
            for name, value in (
                ("large", self.large_share),
                ("restarts", self.restart_share),
                ("rewrites", self.rewrite_share),
                ("holes", self.hole_share),
                ("lost answers", self.lost_answers),
                ("throttles", self.throttles),
                ("fan-out crashes", self.crash_share),
                ("racing readers changes", self.racing_changes),
                ("racing large writes", self.racing_writes),
            )
        )
        return (
            f"seed {self.seed}: {len(self.streams)} streams, {self.duration:.1f} s, a message "
            f"every {self.message_every:g} s, {settings}, batches <= {self.max_batch}, newest "
            f"{self.newest}, replay <= {self.replay_max}, readers changes {changes}, "
            f"retention {f'{self.retention_s} s' if self.retention_s else 'none'}; "
            f"clients: {clients}"
            + (f"; {self.failover.describe()}" if self.failover is not None else "")
            + (
                f"; client restarts {[(u, round(at, 3)) for u, at in self.client_restarts]}"
                if self.client_restarts
                else ""
            )
        )


CLIENT_RESTART_SHARE = 0.2  # of clients whose process restarts once


def _client_restarts(
    seed: int, duration: float, users: tuple[str, ...]
) -> tuple[tuple[str, float], ...]:
    """Which clients restart, and when (drawn apart: the schedule's other draws stay as they
    were)."""
    rng = random.Random(f"client-restarts-{seed}")
    return tuple(
        (user, when)
        for user in users
        if (when := rng.uniform(2.0, duration)) and rng.random() < CLIENT_RESTART_SHARE
    )
