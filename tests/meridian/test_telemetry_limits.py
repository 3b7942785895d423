"""Reports whose values are each valid but break sums over nodes are dead-lettered (issue 22): a
60,000-character node name, power or energy of 1e308, allocatable CPU of 2**62 on two nodes."""

from __future__ import annotations

import numpy as np
import pytest

from meridian.bus import StreamEntry
from meridian.cluster_state import ClusterState
from meridian.model import GIB
from meridian.telemetry import decode_reports, extend_cluster_state
from protos import telemetry_pb2 as pb

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


def _report(node: str, **fields: object) -> bytes:
    values: dict[str, object] = {"allocatable_milli_cpu": 8000, "allocatable_memory_bytes": 32 * GIB,
                                 "used_milli_cpu": 500.0, "power_watts": 150.0, "energy_joules": 1000.0,
                                 "carbon_g_per_kwh": 200.0, "pue": 1.2}
    values.update(fields)
    return pb.NodeTelemetry(cluster="east", node=node, sequence=1, **values).SerializeToString()


@pytest.mark.parametrize(("node", "fields", "named"), [
    pytest.param("n" * 60_000, {}, "node name", id="huge-node-name"),
    pytest.param("a", {"power_watts": 1e308}, "power", id="power-1e308"),
    pytest.param("a", {"energy_joules": 1e308}, "energy", id="energy-1e308"),
    pytest.param("a", {"allocatable_milli_cpu": 2**62}, "allocatable cpu", id="cpu-2^62"),
    pytest.param("a", {"allocatable_memory_bytes": 2**62}, "allocatable memory", id="memory-2^62"),
    pytest.param("a", {"carbon_g_per_kwh": 1e9}, "carbon intensity", id="carbon-1e9"),
    pytest.param("a", {"pue": 1e6}, "pue", id="pue-1e6"),
])
def test_values_beyond_physical_limits_are_rejected(node: str, fields: dict[str, object], named: str) -> None:
    batch, rejected = decode_reports([StreamEntry("1-0", _report(node, **fields)),
                                      StreamEntry("1-1", _report("ok"))], cluster="east")
    assert batch.node == ["ok"]  # the good report of the same batch is kept
    (bad,) = rejected
    assert bad.reason_class == "invalid" and named in bad.reason and len(bad.reason) < 300


def test_two_giant_nodes_no_longer_wrap_the_cluster_sum() -> None:
    batch, rejected = decode_reports([StreamEntry(f"1-{i}", _report(f"g{i}", allocatable_milli_cpu=2**62))
                                      for i in range(2)], cluster="east")
    assert len(rejected) == 2 and len(batch) == 0
    state = extend_cluster_state(ClusterState.from_nodes([]), batch, np.arange(len(batch)))
    assert int(state.alloc_milli_cpu.sum()) == 0
