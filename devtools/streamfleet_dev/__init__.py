"""Development tools of the streaming fleet: never deployed, never bundled.

Local servers and the local mode, the fake upstream, the local API Gateway stand-in, the
failover drill, chaos runs and the fault simulation. Everything here drives the deployed code
(the ``streamfleet`` package, or the synthesized cloud assembly) from outside, through the same
endpoints AWS would offer.
"""
