"""A small simulated federation run on the real grid series, recorded through :class:`RunRecorder`.

Until the federation simulator (``global_scheduler/federation_sim.py``) saves runs itself, this is
the run behind the tests and the README example. It is deliberately simple and says what it is:

* three regions, two clusters each, a week from 2022-12-01 00:00 UTC in 15-minute steps;
* ``eu-north``: Electricity Maps NO 2022 (direct) and ENTSO-E ``NO1`` prices — same hours;
  ``eu-central`` / ``eu-west``: Let's Wait Awhile DE / FR carbon of 2020 replayed 728 days later
  (104 weeks, so weekdays line up) against the 2022 ``DE-LU`` / ``FR`` prices, because the shared
  traces have no 2022 intensity for those zones;
* node power from :mod:`meridian.power_model` (the one model every simulator and the live path use):
  a 64-core node is its ``standard`` host profile, 120 W idle and 400 W at full load on Fan's curve;
* four tenants with a diurnal CPU demand; ``search`` and ``ads`` are latency-bound to their home
  region, ``ml-training`` and ``analytics`` may run anywhere;
* two policies over the same demand: ``karmada`` spreads every workload over all clusters by capacity
  (Karmada's static weighting), ``carbon-greedy`` keeps latency-bound work home and fills the cleanest
  clusters (intensity × PUE) with the flexible work. It is a stand-in for issue 5's policies, not one.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from global_scheduler.accounting.run_store import (
    ClusterSpec,
    FederationRunHook,
    RunRecorder,
    WorkloadUsage,
    save_federation_run,
    save_run,
)
from global_scheduler.accounting.work import WorkDone
from meridian import grid_data, power_model

NODE_CORES = 64
REPLAY_SHIFT_HOURS = 728 * 24  # 104 weeks: 2020-12-03 replayed as 2022-12-01


@dataclass(frozen=True)
class RegionGrid:
    region: str
    carbon_file: str
    price_area: str
    pue: float
    replay_shift_hours: int = 0


REGIONS = (
    RegionGrid("eu-north", "carbon/electricitymaps/NO_2022_hourly.csv", "NO1", 1.10),
    RegionGrid("eu-central", "carbon/lets-wait-awhile/ger_ci.csv", "DE-LU", 1.25, REPLAY_SHIFT_HOURS),
    RegionGrid("eu-west", "carbon/lets-wait-awhile/fr_ci.csv", "FR", 1.20, REPLAY_SHIFT_HOURS),
)
# tenant, workload, home region (None: flexible), peak cores, diurnal amplitude (0..1)
WORKLOADS = (
    ("search", "frontend", "eu-west", 900.0, 0.6),
    ("ads", "bidder", "eu-central", 700.0, 0.5),
    ("ml-training", "trainer", None, 1400.0, 0.1),
    ("analytics", "batch-etl", None, 800.0, 0.3),
)


def _hourly(series: grid_data.HourlySeries, hours: np.ndarray, shift_hours: int) -> np.ndarray:
    return series.values_for(hours - np.timedelta64(shift_hours, "h"))


def generate_sample_run(traces_dir: str | Path, out_dir: str | Path, *, start: datetime | None = None,
                        days: int = 7, step_s: int = 900, nodes_per_cluster: int = 40, seed: int = 7) -> Path:
    """Simulate both policies over the same demand and save the run (primary ``carbon-greedy``)."""
    traces = Path(traces_dir)
    start = start or datetime(2022, 12, 1, tzinfo=UTC)
    t0 = start.timestamp()
    n_steps = days * 86400 // step_s
    step_start = t0 + np.arange(n_steps) * step_s
    hours = (step_start // 3600).astype(np.int64).astype("datetime64[h]")

    prices = grid_data.load_entsoe_prices(traces / "prices" / "entsoe_dayahead_hourly_2022-12-01_to_2022-12-10.csv")
    clusters = [ClusterSpec(name=f"{r.region}-{s}", region=r.region, pue=r.pue) for r in REGIONS for s in "ab"]
    region_of = np.repeat(np.arange(len(REGIONS)), 2)
    ci_region = np.stack([_hourly(grid_data.load_carbon_file(traces / r.carbon_file), hours, r.replay_shift_hours)
                          for r in REGIONS], axis=1)  # [step, region]
    price_region = np.stack([prices[r.price_area].values_for(hours) for r in REGIONS], axis=1)
    ci = ci_region[:, region_of]
    price = price_region[:, region_of]
    pue = np.array([c.pue for c in clusters])
    capacity = np.full(len(clusters), float(nodes_per_cluster * NODE_CORES))
    node_idle_w, node_max_w = (float(w[0]) for w in power_model.host_coefficients(np.array([NODE_CORES])))

    rng = np.random.default_rng(seed)
    hour_of_day = (step_start % 86400) / 3600.0
    shape = np.array([1 - amp * (0.5 + 0.5 * np.cos(2 * np.pi * (hour_of_day - 14) / 24)) for *_, amp in WORKLOADS])
    peak = np.array([w[3] for w in WORKLOADS])
    demand = (peak[:, None] * shape * rng.uniform(0.9, 1.1, shape.shape)).T  # [step, workload] cores

    recorders = {"carbon-greedy": RunRecorder(clusters, policy="carbon-greedy"),
                 "karmada": RunRecorder(clusters, policy="karmada")}
    tenants = [w[0] for w in WORKLOADS]
    names = [w[1] for w in WORKLOADS]
    home = [None if w[2] is None else [r.region for r in REGIONS].index(w[2]) for w in WORKLOADS]
    for i in range(n_steps):
        placements = {"karmada": np.outer(demand[i], capacity / capacity.sum()),
                      "carbon-greedy": _greedy(demand[i], home, region_of, capacity, ci[i] * pue)}
        for policy, alloc in placements.items():  # alloc: [workload, cluster] cores
            used = alloc.sum(axis=0)
            util = np.clip(used / capacity, 0, 1)
            nodes = nodes_per_cluster
            w_idx, c_idx = np.nonzero(alloc > 0)
            recorders[policy].record_interval(
                step_start[i], step_start[i] + step_s,
                power_watts=nodes * power_model.host_power_watts(util, node_idle_w, node_max_w),
                idle_power_watts=np.full(len(clusters), nodes * node_idle_w),
                carbon_intensity_g_per_kwh=ci[i], price_per_mwh=price[i], allocatable_cpu_cores=capacity,
                usage=WorkloadUsage(cluster_index=c_idx, tenant=[tenants[w] for w in w_idx],
                                    workload=[names[w] for w in w_idx],
                                    cpu_core_seconds=alloc[w_idx, c_idx] * step_s,
                                    requested_cpu_cores=alloc[w_idx, c_idx] * 1.25))
    provenance = {"generator": "global_scheduler.accounting.sample_run",
                  "regions": {r.region: {"carbon": r.carbon_file, "price_area": r.price_area,
                                         "replay_shift_hours": r.replay_shift_hours}
                              for r in REGIONS},
                  "power_model": {"model": "meridian.power_model host profile, Fan's curve",
                                  "node_idle_watts": node_idle_w, "node_max_watts": node_max_w,
                                  "node_cores": NODE_CORES, "nodes_per_cluster": nodes_per_cluster}}
    return save_run(out_dir, recorders, primary="carbon-greedy", currency="EUR", provenance=provenance)


def _greedy(demand: np.ndarray, home: list[int | None], region_of: np.ndarray, capacity: np.ndarray,
            effective_ci: np.ndarray) -> np.ndarray:
    alloc = np.zeros((len(demand), len(capacity)))
    for w, h in enumerate(home):
        if h is not None:  # latency-bound: its home region's clusters, by capacity
            in_home = region_of == h
            alloc[w, in_home] = demand[w] * capacity[in_home] / capacity[in_home].sum()
    free = capacity - alloc.sum(axis=0)
    for w, h in enumerate(home):
        if h is None:
            left = demand[w]
            for c in np.argsort(effective_ci):
                take = min(left, max(free[c], 0.0))
                alloc[w, c] += take
                free[c] -= take
                left -= take
                if left <= 0:
                    break
    return alloc


def simulate_federation_run(traces_dir: str | Path, out_dir: str | Path, *,
                            policies: tuple[str, ...] = ("least-carbon", "karmada"), primary: str | None = None,
                            days: int = 7) -> Path:
    """Run issue 5's federation simulator with each policy and save the accounting through
    :class:`FederationRunHook` — what ``meridian bench routing --save-run DIR`` is to do once wired.

    Imported lazily: the simulator is a heavier module than the accounting needs otherwise.
    """
    from global_scheduler.federation_sim import FederationConfig, FederationSim
    from global_scheduler.routing.registry import get_policy

    sim = FederationSim(FederationConfig(days=days), Path(traces_dir))
    hooks = {name: FederationRunHook(name) for name in policies}
    results = {name: sim.run(get_policy(name), on_interval=hooks[name]).as_dict() for name in policies}
    return save_federation_run(out_dir, hooks, primary=primary or policies[0],
                               provenance={"generator": "global_scheduler.federation_sim", "days": days,
                                           "results": results},
                               work={name: WorkDone.from_result(r) for name, r in results.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--traces", type=Path, default=None,
                        help="shared traces folder (default: $MERIDIAN_TRACES, else ../shared/traces beside the project)")
    parser.add_argument("--days", type=int, default=7)
    parser.add_argument("--federation", action="store_true",
                        help="use the federation simulator (least-carbon vs karmada) instead of this module's model")
    args = parser.parse_args(argv)
    if args.traces is None:
        from meridian.traces import TracesNotFoundError, locate_traces

        try:
            location = locate_traces()
        except TracesNotFoundError as exc:
            parser.error(str(exc))
        print(location.describe())
        args.traces = location.path
    if args.federation:
        print(simulate_federation_run(args.traces, args.out, days=args.days))
    else:
        print(generate_sample_run(args.traces, args.out, days=args.days))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
