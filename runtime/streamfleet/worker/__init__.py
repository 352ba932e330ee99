"""The worker: owns outbound upstream WebSocket connections through session leases.

Run it with ``python -m streamfleet.worker`` (configuration from the environment, see
:mod:`streamfleet.worker.config`).
"""
