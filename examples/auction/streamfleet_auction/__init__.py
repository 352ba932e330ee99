"""The demo auction: a live auction on the client-facing WebSocket API, added to the core
handler through its route extensions (:mod:`streamfleet.wsapi.handlers.extensions`), never part
of the deployed core. The app's stacks add it when ``streamfleet:demo_auction`` is true (the
default); its CDK side is ``streamfleet_auction_cdk``, beside this package.

* ``bid``: ``{"action": "bid", "auction": "a1", "amount": 123}`` on a live auction counter. The
  bid is accepted only by a conditional write (``highest < amount``), so of two racing bids the
  lower one is refused, never silently overwritten; each accepted bid also leaves an immutable
  ``BID#<auction>#<amount>`` record;
* ``getState`` gains ``state`` (the user's last bid and counters) and, for the requested
  auction (``"auction": "a1"``) or else the user's last, ``auction`` as this Region's replica
  holds it.

**One writer per auction**: every bid is decided by a conditional write in the auction's home
Region's replica (``STATE_HOME_REGION``), whichever Region serves the bidder; the other Region
writes it across Regions, and refuses the bid as retryable (``home_unavailable``) when the home
does not answer. A state read is served from the local replica and says whether it may lag the
home (``stale``). The user's own item (last bid, counters) is written in the Region that serves
the user.

Modules, one job each: :mod:`.names` (keys, fields, route, reply, environment), :mod:`.messages`
(parsing), :mod:`.config` (the home Region and its client), :mod:`.auctions` (the logic),
:mod:`.extension` (the route extension), :mod:`.handler` (the Lambda entry point).
"""
