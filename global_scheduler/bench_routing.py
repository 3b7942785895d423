"""``meridian bench routing``: every routing policy over the same held-back federation window.

The default window and regions are the evaluation set that training never saw (``gnn/README.md``):
December (2023 for the Electricity Maps zones, 2020 for the Let's Wait Awhile ones), regions
including ``uk-south`` and ``sa-east``, and the last week of the DLRM trace.
"""

from __future__ import annotations

import resource
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from global_scheduler.federation_sim import (
    REGIONS,
    FederationConfig,
    FederationSim,
    IntervalRecord,
    RunResult,
    load_grid,
)
from global_scheduler.routing.base import RoutingPolicy, fallbacks_of
from global_scheduler.routing.registry import get_policy

DEFAULT_POLICIES = ("gnn", "karmada", "least-carbon", "least-carbon-slo", "least-cost", "round-robin", "random")
JSON_KEYS = ("energy_kwh", "carbon_kg", "cost", "slo_violations", "failures", "deadline_misses", "jain_fairness",
             "decision_ms_p50", "decision_ms_p99")
# Added for the capacity model (issue 27): how many decisions the run's p50/p99 are over, the run's wall time per
# decision (the simulator's own work included), and the process's peak resident memory once the policy has run.
CAPACITY_KEYS = ("decisions", "wall_ms_per_decision", "peak_rss_mib")


def peak_rss_mib() -> float:
    """The process's peak resident set size so far, MiB (``ru_maxrss``: KiB on Linux, bytes on macOS)."""
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def build_sim(cfg: FederationConfig, *, traces_dir: Path, carbon_dir: Path | None = None,
              prices_file: Path | None = None) -> tuple[FederationSim, dict[str, float]]:
    """The simulated federation, and the memory building it took: ``federation_state_mib`` (Python allocations
    still held once it is built, tracemalloc; the workload trace's cache included when this read it first, the
    carbon and price series' not: they are read before tracing starts) and ``federation_build_peak_mib``
    (their peak while building)."""
    load_grid(traces_dir, carbon_dir, prices_file)  # cached: the federation reads the same series
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    base, _ = tracemalloc.get_traced_memory()
    tracemalloc.reset_peak()
    try:
        sim = FederationSim(cfg, traces_dir, carbon_dir=carbon_dir, prices_file=prices_file)
        current, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    mib = 1024 * 1024
    return sim, {"federation_state_mib": (current - base) / mib, "federation_build_peak_mib": (peak - base) / mib}


def parse_start(text: str) -> tuple[str, int | None]:
    """``MM-DD`` or ``YYYY-MM-DD`` → (``MM-DD``, year or None)."""
    try:
        if len(text) == 5:
            datetime.strptime(f"2000-{text}", "%Y-%m-%d")
            return text, None
        d = datetime.strptime(text, "%Y-%m-%d")
        return f"{d.month:02d}-{d.day:02d}", d.year
    except ValueError:
        raise ValueError(f"--start: {text!r} is not MM-DD or YYYY-MM-DD") from None


def bench_config(*, start: str = "12-01", days: int = 7, clusters: int = 12, seed: int = 0,
                 traces_dir: Path, carbon_dir: Path | None = None, prices_file: Path | None = None,
                 regions: Sequence[str] | None = None) -> FederationConfig:
    month_day, year = parse_start(start)
    cfg = FederationConfig(start=month_day, days=days, clusters=clusters, seed=seed)
    if regions:
        unknown = [r for r in regions if r not in REGIONS]
        if unknown:
            raise ValueError(f"--regions: unknown {unknown}; known: {sorted(REGIONS)}")
        cfg = replace(cfg, regions=tuple(regions))
    if year is not None:
        grid = load_grid(traces_dir, carbon_dir, prices_file)
        m, d = (int(x) for x in month_day.split("-"))
        begin = datetime(year, m, d, tzinfo=UTC)
        years = {}
        for name in cfg.regions:
            series = grid.carbon.get(REGIONS[name].carbon_zone)
            if series is not None and series.start <= begin and (begin - series.start).days + days + 3 <= len(series) / 24:
                years[name] = year
        cfg = replace(cfg, region_years=years)
    return cfg


def policy_schedule(sim: FederationSim, policy: RoutingPolicy) -> tuple[RunResult, dict[int, tuple[int, int]]]:
    """Run ``policy`` on ``sim`` and record where and when each workload started: ``{id: (cluster, hour)}``."""
    starts: dict[int, tuple[int, int]] = {}

    def hook(_records: list[IntervalRecord]) -> None:
        # Called after each hour's placements: every running workload is visible at least once.
        for r in sim.running:
            if r["id"] not in starts:
                starts[r["id"]] = (int(r["cluster"]), sim.hour)
    result = sim.run(policy, on_interval=hook)
    return result, starts


def run_routing_bench(cfg: FederationConfig, *, traces_dir: Path, policies: Sequence[str] = DEFAULT_POLICIES,
                      carbon_dir: Path | None = None, prices_file: Path | None = None, checkpoint: Path | None = None,
                      on_interval: Callable[[str], Callable[[list[IntervalRecord]], None] | None] | None = None,
                      progress: Callable[[str], None] | None = None,
                      same_work_as: str | None = None,
                      memory: dict[str, float] | None = None) -> dict[str, dict[str, Any]]:
    """Run each policy on the same simulated federation; returns ``{policy: metrics}``.

    Besides :data:`JSON_KEYS`, each policy's metrics hold :data:`CAPACITY_KEYS`. ``memory``, when given, receives
    the federation's size (:func:`build_sim`) and the process's ``peak_rss_mib`` at the end.

    ``on_interval(policy)`` may return a per-interval callback (per-cluster power, energy, carbon and
    cost records), which is how ``--save-run`` records the run.

    ``same_work_as``: first run that policy, then run every policy on only the workloads it started.
    A policy that fails work emits less for less; this compares carbon on the same work.
    """
    sim, built = build_sim(cfg, traces_dir=traces_dir, carbon_dir=carbon_dir, prices_file=prices_file)
    if memory is not None:
        memory.update(built)
    if same_work_as is not None:
        if progress:
            progress(f"{same_work_as} (to pick the work)")
        _, started = policy_schedule(sim, get_policy(same_work_as))
        sim.workloads = [p for p in sim.workloads if p.w.id in started]
    results: dict[str, dict[str, Any]] = {}
    for name in policies:
        kwargs = {"checkpoint": checkpoint} if name == "gnn" and checkpoint else {}
        policy = get_policy(name, **kwargs)
        if progress:
            progress(name)
        t0 = time.perf_counter()
        hook = on_interval(name) if on_interval else None
        decisions = 0

        def count(_sim: FederationSim, _p: Any, _feats: Any, _wf: Any, _feasible: Any, choice: int) -> int:
            nonlocal decisions
            decisions += 1  # one per Router.decide, reroutes included: what decision_ms_p50/p99 are over
            return choice
        result = sim.run(policy, on_interval=hook, on_decision=count)
        wall = time.perf_counter() - t0
        out = result.as_dict()
        out["wall_s"] = round(wall, 2)
        out["decisions"] = decisions
        out["wall_ms_per_decision"] = 1000 * wall / max(decisions, 1)
        out["peak_rss_mib"] = peak_rss_mib()  # the process's, so far: it never falls between policies
        if fallbacks_of(policy):
            out["model_fallbacks"] = fallbacks_of(policy)
        results[name] = out
    if memory is not None:
        memory["peak_rss_mib"] = peak_rss_mib()
    return results


def comparison(results: dict[str, dict[str, Any]], learned: str = "gnn") -> dict[str, Any]:
    """The headline checks of the issue, computed from one run."""
    if learned not in results:
        return {}
    g = results[learned]
    out: dict[str, Any] = {}
    if "karmada" in results:
        k = results["karmada"]
        out["carbon_reduction_vs_karmada"] = 1 - g["carbon_kg"] / k["carbon_kg"] if k["carbon_kg"] else None
        out["no_worse_than_karmada_on_slo_failures_deadlines"] = (
            g["slo_violations"] <= k["slo_violations"] and g["failures"] <= k["failures"]
            and g["deadline_misses"] <= k["deadline_misses"])
    if "least-carbon" in results:
        lc = results["least-carbon"]
        out["carbon_vs_least_carbon"] = g["carbon_kg"] / lc["carbon_kg"] - 1 if lc["carbon_kg"] else None
        out["slo_violations_vs_least_carbon"] = (g["slo_violations"], lc["slo_violations"])
        out["jain_vs_least_carbon"] = (g["jain_fairness"], lc["jain_fairness"])
    if "least-carbon-slo" in results:
        # Greedy carbon without breaking an SLO: what least-carbon's ranking achieves on the GNN's terms.
        safe = results["least-carbon-slo"]
        out["carbon_vs_least_carbon_slo"] = g["carbon_kg"] / safe["carbon_kg"] - 1 if safe["carbon_kg"] else None
        out["failures_vs_least_carbon_slo"] = (g["failures"], safe["failures"])
    return out


def decision_latency(policy_name: str, *, clusters: int, traces_dir: Path, decisions: int = 2000,
                     checkpoint: Path | None = None, seed: int = 0) -> dict[str, float]:
    """Latency of routing decisions (filter → score → select) over a ``clusters``-cluster snapshot.

    Both wall time and the thread's CPU time are reported: on a shared machine the wall-time tail is
    the scheduler's preemptions, the CPU time is what one dedicated core would take. Torch runs on
    one thread.
    """
    import numpy as np
    import torch

    from global_scheduler.routing.base import Router

    torch.set_num_threads(1)
    sim = FederationSim(FederationConfig(clusters=clusters, days=1, seed=seed), traces_dir)
    sim._reset_state()
    feats = sim._features(0)
    workloads = [sim.workload_features(p, 0, 1.0) for p in sim.workloads[:200]]
    kwargs = {"checkpoint": checkpoint} if policy_name == "gnn" and checkpoint else {}
    router = Router(get_policy(policy_name, **kwargs))
    for w in workloads[:50]:
        router.decide(lambda: feats, w)
    wall, cpu = [], []
    for i in range(decisions):
        w = workloads[i % len(workloads)]
        t0, c0 = time.perf_counter(), time.thread_time()
        router.decide(lambda: feats, w)
        cpu.append(time.thread_time() - c0)
        wall.append(time.perf_counter() - t0)
    wall_ms, cpu_ms = np.array(wall) * 1000, np.array(cpu) * 1000
    return {"clusters": clusters, "decisions": decisions,
            "wall_ms_p50": float(np.percentile(wall_ms, 50)), "wall_ms_p99": float(np.percentile(wall_ms, 99)),
            "cpu_ms_p50": float(np.percentile(cpu_ms, 50)), "cpu_ms_p99": float(np.percentile(cpu_ms, 99))}
