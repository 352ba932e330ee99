"""The client-facing WebSocket API's runtime: Lambda handlers, the ``$connect`` authorizer, the
canary, and local stand-ins (an API Gateway WebSocket gateway, a failover drill) that run the
same code on loopback.

Module map:

* :mod:`.handlers` — every route (``$connect``, ``$disconnect``, ``$default``, ``heartbeat``,
  ``getState``, ``bid``); replies through the Management API;
* :mod:`.authorizer` — the REQUEST authorizer (JWT in ``?token=`` or ``bearer.<jwt>``
  subprotocol);
* :mod:`.jwt` — RS256/ES256/HS256 JSON Web Token verification;
* :mod:`.canary` — the health probe that publishes ``App/WebSocketHealth``, with fail-back
  hysteresis;
* :mod:`.tables` — creates the state and connections tables where there is no CloudFormation;
* :mod:`.local_gateway` — API Gateway's WebSocket routing and Management API on loopback;
* :mod:`.drill` — a two-region failover drill (``python -m streamfleet_dev.wsapi.drill``).

Nothing here imports ``aws_cdk``.
"""
