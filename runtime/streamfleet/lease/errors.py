"""What can go wrong with a lease, told apart so the worker reacts to each correctly."""

from __future__ import annotations


class LeaseError(Exception):
    """Base class of the lease store's errors."""


class LeaseLost(LeaseError):
    """A fenced write failed: someone else owns the connection now (or it is gone).

    ``holder`` is the current owner as DynamoDB reported it (``None`` when unowned or deleted).
    """

    def __init__(self, pk: str, holder: str | None, detail: str = ""):
        self.pk = pk
        self.holder = holder
        super().__init__(f"{pk}: lease lost (now held by {holder or 'nobody'}){detail}")


class SessionLost(LeaseError):
    """The session can no longer vouch for its connections (deadline passed, or fenced)."""


class StoreUnavailable(LeaseError):
    """DynamoDB stayed slow or unreachable until the deadline of the operation."""
