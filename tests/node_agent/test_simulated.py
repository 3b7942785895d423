"""The simulated fleet behind ``meridian agent --simulate-nodes``: shapes from the trace, the power
model's coefficients, integrated energy, the carbon series replayed, labels every Nth report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meridian.carbon_feed import CarbonFeed
from meridian.fleet import SYSTEM_RESERVED_CPU_FRACTION, SimulatedFleet
from meridian.power_model import host_coefficients, host_power_watts
from protos import telemetry_pb2 as pb


def test_shapes_come_from_the_node_list(traces_dir: Path) -> None:
    fleet = SimulatedFleet(cluster="c", region="r", n_nodes=300, seed=1,
                           node_list=traces_dir / "alibaba-gpu-v2023/openb_node_list_gpu_node.csv")
    assert (fleet.gpu_count > 0).all()  # the GPU-node list has GPUs on every node
    assert set(fleet.gpu_model) <= {"G2", "T4", "P100", "V100M16", "G3", "V100M32", "A10"}
    assert (fleet.alloc_milli_cpu == (fleet.capacity_milli_cpu * (1 - SYSTEM_RESERVED_CPU_FRACTION)).astype(int)).all()


def test_reports_follow_the_model_and_integrate_energy() -> None:
    fleet = SimulatedFleet(cluster="c", region="r", n_nodes=40, seed=3, start_sequence=0, labels_every=3)
    first = [pb.NodeTelemetry.FromString(p) for p in fleet.reports(100.0)]
    fleet.advance(100.0)
    power_before = fleet.power_watts.copy()
    fleet.advance(110.0)  # 10 s at the power of the previous step
    reports = [pb.NodeTelemetry.FromString(p) for p in fleet.reports(110.0)]
    energy = np.array([r.energy_joules for r in reports])
    assert energy == pytest.approx(power_before * 10.0)
    # power is the documented host curve at the node's utilisation plus its GPU boards
    idle, peak = host_coefficients(fleet.capacity_milli_cpu / 1000)
    host = host_power_watts(fleet.cpu_utilisation, idle, peak)
    cpu_only = fleet.gpu_count == 0
    assert np.array([r.power_watts for r in reports])[cpu_only] == pytest.approx(host[cpu_only])
    assert [r.sequence for r in reports] == [2] * 40
    assert all(r.labels_included for r in first) and not any(r.labels_included for r in reports)
    assert dict(first[0].labels)["topology.kubernetes.io/region"] == "r"
    assert reports[0].used_milli_cpu == pytest.approx(int(fleet.cpu_utilisation[0] * fleet.alloc_milli_cpu[0]))


def test_carbon_series_is_replayed(traces_dir: Path) -> None:
    feed = CarbonFeed.from_file(traces_dir / "carbon/electricitymaps/NO_2022_hourly.csv")
    fleet = SimulatedFleet(cluster="c", region="r", n_nodes=2, carbon=feed)
    at = float(feed.timestamps[100].astype(np.int64)) + 60
    report = pb.NodeTelemetry.FromString(fleet.reports(at)[0])
    assert report.carbon_g_per_kwh == pytest.approx(feed.g_per_kwh[100])
    assert report.carbon_source == pb.CARBON_SOURCE_SIMULATED


def test_rows_select_a_slice_of_the_fleet() -> None:
    fleet = SimulatedFleet(cluster="c", region="r", n_nodes=10, first_index=100)
    names = [pb.NodeTelemetry.FromString(p).node for p in fleet.reports(0.0, slice(2, 5))]
    assert names == ["c-node-000102", "c-node-000103", "c-node-000104"]
