"""The end-to-end drill of live delivery, its short version: the real fleet, both
regions' fan-out from their assets, Python clients and a browser page, then a worker
``kill -9``, a network drop and a regional failover, and every client's log checked exactly.

The checker is tested on its own first: a drill whose check could not see a gap at the start,
a duplicate or a missing tail would pass whatever the system did.
"""

from __future__ import annotations

import pytest

from streamfleet_dev.upstream.fake import message_data
from streamfleet_dev.wsapi.browser import missing_prerequisites
from streamfleet_dev.wsapi.live_drill import (
    FAULTS,
    Delivery,
    LiveDrill,
    LiveDrillConfig,
    Watcher,
    run_live_drill,
)


def _checked(
    seqs: list[int],
    *,
    first_after: int | None,
    last: int,
    origin: int | None = None,
    data: dict[int, str] | None = None,
) -> list[str]:
    drill = LiveDrill(LiveDrillConfig())
    watcher = Watcher("c", "python", "s", "failover name", first_after=first_after)
    watcher.deliveries = [
        Delivery(seq, float(n), None, "live", (data or {}).get(seq, message_data("s", seq)))
        for n, seq in enumerate(seqs)
    ]
    drill.clients = [(watcher, None)]  # type: ignore[list-item]
    drill.report.last_seqs = {"s": last}
    drill.report.origins = {"s": origin}
    drill._check()
    return drill.report.problems


@pytest.mark.parametrize(
    ("seqs", "first_after", "last", "bad"),
    [
        ([1, 2, 3, 4], 0, 4, False),
        ([6, 7, 8], 5, 8, False),
        ([2, 3, 4], 0, 4, True),  # the first seq after the subscribe point never came
        ([1, 2, 2, 3, 4], 0, 4, True),  # delivered twice
        ([1, 3, 2, 4], 0, 4, True),  # out of order
        ([1, 2, 3], 0, 4, True),  # the stored tail never came
        ([], 0, 4, True),
    ],
    ids=["exact", "from-a-position", "gap-at-start", "duplicate", "reordered", "short", "none"],
)
def test_the_drills_check_sees_every_kind_of_wrong_log(seqs, first_after, last, bad) -> None:
    assert bool(_checked(seqs, first_after=first_after, last=last)) is bad


def test_without_a_subscribe_point_the_log_is_checked_from_the_streams_origin() -> None:
    assert not _checked([1, 2, 3], first_after=None, last=3, origin=0)
    assert _checked([3, 4], first_after=None, last=4, origin=0)  # 1 and 2 never came
    assert _checked([3, 4], first_after=None, last=4, origin=None)  # nothing to check from


def test_the_drills_check_sees_content_the_upstream_never_sent() -> None:
    assert _checked([1, 2, 3], first_after=0, last=3, data={2: "s:2 (rewritten)"})


def test_a_pause_belongs_to_the_fault_window_it_ends_in() -> None:
    watcher = Watcher("c", "browser", "s", "failover name")
    times = [0.0, 0.5, 1.0, 3.0, 3.5, 9.0, 9.5]  # pauses: 2 s ending at 3.0, 5.5 s ending at 9.0
    watcher.deliveries = [Delivery(n, at, None, "live") for n, at in enumerate(times)]
    assert watcher.longest_pause(1.0, 8.5) == (2.0, 0.0)  # the next window's pause is not ours
    assert watcher.longest_pause(8.5, 12.0) == (5.5, -5.0)  # began before the fault, ended in it


@pytest.mark.slow
async def test_clients_receive_every_seq_once_in_order_through_crash_drop_and_failover(
    tmp_path,
) -> None:
    missing = missing_prerequisites()
    if missing:
        pytest.fail("; ".join(missing) + ". Run `make web` (make test runs it first).")
    report = await run_live_drill(LiveDrillConfig(log_dir=tmp_path))
    summary = report.summary()
    assert report.ok, summary["problems"]
    assert [fault.name for fault in report.faults] == list(FAULTS)
    kill, _, failover = report.faults
    assert kill.detail["streams"], "the killed worker owned none of the watched streams"
    python = [w for w in report.watchers if w.kind == "python"]
    pages = [w for w in report.watchers if w.kind == "browser"]
    assert len(python) == 4 and len(pages) == 1
    secondary = failover.detail["pages_on"][0][-1] if failover.detail["pages_on"] else None
    for watcher in python:
        # Each ended at (at least) the last stored seq of its stream, so the check above
        # covered everything after the faults.
        assert watcher.seqs()[-1] == report.last_seqs[watcher.stream]
        if watcher.route == "failover name":
            assert len(watcher.regions()) == 2, watcher.regions()  # moved, and kept its cursor
        else:
            assert watcher.regions() == [watcher.route]  # the secondary's own fan-out
    assert secondary == next(w.route for w in python if w.route != "failover name")
