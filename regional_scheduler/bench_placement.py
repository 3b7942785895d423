"""``meridian bench placement``: every policy on the same input, in one run, side by side.

For each seed, each policy gets an identical copy of the workload (same inflation, same order),
so differences come from the policies alone. Metrics are averaged over seeds; a metric that does
not apply to a scenario (GPU metrics on a CPU-only cluster) is ``null``.

A policy sees only the past, as in a live scheduler: the pods placed so far (and the ones that fit
no node). The FGD paper's protocol (``paper=True``, ``--paper``) also states the target workload's
*distribution* before the run (the pod list, which FGD and the learned policy's gate reduce to
frequencies of pod shapes: a policy's decisions do not change when the list is reordered, which
``tests/regional_scheduler/test_bench_protocol.py`` checks); it is reported as such.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meridian.model import Node, Pod
from meridian.simulator import RunResult, run_arrivals, run_timeline, seed_cluster, seed_pods
from meridian.traces import openb
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies.base import ReportsRunCounts
from regional_scheduler.policies.registry import LEARNED, get_policy

OPENB_FIRST_SEED = 42
SEED_FIRST_SEED = 0


@dataclass(frozen=True)
class BenchInput:
    scenario: str
    nodes: list[Node]
    pods: list[Pod]  # the pod list (its distribution is the target workload under the paper protocol)


def load_input(scenario: str, *, pods_csv: Path | None = None, nodes_csv: Path | None = None) -> BenchInput:
    if scenario == "seed-50x200":
        return BenchInput(scenario, seed_cluster(), [])
    if scenario not in ("openb", "timeline"):
        raise ValueError(f"unknown scenario {scenario!r}; choose openb, timeline or seed-50x200")
    nodes = openb.load_nodes(nodes_csv)
    pods = openb.load_pods(pods_csv or openb.openb_dir() / "openb_pod_list_default.csv")
    return BenchInput(scenario, nodes, pods)


def bench_policy(name: str) -> Any:
    """The policy as benchmarked. ``learned`` runs its model on every decision: its wall-clock budget
    is counted, not enforced (``enforce_budget=False``), so a result does not depend on how loaded
    the machine was; the count is reported (``over_budget_decisions``)."""
    if name == LEARNED:
        from regional_scheduler.learned.serving import ServingSettings

        return get_policy(name, settings=ServingSettings.from_env().model_copy(update={"enforce_budget": False}))
    return get_policy(name)


def _with_policy_counts(result: RunResult, scheduler: Scheduler) -> RunResult:
    """The policy's own counters, for a policy that declares :class:`ReportsRunCounts` (the learned one:
    decisions over budget, fallbacks, and whether the gate left the workload to FGD)."""
    if isinstance(scheduler.policy, ReportsRunCounts):
        result.final.update(scheduler.policy.run_counts())
    return result


def run_one(inp: BenchInput, policy_name: str, seed: int, *, on_step: Callable[[int], None] | None = None,
            scheduler_factory: Callable[[str, int], Scheduler] | None = None, paper: bool = False) -> RunResult:
    """One policy, one seed. By default the policy is never told the target workload (a live
    scheduler's situation): FGD, and the learned policy's FGD, learn it from the pods they place.
    ``paper``: the FGD paper's protocol, the workload's distribution stated before the run."""
    make = scheduler_factory or (lambda name, s: Scheduler(bench_policy(name), seed=s))
    scheduler = make(policy_name, seed)
    return _with_policy_counts(_run(inp, scheduler, seed, on_step, prepare=paper), scheduler)


def _run(inp: BenchInput, scheduler: Any, seed: int, on_step: Callable[[int], None] | None, *,
         prepare: bool) -> RunResult:
    if inp.scenario == "openb":
        cap = sum(n.allocatable_resources.gpu for n in inp.nodes) * 1000
        arrivals = openb.inflate_pods(inp.pods, cap, ratio=1.3, seed=seed)
        return run_arrivals(scheduler, inp.nodes, arrivals, workload=inp.pods, scenario="openb", seed=seed,
                            on_step=on_step, prepare=prepare)
    if inp.scenario == "timeline":
        return run_timeline(scheduler, inp.nodes, inp.pods, seed=seed, on_step=on_step, prepare=prepare)
    pods = seed_pods(seed)
    return run_arrivals(scheduler, inp.nodes, pods, workload=pods, scenario=inp.scenario, seed=seed, on_step=on_step,
                        prepare=prepare)


def n_steps(inp: BenchInput, seed: int) -> int:
    if inp.scenario == "openb":
        cap = sum(n.allocatable_resources.gpu for n in inp.nodes) * 1000
        return len(openb.inflate_pods(inp.pods, cap, ratio=1.3, seed=seed))
    return len(inp.pods) if inp.scenario == "timeline" else 200


def _mean(values: Sequence[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return float(np.mean(vals)) if vals else None


def _sum(values: Sequence[float | None]) -> int | None:
    vals = [v for v in values if v is not None]
    return int(sum(vals)) if vals else None


def summarize(results: Sequence[RunResult], total_gpus: int) -> dict[str, Any]:
    """Per-policy means over seeds, with the keys the issue and the docs name."""
    at100 = [r.curve.get(100) for r in results]
    alloc100 = _mean([c["gpu_alloc_pct"] if c else None for c in at100])
    decision = np.concatenate([np.asarray(r.decision_ms) for r in results]) if results else np.zeros(0)
    return {
        "gpu_alloc_pct_at_100": alloc100,
        "unallocated_gpus_at_100": None if alloc100 is None else (100.0 - alloc100) / 100.0 * total_gpus,
        "frag_gpu_pct_at_100": _mean([c["frag_gpu_pct"] if c else None for c in at100]),
        # The unallocated GPUs split by where they sit, and the idle capacity that no packing of the
        # same placed GPU shares can avoid (meridian.packing_bound): partial − bound is what a better
        # placement of those shares could still win; whole GPUs are stranded by CPU, memory or size.
        "idle_partial_gpus_at_100": _mean([c.get("idle_partial_gpus") if c else None for c in at100]),
        "idle_whole_gpus_at_100": _mean([c.get("idle_whole_gpus") if c else None for c in at100]),
        "share_idle_bound_gpus_at_100": _mean([c.get("share_idle_bound_gpus") if c else None for c in at100]),
        "gpu_alloc_pct_at_130": _mean([r.curve[130]["gpu_alloc_pct"] if 130 in r.curve else None for r in results]),
        "gpu_alloc_pct_time_mean": _mean([r.final.get("mean_gpu_alloc_pct") for r in results]),
        "failure_rate": _mean([r.failure_rate for r in results]),
        "cpu_alloc_pct": _mean([r.final.get("mean_cpu_alloc_pct", r.final["cpu_alloc_pct"]) for r in results]),
        "mem_alloc_pct": _mean([r.final.get("mean_mem_alloc_pct", r.final["mem_alloc_pct"]) for r in results]),
        "frag_gini": _mean([r.final.get("mean_frag_gini", r.final["frag_gini"]) for r in results]),
        "util_variance": _mean([r.final.get("mean_util_variance", r.final["util_variance"]) for r in results]),
        "decision_ms_p50": float(np.percentile(decision, 50)) if decision.size else None,
        "decision_ms_p99": float(np.percentile(decision, 99)) if decision.size else None,
        "wall_s_per_seed": _mean([r.wall_s for r in results]),
        "seeds": [r.seed for r in results],
        # learned only (null otherwise): decisions slower than the serving budget, and fallbacks to FGD
        # (the benchmark does not enforce the budget, so fallbacks are errors or a missing checkpoint).
        "over_budget_decisions": _sum([r.final.get("over_budget_decisions") for r in results]),
        "fallback_decisions": _sum([r.final.get("fallback_decisions") for r in results]),
        # learned only: seeds whose workload its gpu profile's gate_share left to FGD (at the run's end)
        "gated_to_fgd_seeds": _sum([r.final.get("gated_to_fgd") for r in results]),
        "per_seed_gpu_alloc_pct_at_100": [c["gpu_alloc_pct"] if c else None for c in at100],
    }


def seeds_for(scenario: str, n: int) -> list[int]:
    first = OPENB_FIRST_SEED if scenario in ("openb", "timeline") else SEED_FIRST_SEED
    return list(range(first, first + n))


def write_json(path: Path, payload: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, sort_keys=True))
