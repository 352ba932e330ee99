"""A session keeper that reports every holder's deadline it takes: what the simulations'
one-owner checkers read. Importing this module changes nothing (unlike ``sim.world``)."""

from __future__ import annotations

from collections.abc import Callable

from streamfleet.lease.sessions import SessionKeeper

DeadlineRecord = Callable[[str, "int | None", float], None]  # (worker, session version, deadline)


class ObservedSessionKeeper(SessionKeeper):
    """Reports every change of the holder's deadline (a property over the real attribute)."""

    @property  # type: ignore[override]
    def deadline(self) -> float:
        return self.__dict__["_deadline"]

    @deadline.setter
    def deadline(self, value: float) -> None:
        self.__dict__["_deadline"] = value
        record = self.__dict__.get("_record_deadline")
        if record is not None:
            record(self.worker_id, self.version, value)


def observe_session(session: SessionKeeper, record: DeadlineRecord) -> None:
    """Make ``session`` report each deadline it takes to ``record``, from its current one on."""
    value = session.__dict__.pop("deadline")
    session.__class__ = ObservedSessionKeeper
    session.__dict__["_record_deadline"] = record
    session.deadline = value
