"""meridian.energy against hand-computed cases: trapezoids, counters, gaps, attribution, carbon, cost."""

from __future__ import annotations

import math

import numpy as np
import pytest

from meridian import energy


@pytest.mark.parametrize(("t_s", "power_watts", "max_gap_s", "expected_joules", "unknown_s", "gaps"), [
    # (100+200)/2·10 + 200·20 + (200+0)/2·5 = 1500 + 4000 + 500
    pytest.param([0, 10, 30, 35], [100, 200, 200, 0], 60, 6000.0, 0.0, 0, id="irregular-trapezoid"),
    # 100 W for 10 s, a 390 s hole (not interpolated), 100 W for 10 s
    pytest.param([0, 10, 400, 410], [100, 100, 100, 100], 60, 2000.0, 390.0, 1, id="gap-not-interpolated"),
    # the gap is exactly max_gap_s: still trusted
    pytest.param([0, 60], [50, 150], 60, 6000.0, 0.0, 0, id="gap-at-limit-trusted"),
    # a repeated timestamp adds nothing
    pytest.param([0, 5, 5, 10], [10, 10, 30, 30], 60, 200.0, 0.0, 0, id="duplicate-time"),
    pytest.param([0], [100], 60, 0.0, 0.0, 0, id="single-sample"),
])
def test_integrate_power(t_s, power_watts, max_gap_s, expected_joules, unknown_s, gaps):
    got = energy.integrate_power(t_s, power_watts, max_gap_s=max_gap_s)
    assert got.energy_joules == pytest.approx(expected_joules)
    assert got.unknown_s == pytest.approx(unknown_s)
    assert got.gaps == gaps


def test_trapezoid_intervals_mark_gaps_nan():
    per = energy.trapezoid_intervals_joules([0, 10, 400, 410], [100, 100, 100, 100], max_gap_s=60)
    assert per[0] == 1000 and math.isnan(per[1]) and per[2] == 1000


@pytest.mark.parametrize(("t_s", "power_watts", "message"), [
    pytest.param([0, 10, 5], [1, 1, 1], "non-decreasing", id="unsorted"),
    pytest.param([0, 10], [1, -1], "negative", id="negative-power"),
    pytest.param([0, 10], [1], "one length", id="shape-mismatch"),
])
def test_integrate_power_rejects(t_s, power_watts, message):
    with pytest.raises(energy.EnergyInputError, match=message):
        energy.integrate_power(t_s, power_watts, max_gap_s=60)


@pytest.mark.parametrize(("t_s", "power_watts", "bucket_s", "max_gap_s", "energy_joules", "unknown_s"), [
    # p = t: [0,60] → 60²/2 = 1800; [60,90] → (60+90)/2·30 = 2250 (split exactly at the boundary)
    pytest.param([0, 90], [0, 90], 60, 100, [1800.0, 2250.0], [0.0, 0.0], id="split-at-boundary"),
    # a 100 s hole from 20 to 120 spans three buckets: 40 s, 60 s, 0 s unknown (plus the known ends)
    pytest.param([0, 20, 120, 130], [10, 10, 10, 10], 60, 30, [200.0, 0.0, 100.0], [40.0, 60.0, 0.0],
                 id="gap-split-across-buckets"),
])
def test_energy_per_bucket(t_s, power_watts, bucket_s, max_gap_s, energy_joules, unknown_s):
    starts, e, u = energy.energy_per_bucket_joules(t_s, power_watts, bucket_s=bucket_s, max_gap_s=max_gap_s)
    assert starts.tolist() == [i * bucket_s for i in range(len(energy_joules))]
    np.testing.assert_allclose(e, energy_joules)
    np.testing.assert_allclose(u, unknown_s)


RAPL_RANGE_J = 262143.328850  # a typical max_energy_range_uj / 1e6


@pytest.mark.parametrize(("counter", "kwargs", "increments", "wraps", "resets"), [
    # 100, then wrap: 50 − 262100 + range = 93.33, then 100
    pytest.param([262000.0, 262100.0, 50.0, 150.0], {"wrap_range_joules": RAPL_RANGE_J},
                 [100.0, 50.0 - 262100.0 + RAPL_RANGE_J, 100.0], 1, 0, id="rapl-wrap"),
    # no wrap range: a decrease is a restart, the new value is what was counted since
    pytest.param([1000.0, 1500.0, 200.0, 300.0], {}, [500.0, 200.0, 100.0], 0, 1, id="reset"),
    # with a range, but the wrapped delta (10 − 1000 + range ≈ 261 kJ in 1 s) is beyond 500 W: a reset
    pytest.param([1000.0, 10.0], {"wrap_range_joules": RAPL_RANGE_J, "t_s": [0.0, 1.0], "max_power_watts": 500.0},
                 [10.0], 0, 1, id="implausible-wrap-is-reset"),
    # a wrapping counter unread for longer than max_gap_s may have wrapped twice: unknown
    pytest.param([100.0, 200.0, 300.0], {"wrap_range_joules": RAPL_RANGE_J, "t_s": [0.0, 10.0, 5000.0],
                                         "max_gap_s": 60.0}, [100.0, math.nan], 0, 0, id="gap-on-wrapping-counter"),
    # a non-wrapping counter measured the gap itself: trusted
    pytest.param([100.0, 200.0, 300.0], {"t_s": [0.0, 10.0, 5000.0], "max_gap_s": 60.0}, [100.0, 100.0], 0, 0,
                 id="gap-on-monotonic-counter"),
])
def test_counter_increments(counter, kwargs, increments, wraps, resets):
    got = energy.counter_increments_joules(counter, **kwargs)
    np.testing.assert_allclose(got.increments_joules, increments)
    assert (got.wraps, got.resets) == (wraps, resets)


# Node: 1000 J in the interval, idle floor 400 J, so 600 J active; 4 allocatable cores.
# Pod A: 30 core-s, requests 1 core. Pod B: 10 core-s, requests 2 cores.
# active: A 600·30/40 = 450, B 150.
# idle by requests: A 400·1/4 = 100, B 400·2/4 = 200, unrequested quarter 100 unattributed.
# idle by cpu: A 300, B 100. none: idle all unattributed (400).
@pytest.mark.parametrize(("idle_split", "pod_joules", "unattributed"), [
    pytest.param("requests", [550.0, 350.0], [100.0], id="requests"),
    pytest.param("cpu", [750.0, 250.0], [0.0], id="cpu"),
    pytest.param("none", [450.0, 150.0], [400.0], id="none-kepler-0.10"),
])
def test_attribution_splits(idle_split, pod_joules, unattributed):
    got = energy.attribute_node_energy(
        node_energy_joules=[1000.0], node_idle_joules=[400.0], node_allocatable_cpu_cores=[4.0],
        pod_node_index=[0, 0], pod_cpu_core_seconds=[30.0, 10.0], pod_requested_cpu_cores=[1.0, 2.0],
        idle_split=idle_split)
    np.testing.assert_allclose(got.pod_joules, pod_joules)
    np.testing.assert_allclose(got.unattributed_joules, unattributed)
    np.testing.assert_allclose(got.pod_joules.sum() + got.unattributed_joules.sum(), 1000.0)


@pytest.mark.parametrize(("node", "pods", "pod_joules", "unattributed"), [
    # overcommitted requests (8 cores on 4): idle 400 shared 1:1 pro rata, nothing left over
    pytest.param({"energy": [400.0], "idle": [400.0], "alloc": [4.0]},
                 {"node": [0, 0], "cpu": [0.0, 0.0], "req": [4.0, 4.0]}, [200.0, 200.0], [0.0], id="overcommit"),
    # measured below the idle floor: everything is idle
    pytest.param({"energy": [300.0], "idle": [400.0], "alloc": [4.0]},
                 {"node": [0], "cpu": [10.0], "req": [2.0]}, [150.0], [150.0], id="below-idle-floor"),
    # no pod used CPU: the active part stays with the node
    pytest.param({"energy": [1000.0], "idle": [400.0], "alloc": [4.0]},
                 {"node": [0], "cpu": [0.0], "req": [4.0]}, [400.0], [600.0], id="no-cpu-use"),
    # two nodes, pods on node 1 only: node 0's energy is wholly unattributed
    pytest.param({"energy": [100.0, 200.0], "idle": [50.0, 100.0], "alloc": [2.0, 2.0]},
                 {"node": [1], "cpu": [5.0], "req": [2.0]}, [200.0], [100.0, 0.0], id="empty-node"),
])
def test_attribution_edge_cases(node, pods, pod_joules, unattributed):
    got = energy.attribute_node_energy(
        node_energy_joules=node["energy"], node_idle_joules=node["idle"], node_allocatable_cpu_cores=node["alloc"],
        pod_node_index=pods["node"], pod_cpu_core_seconds=pods["cpu"], pod_requested_cpu_cores=pods["req"])
    np.testing.assert_allclose(got.pod_joules, pod_joules)
    np.testing.assert_allclose(got.unattributed_joules, unattributed)


def test_attribution_rejects_unknown_node():
    with pytest.raises(energy.EnergyInputError, match="names a node"):
        energy.attribute_node_energy(node_energy_joules=[1.0], node_idle_joules=[0.0], node_allocatable_cpu_cores=[1.0],
                                     pod_node_index=[3], pod_cpu_core_seconds=[1.0], pod_requested_cpu_cores=[1.0])


@pytest.mark.parametrize(("it_joules", "pue", "intensity", "price", "grams", "cost"), [
    # 1 kWh IT × 1.5 = 1.5 kWh facility; × 200 g/kWh = 300 g; × 80 €/MWh = 0.12 €
    pytest.param(3.6e6, 1.5, 200.0, 80.0, 300.0, 0.12, id="one-kwh"),
    # 1 MWh at a negative day-ahead price costs negative money
    pytest.param(3.6e9, 1.0, 10.0, -5.0, 10_000.0, -5.0, id="negative-price"),
])
def test_carbon_and_cost(it_joules, pue, intensity, price, grams, cost):
    assert float(energy.carbon_grams(it_joules, pue, intensity)) == pytest.approx(grams)
    assert float(energy.energy_cost(it_joules, pue, price)) == pytest.approx(cost)


def test_carbon_uses_each_intervals_own_intensity():
    # Two 1-kWh intervals at 100 and 500 g/kWh: 600 g, not 2 kWh × the mean of anything else.
    got = energy.carbon_grams([3.6e6, 3.6e6], [1.0, 1.0], energy.hourly_values_at([0, 3600], 0.0, [100.0, 500.0]))
    np.testing.assert_allclose(got, [100.0, 500.0])


def test_hourly_values_at_refuses_outside():
    with pytest.raises(IndexError):
        energy.hourly_values_at([7200.0], 0.0, [1.0, 2.0])
