"""Live delivery on a virtual clock: the real handlers, fan-out and cursors, seeded faults, and
a checker of what every client's application received.

One schedule runs, in one Region (in one schedule in five two, with a regional failover:
:mod:`.failover`, :mod:`.region`, :mod:`.replication`), for one seed:

* **the stores**: the messages, lease (a stream's readers and origin), subscriptions,
  connections and state tables in
  :class:`~streamfleet_dev.dsim.dynamodb_model.DynamoDBModel`, created as the synthesized
  template declares them, with the messages table's change stream;
* **upstreams and the sink**: each stream's messages stored as the worker's
  :meth:`~streamfleet.worker.sink.MessageSink.item` writes them: strings and JSON values,
  some too big for one frame (sent in parts), an upstream that restarts its numbering (a new
  epoch), rewrites of stored seqs (a worker that resumed), and pairs stored out of order (a
  batch that landed in part: a hole for a while);
* **the WebSocket API**: :class:`~streamfleet.wsapi.handlers.WsApiHandlers` behind a gateway
  stand-in that invokes it for ``$connect``, every message and ``$disconnect``, each message
  its own invocation (so two messages of one connection may be handled out of order), and
  posts through its Management API, in order per connection;
* **the fan-out**: :class:`~streamfleet.wsapi.fanout.Fanout` invoked by an event source that
  reads the change stream in batches of seeded sizes (a stream's records split across
  invocations), kills invocations part-way (a timeout or a crash after some posts were made)
  and retries the batch, and gives a batch up after its retries;
* **clients**: each user's client drives :class:`~streamfleet_client.streams.StreamCursor`
  exactly as :class:`~streamfleet_client.reconnecting.ReconnectingClient` does (subscribe on
  every connection from the position delivered, the gap and quiet watch, final refusals,
  ``token_expired``), reconnecting with full-jitter backoff and a fresh token; ``getState``
  after every connect, following the subscriptions it lists (:mod:`.state_restore`), and the
  application heartbeat, a connection given up after its missed pongs (:mod:`.heartbeat`);
  some clients restart, keeping only their positions;
* **faults**: every request to DynamoDB and the Management API takes a seeded time, an
  answer may be lost after the request was applied (the SDK sends it again: a duplicated
  write or post), a post may be throttled; clients drop their connections; tokens expire; a
  stream's readers exclude a group for a while or for good. Every invocation is killed at its
  function's timeout;
* **a regional failover**: the primary's API fails, or the whole Region is cut off (its
  writes held back from the secondary's replica); the failover name moves to the secondary,
  whose replica applies the primary's writes late and out of order; the primary may recover
  and the name move back. A cut-off Region's clients are told nothing: only their heartbeats
  make them leave. The state table replicates both ways.

Each actor is a greenlet on :class:`~streamfleet_dev.dsim.greenlets.Scheduler`: the code
under test interleaves at every request it makes, and every duration and choice is drawn from
the seed, so a seed replays the same schedule and the same trace on any machine.

The checker asks, for every client and every stream it subscribed to:

* what its application received equals the stored log (the primary's) after its subscribe
  point: each
  message byte for byte (and its JSON flag), in order, exactly once, each epoch change told
  before the new epoch's first message, nothing skipped that the log holds;
* a client that still reads the stream at the end received the whole log (the run ends with
  a quiet period without faults), or, reading from the secondary while the primary is still
  cut off, the log up to the first message that never replicated there;
* nothing stored after a readers change excluded a connection's user was posted to that
  connection while the change held in the connection's Region (in the secondary: once it
  replicated there), and nothing stored after its token expired;
* a client on a connection of a cut-off Region gave it up within its missed heartbeats
  (:mod:`.liveness`); a restarted client is subscribed again, from ``getState``, to what the
  server had acknowledged (:mod:`.restarts`);
* no invocation ran into its timeout, no subscribe posted more than its replay budget, and no
  fan-out invocation made more Management API calls than its frames, subscribers and
  attempts allow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from streamfleet_dev.dsim.live.actors import Upstream, run_control, run_event_source, run_ttl
from streamfleet_dev.dsim.live.checker import check
from streamfleet_dev.dsim.live.client import Client, run_client
from streamfleet_dev.dsim.live.failover import run_failover
from streamfleet_dev.dsim.live.schedule import ClientPlan, Schedule
from streamfleet_dev.dsim.live.world import SETTLE_S, World

# --- The run and its checker ----------------------------------------------------------------------


@dataclass
class Outcome:
    schedule: Schedule
    problems: list[str]
    trace: str
    requests: int
    faults: int
    delivered: int

    @property
    def ok(self) -> bool:
        return not self.problems


def run_schedule(schedule: Schedule) -> Outcome:
    # The code under test logs each refusal and failure: thousands of lines a schedule.
    quiet = logging.getLogger("streamfleet")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    world = World(schedule)
    try:
        scheduler = world.scheduler
        scheduler.spawn(run_control, world, name="control")
        for stream in schedule.streams:
            world.upstreams[stream] = upstream = Upstream(world, stream)
            scheduler.spawn(upstream.run, name=f"upstream-{stream}", delay=0.5)
        for region in world.regions:
            scheduler.spawn(
                run_event_source,
                world,
                region,
                name="event-source" if region.primary else f"event-source-{region.name}",
            )
        if schedule.failover is not None:
            scheduler.spawn(run_failover, world, name="failover")
        if schedule.retention_s is not None:
            scheduler.spawn(run_ttl, world, name="ttl")
        clients = [Client(world, plan) for plan in schedule.clients]
        for client in clients:
            scheduler.spawn(run_client, world, client, name=f"plan-{client.plan.user}")
        scheduler.run(schedule.duration)
        world.faults_on = False
        world.note("faults end")
        scheduler.run(schedule.duration + SETTLE_S + 5.0)
        for name, error in scheduler.failures:
            world.problem(f"task {name} raised {type(error).__name__}: {error}")
        delivered = check(world, clients)
        return Outcome(
            schedule,
            world.problems,
            "\n".join(world.trace) + "\n",
            world.requests,
            world.faults,
            delivered,
        )
    finally:
        world.scheduler.close()
        for region in world.regions:
            region.store.close()
        quiet.setLevel(level)


__all__ = ["ClientPlan", "Outcome", "Schedule", "World", "run_schedule"]
