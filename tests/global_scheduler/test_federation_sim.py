"""The federation simulator on a one-day window: every policy runs, results are deterministic and the
accounting hook sees every cluster every hour."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from global_scheduler.federation_sim import EVAL_REGIONS, TRAIN_REGIONS, FederationConfig, FederationSim
from global_scheduler.routing.registry import get_policy
from global_scheduler.routing_training import TrainConfig
from meridian import power_model

GIB = 2**30


@pytest.fixture(scope="module")
def sim(traces_dir: Path) -> FederationSim:
    return FederationSim(FederationConfig(days=1, clusters=6), traces_dir)


def test_held_back_regions_and_window() -> None:
    tc = TrainConfig()
    assert set(EVAL_REGIONS) - set(TRAIN_REGIONS) == {"uk-south", "sa-east"}
    assert 12 not in tc.months and 2023 not in tc.years
    assert tc.trace_days[1] < FederationConfig().trace_offset_days


def test_real_inputs(sim: FederationSim) -> None:
    assert sim.carbon.shape[0] == len(EVAL_REGIONS)
    north = EVAL_REGIONS.index("eu-north")
    central = EVAL_REGIONS.index("eu-central")
    assert sim.carbon[north].mean() < 50 < sim.carbon[central].mean()  # Norway's hydro vs Germany's mix
    assert np.isfinite(sim.price).all() and len(sim.workloads) > 20
    assert {p.deferrable for p in sim.workloads} == {True, False}


@pytest.mark.parametrize("name", ["karmada", "least-carbon", "least-carbon-slo", "least-cost", "round-robin", "random"])
def test_every_baseline_runs(sim: FederationSim, name: str) -> None:
    r = sim.run(get_policy(name))
    assert r.energy_kwh > 0 and r.carbon_kg > 0 and r.cost > 0
    assert 0 < r.jain_fairness <= 1
    assert r.placed + r.failures >= r.workloads - sum(p.deferrable for p in sim.workloads)


def test_deterministic_and_hooked(sim: FederationSim) -> None:
    records = []
    a = sim.run(get_policy("karmada"), on_interval=records.extend)
    b = sim.run(get_policy("karmada"))
    assert (a.carbon_kg, a.slo_violations, a.placed) == (b.carbon_kg, b.slo_violations, b.placed)
    assert len(records) == (sim.hours + sim.cfg.drain_hours) * sim.cfg.clusters
    # carbon = energy (facility) × intensity, per record
    for r in records[:12]:
        assert r.carbon_kg == pytest.approx(r.energy_kwh * r.carbon_g_per_kwh / 1000)
    assert sum(r.carbon_kg for r in records) == pytest.approx(a.carbon_kg)


def test_least_carbon_emits_less_than_round_robin(sim: FederationSim) -> None:
    assert sim.run(get_policy("least-carbon")).carbon_kg < sim.run(get_policy("round-robin")).carbon_kg


def test_least_carbon_slo_breaks_no_slo_where_greed_does(sim: FederationSim) -> None:
    greedy, safe = sim.run(get_policy("least-carbon")), sim.run(get_policy("least-carbon-slo"))
    assert greedy.slo_violations > 0 and safe.slo_violations == 0
    # Keeping the SLOs costs clean capacity: more carbon than greed, less than round-robin.
    assert greedy.carbon_kg < safe.carbon_kg < sim.run(get_policy("round-robin")).carbon_kg


def _two_small_clusters(traces_dir: Path, *, power_off_empty_nodes: bool = True) -> FederationSim:
    """Two clusters of two hand-picked openb-like nodes each, with known requests on them."""
    sim = FederationSim(FederationConfig(days=1, clusters=2, power_off_empty_nodes=power_off_empty_nodes), traces_dir)
    sim.set_nodes(np.array([[32_000, 256 * GIB, 0],    # standard host (17-64 vCPU): 120 / 400 W
                            [96_000, 512 * GIB, 8],    # large host (> 64 vCPU): 200 / 700 W, 8 × V100M32
                            [64_000, 256 * GIB, 2],    # standard host, 2 × T4
                            [8_000, 64 * GIB, 1]]),    # small host (≤ 16 vCPU): 60 / 180 W, 1 × A10
                  ["", "V100M32", "T4", "A10"])
    sim._reset_state()
    sim.node_used = np.array([[16_000, 8 * GIB, 0],    # CPU utilisation 0.5
                              [24_000, 64 * GIB, 3],   # 0.25, 3 of 8 GPUs held
                              [0, 0, 0],               # empty
                              [8_000, 8 * GIB, 1]])    # 1.0, its GPU held
    return sim


def test_power_is_the_documented_model(traces_dir: Path) -> None:
    """The simulator's cluster power is meridian.power_model's (docs/energy.md), computed by hand here:
    host = idle + (max − idle)·(2u − u^1.4); a held GPU at board power, a free one at idle."""
    sim = _two_small_clusters(traces_dir)
    n0 = 120 + 280 * (2 * 0.5 - 0.5**1.4)                   # 293.90 W
    n1 = 200 + 500 * (2 * 0.25 - 0.25**1.4) + 3 * 300 + 5 * 40  # 378.21 + 1,100 = 1,478.21 W
    n3 = 60 + 120 * (2 * 1.0 - 1.0) + 150                   # 180 + 150 = 330 W
    assert n0 == pytest.approx(293.90, abs=0.01) and n1 == pytest.approx(1478.21, abs=0.01)
    # An empty node is powered off (FederationConfig.power_off_empty_nodes, the default).
    assert sim._power() == pytest.approx([n0 + n1, 0.0 + n3])

    # The same nodes and utilisation through meridian.power_model's own per-node functions.
    def model_watts(vcpus: float, u: float, gpu_model: str, gpus: int, busy: int) -> float:
        profile = power_model.host_profile(vcpus)
        idle, peak = power_model.GPU_PROFILES.get(gpu_model, power_model.DEFAULT_GPU_PROFILE)
        host = float(power_model.host_power_watts(u, profile.idle_watts, profile.max_watts))
        return host + busy * peak + (gpus - busy) * idle if gpus else host

    expected = [model_watts(32, 0.5, "", 0, 0) + model_watts(96, 0.25, "V100M32", 8, 3), model_watts(8, 1.0, "A10", 1, 1)]
    assert sim._power() == pytest.approx(expected)

    # Keeping empty nodes on: the empty node draws its host idle plus its two idle T4s.
    on = _two_small_clusters(traces_dir, power_off_empty_nodes=False)
    assert on._power() == pytest.approx([n0 + n1, 120 + 2 * 10 + n3])
    assert model_watts(64, 0.0, "T4", 2, 0) == pytest.approx(140.0)


def test_interval_records_carry_the_model_power(sim: FederationSim) -> None:
    """What the accounting hook records is the cluster's model power × PUE, hour by hour."""
    records = []
    sim.run(get_policy("least-carbon"), on_interval=records.extend)
    pue = {r.name: r.pue for r in sim.regions}
    busy = [r for r in records if r.power_watts > 0]
    assert busy
    for r in busy[:24]:
        assert r.energy_kwh == pytest.approx(r.power_watts * pue[r.region] / 1000)


def test_routing_decisions_do_not_read_node_power(traces_dir: Path) -> None:
    """Power only prices what was routed: changing the power model (empty nodes on or off) changes the
    energy and nothing any policy decided."""
    runs = []
    for off in (True, False):
        s = FederationSim(FederationConfig(days=1, clusters=6, power_off_empty_nodes=off), traces_dir)
        decisions: list[tuple[int, int, int]] = []

        def log(sim_: FederationSim, p, feats, wf, feasible, choice: int, decisions=decisions) -> int:
            decisions.append((sim_.hour, p.w.id, int(choice)))
            return choice

        r = s.run(get_policy("least-carbon"), on_decision=log)
        runs.append((r, decisions))
    (powered_off, d_off), (kept_on, d_kept_on) = runs
    assert d_off == d_kept_on and len(d_off) > 20
    assert (powered_off.slo_violations, powered_off.failures, powered_off.workload_hours) == (
        kept_on.slo_violations, kept_on.failures, kept_on.workload_hours)
    assert kept_on.energy_kwh > powered_off.energy_kwh
