"""``meridian bench telemetry``'s decode measurement runs without Redis on a tiny sample."""

from __future__ import annotations

import pytest

from meridian.fleet import SimulatedFleet
from protos import telemetry_pb2 as pb
from regional_scheduler.telemetry_cli import _decode_sample, measure_decode


def test_measure_decode_on_a_tiny_sample() -> None:
    fleet = SimulatedFleet(cluster="bench", region="bench", n_nodes=20, labels_every=5)
    payloads = _decode_sample(fleet, 60)  # one labels cycle: a fifth of the reports carry labels
    assert len(payloads) == 60
    rates = measure_decode(payloads, batch=25, seconds=0.0, cluster="bench")
    assert rates.passes == 1 and rates.reports == 60
    assert rates.labelled_fraction == pytest.approx(0.2)
    out = rates.as_dict()
    assert out["reports_per_s"] >= out["validated_reports_per_s"] > 0
    assert out["batch"] == 25 and out["passes"] == 1
    assert not any("ratio" in key or "upb" in key or "wire" in key for key in out)


def test_rejected_reports_and_an_empty_sample() -> None:
    payloads = [pb.NodeTelemetry(cluster="bench", node="a", sequence=1).SerializeToString(),
                pb.NodeTelemetry(cluster="other", node="b", sequence=1).SerializeToString(),  # foreign
                b"\xff\xff"]  # undecodable
    assert measure_decode(payloads, batch=2, seconds=0.0, cluster="bench").as_dict()["reports_per_s"] > 0
    with pytest.raises(ValueError):
        measure_decode([], seconds=0.0)
