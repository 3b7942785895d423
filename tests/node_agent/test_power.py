"""The utilisation→power model against its documented coefficients, and the RAPL/model choice."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meridian.power_model import (
    FAN_EXPONENT,
    GPU_PROFILES,
    NodePowerModel,
    gpu_coefficients,
    gpu_power_watts,
    host_coefficients,
    host_power_watts,
    host_profile,
)
from node_agent.collectors.power import PowerCollector
from protos import telemetry_pb2 as pb


@pytest.mark.parametrize(
    ("vcpus", "idle", "peak"),
    [
        pytest.param(4, 60.0, 180.0, id="small"),
        pytest.param(16, 60.0, 180.0, id="small-upper-bound"),
        pytest.param(17, 120.0, 400.0, id="standard"),
        pytest.param(64, 120.0, 400.0, id="standard-upper-bound"),
        pytest.param(96, 200.0, 700.0, id="large"),
    ],
)
def test_host_profiles_are_the_documented_ones(vcpus: float, idle: float, peak: float) -> None:
    profile = host_profile(vcpus)
    assert (profile.idle_watts, profile.max_watts) == (idle, peak)
    vec_idle, vec_peak = host_coefficients(np.array([vcpus]))
    assert (vec_idle[0], vec_peak[0]) == (idle, peak)


@pytest.mark.parametrize(
    ("utilisation", "expected_watts"),
    [
        # standard profile: P = 120 + 280 · (2u − u^1.4)
        pytest.param(0.0, 120.0, id="idle"),
        pytest.param(1.0, 400.0, id="full-load"),
        pytest.param(0.5, 120.0 + 280.0 * (1.0 - 0.5**1.4), id="half"),  # 120 + 280 · 0.6211 = 293.9
        pytest.param(0.25, 120.0 + 280.0 * (0.5 - 0.25**1.4), id="quarter"),
        pytest.param(1.7, 400.0, id="clipped-above"),
        pytest.param(-0.2, 120.0, id="clipped-below"),
    ],
)
def test_fan_curve(utilisation: float, expected_watts: float) -> None:
    assert FAN_EXPONENT == 1.4
    assert float(host_power_watts(utilisation, 120.0, 400.0)) == pytest.approx(expected_watts)


def test_node_power_model_worked_example() -> None:
    # node 0: 32 vCPUs (standard, 120/400 W) with two T4s (10/70 W); node 1: 8 vCPUs (small, 60/180 W), no GPU.
    model = NodePowerModel.for_nodes(np.array([[32_000, 0, 2], [8_000, 0, 0]]), ["T4", ""])
    assert model.gpu_exists.tolist() == [[True, True], [False, False]]
    # node 0 at half its CPU with one board busy: 120 + 280·(1 − 0.5^1.4) + 70 + 10; node 1 empty.
    used = np.array([[16_000, 0, 1], [0, 0, 0]])
    expected_0 = 120.0 + 280.0 * (1.0 - 0.5**1.4) + 70.0 + 10.0
    assert model.watts(used).tolist() == pytest.approx([expected_0, 0.0])  # empty nodes powered off
    assert model.watts(used, power_off_empty=False).tolist() == pytest.approx([expected_0, 60.0])
    assert model.watts_at(np.array([0.5, 0.0]), np.array([[1.0, 0.0], [0.0, 0.0]])).tolist() == pytest.approx(
        [expected_0, 60.0])


def test_gpu_power_is_linear_per_device_and_ignores_absent_slots() -> None:
    idle, peak = gpu_coefficients(["T4", "", "mystery"])
    assert GPU_PROFILES["T4"] == (10.0, 70.0)
    util = np.array([[0.5, 1.0, 0.9], [1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    exists = np.array([[True, True, False], [False, False, False], [True, False, False]])
    # T4: (10 + 60·0.5) + (10 + 60·1) = 40 + 70; no GPU → 0; unknown model idles at 40 W
    assert gpu_power_watts(util, exists, idle, peak).tolist() == pytest.approx([110.0, 0.0, 40.0])


def test_model_is_used_without_rapl_and_energy_is_integrated() -> None:
    power = PowerCollector(32, powercap_root=None)  # 32 vCPUs → standard profile
    first = power.read(0.0, 0.0)
    assert first.source == pb.POWER_SOURCE_MODEL and first.power_watts == pytest.approx(120.0)
    second = power.read(10.0, 1.0)
    assert second.power_watts == pytest.approx(400.0)
    assert second.energy_joules == pytest.approx((120.0 + 400.0) / 2 * 10.0)  # trapezoid: 2600 J


def test_overridden_coefficients() -> None:
    power = PowerCollector(8, powercap_root=None, idle_watts=50.0, max_watts=150.0)
    assert power.read(0.0, 1.0).power_watts == pytest.approx(150.0)


def test_rapl_is_preferred_when_readable(tmp_path: Path) -> None:
    zone = tmp_path / "intel-rapl:0"
    zone.mkdir()
    (zone / "energy_uj").write_text("0\n")
    (zone / "max_energy_range_uj").write_text("1000000000\n")
    power = PowerCollector(32, powercap_root=tmp_path)
    assert power.read(0.0, 0.5).source == pb.POWER_SOURCE_RAPL
    (zone / "energy_uj").write_text("300000000\n")  # 300 J in 2 s
    reading = power.read(2.0, 0.5)
    assert reading.source == pb.POWER_SOURCE_RAPL
    assert reading.power_watts == pytest.approx(150.0)
    assert reading.energy_joules == pytest.approx(300.0)
    (zone / "energy_uj").write_text("garbage\n")  # RAPL became unreadable: fall back to the model
    assert power.read(4.0, 0.0).source == pb.POWER_SOURCE_MODEL
