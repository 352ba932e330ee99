"""What the heartbeat promises a user: a connection whose Region answers nothing (cut off, its
socket still looking open) is given up within its missed heartbeats, so the client reconnects
(through the failover name, to the Region that answers) instead of waiting on it for ever."""

from __future__ import annotations

from streamfleet_dev.dsim.live.client import WATCH_TICK_S
from streamfleet_dev.dsim.live.heartbeat import GIVE_UP_WITHIN_S, MISSED_PONGS_BEFORE_RECONNECT
from streamfleet_dev.dsim.live.world import World

# The client looks at its heartbeats every tick: each heartbeat and the verdict on the last may
# come that much later than the real client's timers fire.
ALLOWED_S = GIVE_UP_WITHIN_S + (MISSED_PONGS_BEFORE_RECONNECT + 1) * WATCH_TICK_S


def check_cut_off_connections_given_up(world: World) -> None:
    for region in world.regions:
        for connection in region.gateway.connections.values():
            cut, left = connection.cut_off_at, connection.client_left_at
            if cut is None or (left is not None and left < cut):
                continue
            if left is None or left - cut > ALLOWED_S:
                waited = "never" if left is None else f"after {left - cut:.1f} s"
                world.problem(
                    f"{connection.id} ({connection.client.plan.user}): cut off with its Region "
                    f"at {cut:.1f} s, given up {waited} (at most {ALLOWED_S:g} s: "
                    f"{MISSED_PONGS_BEFORE_RECONNECT} heartbeats unanswered)"
                )
