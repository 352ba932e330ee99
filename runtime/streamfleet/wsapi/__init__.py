"""The client-facing WebSocket API's runtime: Lambda handlers, the ``$connect`` authorizer and
the canary. The local stand-ins that run the same code on loopback (an API Gateway WebSocket
gateway, two local regions, the failover drill) live in ``streamfleet_dev.wsapi``.

Module map:

* :mod:`.handlers` — every core route (``$connect``, ``$disconnect``, ``$default``,
  ``heartbeat``, ``getState``, ``subscribe``, ``unsubscribe``) and those a deployment adds
  through ``extensions`` (the demo auction's ``bid``, ``examples/auction``); replies through the
  Management API; the canary is confined to ``heartbeat``. A package, one concern a module:
  ``config``, ``messages`` (parsing, refusals), ``extensions``, ``replier`` (Management API),
  ``state_store`` (versioned writes), ``connections``, ``subscribe`` (live delivery's replay);
  the package itself dispatches and is the Lambda entry point;
* :mod:`.authorizer` — the REQUEST authorizer (JWT in ``?token=`` or ``bearer.<jwt>``
  subprotocol), users' and the canary's identities kept apart;
* :mod:`.jwt` — the token policy around PyJWT (RS256/ES256/HS256);
* :mod:`.canary` — the health probe that publishes ``App/WebSocketHealth`` with fail-back
  hysteresis, and closes its region's connections while the region is unhealthy. A package:
  ``config``, ``probe``, ``tokens`` (its identity), ``health`` (hysteresis and its state),
  ``metrics`` (metric, alarm state), ``sweeper``, ``run`` (one run); the package itself is the
  Lambda entry point;
* :mod:`.handshake` — how a client opens a connection (URL, subprotocols, where the token
  goes): the canary dials as the clients do.

They log through :mod:`streamfleet.logs`, as every Lambda function of the app does.

Distributions each Lambda needs besides the standard library and the Lambda runtime's boto3:
the handlers none; the authorizer ``PyJWT`` and ``cryptography`` (RS256/ES256); the canary
``websockets``, ``PyJWT`` and ``cryptography``. Nothing here imports ``aws_cdk``.
"""
