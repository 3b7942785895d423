"""The LP lower bound on carbon: exact on a hand-built federation, and below what real policies emit."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from experiments.carbon_bound import (
    app,
    carbon_lower_bound,
    node_types,
    slo_ceiling,
    workload_options,
)
from global_scheduler.bench_routing import bench_config, policy_schedule
from global_scheduler.federation_sim import FederationConfig, FederationSim, TraceWorkload, _Pending
from global_scheduler.routing.registry import get_policy
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


def _ceiling_sim() -> FederationSim:
    """Two one-node clusters (16 vCPU, 64 GiB): eu-north at 100 g/kWh, eu-central at 300 g/kWh, every hour.

    A: a latency-sensitive service from eu-north, 4 vCPU / 8 GiB for 24 h from hour 0, SLO 12 ms. Its RTT
    is 2 ms at home and ~18.6 ms to Frankfurt, so only eu-north passes the filter, where its ceiling is
    1 − 5 / (12 − 2) = 0.5. B: 8 vCPU / 16 GiB for 2 h from hour 5, no SLO, not deferrable (starts by
    hour 6, while A surely runs). C: a 600 ms SLO, whose clamp (5 / 598 < 0.01) leaves no ceiling.
    """
    sim = FederationSim(FederationConfig(regions=("eu-north", "eu-central"), clusters=2, days=1), TRACES)
    sim.set_nodes(np.array([[16_000, 64 * GIB, 0]] * 2, dtype=np.int64), ["", ""])
    a = TraceWorkload(0, "t", 0.0, 24.0, 1, 4_000, 8 * GIB, 0)
    b = TraceWorkload(1, "t", 5.0, 2.0, 1, 8_000, 16 * GIB, 0)
    pending = sim.cfg.max_pending_hours
    w = sim.cfg.weights_latency_sensitive
    sim.workloads = [_Pending(a, 0, float(pending), False, 0, 12.0, None, w),
                     _Pending(b, 5, 5.0 + pending, False, 0, 0.0, None, w)]
    sim.tenants, sim.tenant_index = ["t"], {"t": 0}
    sim.carbon[0, :] = 100.0
    sim.carbon[1, :] = 300.0
    return sim


def test_slo_ceiling_values() -> None:
    sim = _ceiling_sim()
    c = TraceWorkload(2, "t", 0.0, 1.0, 1, 1_000, GIB, 0)
    sim.workloads.append(_Pending(c, 0, 2.0, False, 0, 600.0, None, sim.cfg.weights_latency_sensitive))
    ceiling = slo_ceiling(sim)
    assert ceiling[0, 0] == pytest.approx(0.5)
    assert ceiling[1].tolist() == [1.0, 1.0]  # no SLO
    assert ceiling[2].tolist() == [1.0, 1.0]  # 2 + 5 / 0.01 = 502 ms ≤ 600 ms even on a full cluster
    # The simulator's own rule at the ceiling and just above it (A's RTT at home is 2 ms).
    assert 2.0 + 5.0 / max(1 - 0.5, 0.01) <= 12.0 < 2.0 + 5.0 / max(1 - 0.5001, 0.01)


def test_slo_ceiling_binds_on_hand_built_case() -> None:
    # Both hosts are "small" (60 / 180 W): with ≤ 4 GiB per vCPU the CPU vertex (11.25 W per vCPU) is the
    # binding plane, so the LP's power is 11.25 W × vCPUs held. PUE 1.1 (eu-north), 1.3 (eu-central).
    sim = _ceiling_sim()
    north, central = 11.25 * 1.1 * 100 / 1e6, 11.25 * 1.3 * 300 / 1e6  # kg per vCPU-hour
    # Without ceilings all of it sits on clean eu-north: 4 × 24 + 8 × 2 vCPU-hours.
    plain = carbon_lower_bound(sim)
    assert plain.carbon_kg == pytest.approx((4 * 24 + 8 * 2) * north, rel=1e-6)
    assert plain.slo_rows == 0 and not plain.slo_ceilings
    # With them, eu-north holds at most 0.5 × 16 = 8 vCPU while A runs there: half of B (4 vCPU) goes to
    # eu-central for its 2 hours.
    tight = carbon_lower_bound(sim, slo_ceilings=True)
    assert tight.slo_ceilings and tight.slo_rows > 0
    assert tight.carbon_kg == pytest.approx((4 * 24 + 4 * 2) * north + 4 * 2 * central, rel=1e-6)
    # Real schedules: B beside A breaks A's SLO in the simulator, so that schedule is outside the LP;
    # B on eu-central is inside it, at exactly its power bound.
    assert carbon_lower_bound(sim, schedule={0: (0, 0), 1: (0, 5)}).status == "Optimal"
    assert "infeasible" in carbon_lower_bound(sim, schedule={0: (0, 0), 1: (0, 5)}, slo_ceilings=True).status.lower()
    ok = carbon_lower_bound(sim, schedule={0: (0, 0), 1: (1, 5)}, slo_ceilings=True)
    assert ok.carbon_kg == pytest.approx(4 * 24 * north + 8 * 2 * central, rel=1e-6)


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
def small_window() -> tuple[FederationSim, dict[str, tuple[float, int]], dict[str, dict[int, tuple[int, int]]],
                            dict[str, int]]:
    # Two days on six clusters: karmada and round-robin fail nothing there (one day: every policy fails 2-4).
    cfg = bench_config(traces_dir=TRACES, days=2, clusters=6)
    sim = FederationSim(cfg, TRACES)
    runs, schedules, violations = {}, {}, {}
    for name in ("karmada", "round-robin", "gnn", "least-carbon"):
        r, schedules[name] = policy_schedule(sim, get_policy(name))
        runs[name] = (r.carbon_kg, r.failures)
        violations[name] = r.slo_violations
    return sim, runs, schedules, violations


@pytest.fixture(scope="module")
def plain_bound(small_window) -> float:
    return carbon_lower_bound(small_window[0]).carbon_kg


def test_bound_below_every_policy(small_window, plain_bound) -> None:
    sim, runs, _, _ = small_window
    bounds: dict[int, float] = {0: plain_bound}
    for failures in sorted({f for _, f in runs.values()} - {0}):
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
    sim, runs, schedules, _ = small_window
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


def test_slo_ceilings_admit_slo_respecting_schedules(small_window) -> None:
    # The key validity check: a schedule that broke no SLO in the simulator satisfies every ceiling row,
    # so pinned to it the LP stays feasible, at the same power (the rows constrain usage, which the
    # schedule fixes). A schedule that broke some SLO must violate a row in the hour it did.
    sim, runs, schedules, violations = small_window
    clean = [name for name in runs if violations[name] == 0 and runs[name][1] == 0]
    assert {"karmada", "gnn"} <= set(clean), (runs, violations)
    for name in clean:
        with_rows = carbon_lower_bound(sim, schedule=schedules[name], slo_ceilings=True)
        assert with_rows.status == "Optimal", (name, with_rows.status)
        assert with_rows.carbon_kg == pytest.approx(carbon_lower_bound(sim, schedule=schedules[name]).carbon_kg,
                                                    rel=1e-6)
    assert violations["least-carbon"] > 0
    broken = carbon_lower_bound(sim, schedule=schedules["least-carbon"], slo_ceilings=True)
    assert "infeasible" in broken.status.lower(), broken.status


def test_slo_ceiling_bound_between_plain_bound_and_slo_respecting_policies(small_window, plain_bound) -> None:
    sim, runs, _, violations = small_window
    tight = carbon_lower_bound(sim, slo_ceilings=True)
    assert tight.status == "Optimal" and tight.slo_rows > 0
    # More rows can only raise the optimum (they bind on this window: latency-sensitive work is everywhere).
    assert tight.carbon_kg > plain_bound * (1 + 1e-6), (tight.carbon_kg, plain_bound)
    for name, (carbon, failures) in runs.items():
        if violations[name] == 0 and failures == 0:
            assert tight.carbon_kg <= carbon, (name, tight.carbon_kg, carbon)


def test_cli_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bound.json"
    res = CliRunner().invoke(app, ["--days", "1", "--clusters", "6", "--drops", "3",
                                           "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "carbon lower bound" in res.output
    data = json.loads(out.read_text())
    b0, b3 = data["bounds"]["drops_0"], data["bounds"]["drops_3"]
    assert 0 < b3["carbon_kg"] <= b0["carbon_kg"] < math.inf
    assert b3["dropped"] <= 3 + 1e-6


def test_cli_slo_ceilings_flag(tmp_path: Path) -> None:
    # One day on two clusters: small enough to solve in a second or two. Off by default, and says so.
    args = ["--days", "1", "--clusters", "2", "--drops", "0"]
    plain, tight = tmp_path / "plain.json", tmp_path / "tight.json"
    res = CliRunner().invoke(app, [*args, "--json", str(plain)])
    assert res.exit_code == 0, res.output
    assert "SLO ceilings off" in " ".join(res.output.split())  # the table title may wrap
    res = CliRunner().invoke(app, [*args, "--slo-ceilings", "--json", str(tight)])
    assert res.exit_code == 0, res.output
    assert "SLO ceilings on" in " ".join(res.output.split())  # the table title may wrap
    p, t = json.loads(plain.read_text()), json.loads(tight.read_text())
    assert not p["slo_ceilings"] and t["slo_ceilings"]
    assert p["bounds"]["drops_0"]["slo_rows"] == 0 < t["bounds"]["drops_0"]["slo_rows"]
    assert t["bounds"]["drops_0"]["carbon_kg"] >= p["bounds"]["drops_0"]["carbon_kg"] * (1 - 1e-7)


def test_no_feasible_schedule_gives_no_bound() -> None:
    # Three latency-free, non-deferrable 16-vCPU workloads of a day each on two one-node clusters: at
    # most two can start within the hour they may wait, so no schedule runs all three.
    sim = _hand_sim(deadline_h=6.0)
    ws = [TraceWorkload(i, "t", 0.0, 24.0, 1, 16_000, 16 * GIB, 0) for i in range(3)]
    sim.workloads = [_Pending(w, 0, float(sim.cfg.max_pending_hours), False, 0, 0.0, None, sim.cfg.weights_batch)
                     for w in ws]
    r = carbon_lower_bound(sim)
    assert math.isnan(r.carbon_kg) and "infeasible" in r.status.lower()
    # The JSON the CLI writes says "no bound" as null, never as a NaN that strict parsers refuse.
    assert r.as_dict()["carbon_kg"] is None and json.loads(json.dumps(r.as_dict(), allow_nan=False))
    # Allowed to leave one unrun, the LP has an optimum again.
    assert math.isfinite(carbon_lower_bound(sim, max_drops=1).carbon_kg)


@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--start", "13-45"], "is not MM-DD", id="bad-start"),
    pytest.param(["--carbon", "EMPTY"], "no carbon CSV files", id="empty-carbon-folder"),
])
def test_window_errors_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    args = [str(tmp_path) if a == "EMPTY" else a for a in args]
    res = CliRunner().invoke(app, ["--days", "1", "--clusters", "2", *args])
    assert res.exit_code == 2, res.output  # a usage error, not a traceback
    # rich wraps the message inside a box at any width: compare without spaces and box edges
    assert message.replace(" ", "") in re.sub(r"[\s│]+", "", res.output), res.output


def test_the_bound_is_no_longer_a_meridian_command() -> None:
    from meridian.cli import build_app

    res = CliRunner().invoke(build_app(), ["bench", "routing-bound", "--help"])
    assert res.exit_code != 0
