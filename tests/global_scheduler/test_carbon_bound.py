"""The LP lower bound on carbon: exact on a hand-built federation, and below what real policies emit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from global_scheduler.bench_routing import bench_config
from global_scheduler.carbon_bound import carbon_lower_bound, node_types, policy_schedule, workload_options
from global_scheduler.federation_sim import FederationConfig, FederationSim, TraceWorkload, _Pending
from global_scheduler.routing.registry import get_policy
from meridian.cli import build_app
from meridian.traces import default_traces_dir

GIB = 2**30
TRACES = default_traces_dir()
pytestmark = pytest.mark.skipif(not (TRACES / "alibaba-dlrm-v2025").exists(), reason="shared traces not available")


def _hand_sim(deadline_h: float) -> FederationSim:
    """Two one-node clusters (eu-north, eu-central), one 8-vCPU / 16 GiB workload of 2 h arriving at hour 0.

    Carbon: eu-north 100 g/kWh always; eu-central 300 g/kWh except hours 3-4 (20 g/kWh).
    """
    sim = FederationSim(FederationConfig(regions=("eu-north", "eu-central"), clusters=2, days=1), TRACES)
    sim.set_nodes(np.array([[16_000, 64 * GIB, 0]] * 2, dtype=np.int64), ["", ""])
    w = TraceWorkload(0, "t", 0.0, 2.0, 1, 8_000, 16 * GIB, 0)
    sim.workloads = [_Pending(w, 0, deadline_h, True, 0, 0.0, None, sim.cfg.weights_batch)]
    sim.tenants, sim.tenant_index = ["t"], {"t": 0}
    sim.carbon[0, :] = 100.0
    sim.carbon[1, :] = 300.0
    sim.carbon[1, 3:5] = 20.0
    return sim


def test_hand_built_optimum() -> None:
    # A 16-vCPU host is the "small" profile (60 W idle, 180 W max), no GPU, on-power I = 60 W. For 8 vCPU,
    # 16 GiB: CPU vertex (180 − 60 + 60) / 16 × 8 = 90 W; memory vertex 120 / 16 × 8 + 60 / 64 × 16 = 75 W.
    # So 90 W for 2 h; cheapest: eu-central (PUE 1.3) at hours 3-4: 90 × 1.3 × 20 × 2 / 1e6 kg.
    sim = _hand_sim(deadline_h=6.0)
    r = carbon_lower_bound(sim)
    assert r.carbon_kg == pytest.approx(90 * 1.3 * 20 * 2 / 1e6, rel=1e-6)
    assert r.region_energy_kwh["eu-central"] == pytest.approx(90 * 1.3 * 2 / 1000, rel=1e-6)
    # The simulator's own carbon for a real policy's schedule is above it.
    assert sim.run(get_policy("least-carbon")).carbon_kg >= r.carbon_kg
    # Dropping the only workload costs nothing when one drop is allowed.
    assert carbon_lower_bound(sim, max_drops=1).carbon_kg == pytest.approx(0.0, abs=1e-12)


def test_start_window_follows_the_simulator() -> None:
    # Deadline at hour 2: the simulator still starts it (late) at hour 3 = deadline + max_pending − 1,
    # fails it at hour 4. Without late starts the cheapest is eu-north at 100 g/kWh.
    sim = _hand_sim(deadline_h=2.0)
    assert carbon_lower_bound(sim).carbon_kg == pytest.approx(90 * 1.3 * 20 * 2 / 1e6, rel=1e-6)
    strict = carbon_lower_bound(sim, late_starts=False).carbon_kg
    assert strict == pytest.approx(90 * 1.1 * 100 * 2 / 1e6, rel=1e-6)


def test_gpu_node_planes() -> None:
    # 32 vCPU → "standard" host (120 / 400 W); 4 V100 boards (40 / 300 W): on-power 120 + 4 × 40 = 280 W.
    sim = FederationSim(FederationConfig(regions=("eu-north",), clusters=1, days=1), TRACES)
    sim.set_nodes(np.array([[32_000, 128 * GIB, 4]], dtype=np.int64), ["V100"])
    t = node_types(sim)
    assert t.count.tolist() == [1]
    assert t.cap[0].tolist() == pytest.approx([32, 128, 4])
    np.testing.assert_allclose(t.coef[0], [[560 / 32, 0, 260], [280 / 32, 280 / 128, 260], [280 / 32, 0, 260 + 70]])
    # Every plane is below the node's real power at any load: spot-check a grid of loads.
    pm = sim.node_power
    for cpu in (0, 1_000, 16_000, 32_000):
        for mem in (0, 8, 128):
            for gpu in range(5):
                used = np.array([[cpu, mem * GIB, gpu]])
                watts = float(pm.watts(used)[0])
                load = np.array([cpu / 1000, mem, gpu])
                assert (t.coef[0] @ load <= watts + 1e-9).all()


@pytest.fixture(scope="module")
def small_window() -> tuple[FederationSim, dict[str, tuple[float, int]], dict[str, dict[int, tuple[int, int]]]]:
    # Two days on six clusters: karmada and round-robin fail nothing there (one day: every policy fails 2-4).
    cfg = bench_config(traces_dir=TRACES, days=2, clusters=6)
    sim = FederationSim(cfg, TRACES)
    runs, schedules = {}, {}
    for name in ("karmada", "round-robin", "gnn", "least-carbon"):
        r, schedules[name] = policy_schedule(sim, get_policy(name))
        runs[name] = (r.carbon_kg, r.failures)
    return sim, runs, schedules


def test_bound_below_every_policy(small_window) -> None:
    sim, runs, _ = small_window
    bounds: dict[int, float] = {}
    for failures in sorted({f for _, f in runs.values()}):
        bounds[failures] = carbon_lower_bound(sim, max_drops=failures).carbon_kg
    assert 0 in bounds, f"no policy without failures on this window: {runs}"
    assert math.isfinite(bounds[0]) and bounds[0] > 0
    for name, (carbon, failures) in runs.items():
        # Valid for every policy with at most that many failures (SLO violations do not matter).
        assert bounds[failures] <= carbon, (name, bounds, runs)
    # More drops allowed can only lower the bound.
    values = [bounds[f] for f in sorted(bounds)]
    assert values == sorted(values, reverse=True)


def test_real_schedules_are_inside_the_lp(small_window) -> None:
    # Each policy's actual schedule satisfies the LP's start windows and cluster filter, and the LP's power
    # for exactly that schedule stays below the simulator's carbon for it (the power planes are valid).
    sim, runs, schedules = small_window
    opts = workload_options(sim)
    index = {p.w.id: i for i, p in enumerate(sim.workloads)}
    for name, starts in schedules.items():
        assert len(starts) == len(sim.workloads) - runs[name][1], name
        for wid, (k, s) in starts.items():
            i = index[wid]
            assert opts.clusters[i, k], (name, wid, k)
            assert opts.earliest[i] <= s <= opts.latest[i], (name, wid, s)
        pinned = carbon_lower_bound(sim, schedule=starts).carbon_kg
        assert 0 < pinned <= runs[name][0], (name, pinned, runs[name])


def test_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bound.json"
    res = CliRunner().invoke(build_app(), ["bench", "routing-bound", "--days", "1", "--clusters", "6", "--drops", "3",
                                           "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "carbon lower bound" in res.output
    data = json.loads(out.read_text())
    b0, b3 = data["bounds"]["drops_0"], data["bounds"]["drops_3"]
    assert 0 < b3["carbon_kg"] <= b0["carbon_kg"] < math.inf
    assert b3["dropped"] <= 3 + 1e-6


def test_no_feasible_schedule_gives_no_bound() -> None:
    # Three latency-free, non-deferrable 16-vCPU workloads of a day each on two one-node clusters: at
    # most two can start within the hour they may wait, so no schedule runs all three.
    sim = _hand_sim(deadline_h=6.0)
    ws = [TraceWorkload(i, "t", 0.0, 24.0, 1, 16_000, 16 * GIB, 0) for i in range(3)]
    sim.workloads = [_Pending(w, 0, float(sim.cfg.max_pending_hours), False, 0, 0.0, None, sim.cfg.weights_batch)
                     for w in ws]
    r = carbon_lower_bound(sim)
    assert math.isnan(r.carbon_kg) and "infeasible" in r.status.lower()
    # Allowed to leave one unrun, the LP has an optimum again.
    assert math.isfinite(carbon_lower_bound(sim, max_drops=1).carbon_kg)
