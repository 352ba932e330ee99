"""Upstream WebSocket sources the workers dial: here, the fake one used by tests and local mode."""
