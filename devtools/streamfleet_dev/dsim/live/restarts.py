"""What getState promises a user whose client restarts: the subscriptions the server had
acknowledged come back (the new client follows the server's list), without the application
asking for them again."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamfleet_dev.dsim.live.client import Client
    from streamfleet_dev.dsim.live.world import World


def check_restarted_clients_resubscribed(world: World, clients: list[Client]) -> None:
    failover = world.schedule.failover
    if failover is not None and failover.kind == "region":
        # A cut-off primary holds back the state writes it made within the replication lag
        # (disaster-recovery.md): a client restarting in the secondary may not be told of
        # them until the primary recovers.
        return
    for client in clients:
        if client.restarted_at is None:
            continue
        for stream in sorted(client.known_before_restart):
            if stream in client.subscriptions or stream in client.refused:
                continue
            if stream not in client.app_wants or _excluded_ever(world, stream, client):
                continue  # unsubscribed since, or the server dropped it when it was refused
            world.problem(
                f"{client.plan.user} {stream}: subscribed before its restart at "
                f"{client.restarted_at:.1f} s, not subscribed again from getState"
            )


def _excluded_ever(world: World, stream: str, client: Client) -> bool:
    """Whether the stream's readers ever excluded the client's group: a subscribe refused then
    removes it from the user's list, by design, even if its reply never reached the client."""
    return any(region.excluded.get((stream, client.plan.group)) for region in world.regions)
