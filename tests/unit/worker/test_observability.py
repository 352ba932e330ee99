"""The worker's metric document: exactly what the scaling policy tracks."""

from __future__ import annotations

from streamfleet import model
from streamfleet.worker.observability import Counters, emf_document


def test_the_metric_document_names_exactly_what_the_scaling_policy_tracks():
    document = emf_document("svc", 12, Counters(leases_lost=1, handoffs=3))
    [directive] = document["_aws"]["CloudWatchMetrics"]
    assert directive["Namespace"] == model.METRIC_NAMESPACE
    assert directive["Dimensions"] == [[model.METRIC_DIMENSION_SERVICE]]
    names = [metric["Name"] for metric in directive["Metrics"]]
    assert model.METRIC_ACTIVE_CONNECTIONS in names
    assert document[model.METRIC_ACTIVE_CONNECTIONS] == 12
    assert document[model.METRIC_DIMENSION_SERVICE] == "svc"
