"""The worker's metric document: exactly what the scaling policy tracks."""

from __future__ import annotations

from streamfleet import model
from streamfleet.worker.observability import Counters, RateLimitedLog, emf_document


def test_the_metric_document_names_exactly_what_the_scaling_policy_tracks():
    document = emf_document("svc", 12, Counters(leases_lost=1, handoffs=3))
    [directive] = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == model.METRIC_NAMESPACE
    assert directive["Dimensions"] == [[model.METRIC_DIMENSION_SERVICE]]
    names = [metric["Name"] for metric in directive["Metrics"]]
    assert model.METRIC_ACTIVE_CONNECTIONS in names
    assert document[model.METRIC_ACTIVE_CONNECTIONS] == 12
    assert document[model.METRIC_DIMENSION_SERVICE] == "svc"


def test_a_repeated_event_is_logged_once_per_interval_and_the_rest_counted():
    lines: list[tuple[str, dict]] = []
    now = [100.0]
    log = RateLimitedLog(
        lambda event, **f: lines.append((event, f)), interval=10, clock=lambda: now[0]
    )
    for _ in range(1000):
        log("upstream_frame_refused", pk="CONN#a")
    log("upstream_gap", pk="CONN#a")  # another event has its own interval
    now[0] += 10
    log("upstream_frame_refused", pk="CONN#a")

    assert lines == [
        ("upstream_frame_refused", {"pk": "CONN#a"}),
        ("upstream_gap", {"pk": "CONN#a"}),
        ("upstream_frame_refused", {"pk": "CONN#a", "suppressed": 999}),
    ]


def test_the_counts_go_out_with_the_document_and_start_again():
    counters = Counters(frames_refused=7)
    assert emf_document("svc", 1, counters)[model.METRIC_FRAMES_REFUSED] == 7
    counters.reset()
    assert counters == Counters()
