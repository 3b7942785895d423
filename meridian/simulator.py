"""A trace-driven cluster simulator: places pods one by one with a policy and records metrics.

Three protocols (see ``docs/scenarios.md``):

- ``openb`` — the FGD paper's: the GPU-node list, the pod list inflated to 130 % of GPU capacity
  and shuffled per seed, pods only arrive; metrics at every 1 % of arrived GPU request.
- ``timeline`` — the trace's own creation and deletion times; pods also leave.
- ``seed-50x200`` — the seed analysis' 50 nodes of 8 CPU / 16 GiB and 200 pods whose CPU request
  totals about 95 % of capacity.

The simulator knows nothing about filters or scores: a policy is anything with ``prepare`` and
``place`` (the regional scheduler's :class:`~regional_scheduler.framework.Scheduler` is one), so
the core stays free of component imports.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from meridian import metrics
from meridian.cluster_state import ClusterState, Placement
from meridian.fragmentation import TargetWorkload
from meridian.model import GIB, MIB, Node, Pod, Resources
from meridian.packing_bound import share_packing_bound

SCENARIOS = ("openb", "timeline", "seed-50x200")


class PlacementPolicy(Protocol):
    name: str

    def prepare(self, state: ClusterState, workload: Sequence[Pod]) -> None: ...

    def place(self, state: ClusterState, pod: Pod) -> Placement | None: ...


@dataclass
class RunResult:
    policy: str
    scenario: str
    seed: int
    n_arrived: int = 0
    n_failed: int = 0
    decision_ms: list[float] = field(default_factory=list)
    # arrived GPU request in % of capacity → {"gpu_alloc_pct", "frag_gpu_pct", "frag_ratio_pct"}
    curve: dict[int, dict[str, float]] = field(default_factory=dict)
    final: dict[str, float | None] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def failure_rate(self) -> float:
        return self.n_failed / self.n_arrived if self.n_arrived else 0.0


def _state_metrics(state: ClusterState) -> dict[str, float | None]:
    return {
        "cpu_alloc_pct": metrics.cpu_alloc_pct(state),
        "mem_alloc_pct": metrics.mem_alloc_pct(state),
        "gpu_alloc_pct": metrics.gpu_alloc_pct(state),
        "frag_gini": metrics.seed_fragmentation_score(state),
        "util_variance": metrics.util_variance(state),
    }


def _timed_place(policy: PlacementPolicy, state: ClusterState, pod: Pod, result: RunResult) -> Placement | None:
    t0 = time.perf_counter()
    placement = policy.place(state, pod)
    result.decision_ms.append((time.perf_counter() - t0) * 1e3)
    result.n_arrived += 1
    if placement is None:
        result.n_failed += 1
    else:
        state.allocate(pod, placement)
    return placement


def run_arrivals(
    policy: PlacementPolicy,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    *,
    workload: Sequence[Pod],
    scenario: str,
    seed: int,
    curve_every_pct: int = 1,
    on_step: Callable[[int], None] | None = None,
    prepare: bool = True,
) -> RunResult:
    """Place ``pods`` in order, never releasing; record GPU metrics at every ``curve_every_pct``
    of arrived GPU request (the FGD paper's x-axis). ``prepare=False`` never tells the policy the
    target workload, as in a live scheduler: FGD then learns it from the pods it places."""
    state = ClusterState.from_nodes(nodes)
    if prepare:
        policy.prepare(state, workload)
    target = TargetWorkload.from_pods(workload, state.gpu_models)
    cap = metrics.gpu_capacity_milli(state)
    result = RunResult(policy=policy.name, scenario=scenario, seed=seed)
    arrived_gpu, next_mark = 0, curve_every_pct
    placed_shares: Counter[int] = Counter()  # milli-GPU share → placed pods, for the packing bound
    t0 = time.perf_counter()
    for i, pod in enumerate(pods):
        if _timed_place(policy, state, pod, result) is not None and pod.requests.gpu_milli:
            placed_shares[pod.requests.gpu_milli] += 1
        arrived_gpu += pod.requests.gpu_milli_total
        while cap and arrived_gpu * 100 >= next_mark * cap:
            frag = metrics.gpu_fragmentation(state, target)
            result.curve[next_mark] = {
                "gpu_alloc_pct": metrics.gpu_alloc_pct(state) or 0.0,
                "frag_gpu_pct": frag[0] if frag else 0.0,
                "frag_ratio_pct": frag[1] if frag else 0.0,
            }
            if next_mark == 100:
                result.curve[100].update(_idle_at_full(state, placed_shares))
            next_mark += curve_every_pct
        if on_step is not None:
            on_step(i)
    result.wall_s = time.perf_counter() - t0
    result.final = _state_metrics(state)
    frag = metrics.gpu_fragmentation(state, target)
    result.final["frag_gpu_pct"] = frag[0] if frag else None
    return result


def _idle_at_full(state: ClusterState, placed_shares: Counter[int]) -> dict[str, float]:
    """Where the idle GPUs are when the arrived request reaches capacity, and the least idle capacity
    any packing of the same placed shares must leave (:mod:`meridian.packing_bound`)."""
    partial, whole = metrics.gpu_idle_split(state)
    return {"idle_partial_gpus": partial, "idle_whole_gpus": whole,
            "share_idle_bound_gpus": share_packing_bound(placed_shares).idle_gpus}


def run_timeline(
    policy: PlacementPolicy,
    nodes: Sequence[Node],
    pods: Sequence[Pod],
    *,
    seed: int,
    on_step: Callable[[int], None] | None = None,
    prepare: bool = True,
) -> RunResult:
    """Replay creation and deletion times: a pod that fails at creation is dropped (``prepare`` as
    in :func:`run_arrivals`)."""
    missing = [p.name for p in pods if p.creation_time_s is None]
    if missing:
        raise ValueError(f"the timeline protocol needs creation times; {len(missing)} pods lack one "
                         f"(e.g. {missing[0]}); use a pod list with timestamps")
    state = ClusterState.from_nodes(nodes)
    if prepare:
        policy.prepare(state, pods)
    result = RunResult(policy=policy.name, scenario="timeline", seed=seed)
    # Events: (time, kind, index); deletions sort before creations at the same instant.
    events = [(p.creation_time_s, 1, i) for i, p in enumerate(pods)]
    events += [(p.deletion_time_s, 0, i) for i, p in enumerate(pods) if p.deletion_time_s is not None]
    events.sort()
    placed: dict[int, Placement] = {}
    samples: list[dict[str, float | None]] = []
    t0 = time.perf_counter()
    for step, (_, kind, i) in enumerate(events):
        if kind == 1:
            placement = _timed_place(policy, state, pods[i], result)
            if placement is not None:
                placed[i] = placement
            if on_step is not None:
                on_step(step)
        elif i in placed:
            state.release(pods[i], placed.pop(i))
        if step % 500 == 0:
            samples.append(_state_metrics(state))
    result.wall_s = time.perf_counter() - t0
    result.final = _state_metrics(state)
    # Time-averaged allocation is what a timeline run is judged on; the final state is mostly empty.
    for key in ("cpu_alloc_pct", "mem_alloc_pct", "gpu_alloc_pct", "frag_gini", "util_variance"):
        values = [s[key] for s in samples if s[key] is not None]
        result.final[f"mean_{key}"] = float(np.mean(values)) if values else None
    return result


# The seed analysis' request mix: (CPU cores, memory GiB, share of pods). Mean CPU 1.9 cores, so
# 200 pods ask for ~380 of the 400 cores (95 %); memory is 2 GiB per core like the nodes.
SEED_MIX: tuple[tuple[float, float, float], ...] = (
    (0.5, 1.0, 0.20),
    (1.0, 2.0, 0.25),
    (2.0, 4.0, 0.25),
    (3.0, 6.0, 0.15),
    (4.0, 8.0, 0.15),
)


def seed_cluster(n_nodes: int = 50) -> list[Node]:
    return [Node(name=f"seed-node-{i:02d}", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB))
            for i in range(n_nodes)]


def seed_pods(seed: int, n_pods: int = 200) -> list[Pod]:
    rng = np.random.default_rng(seed)
    shares = np.array([m[2] for m in SEED_MIX])
    picks = rng.choice(len(SEED_MIX), size=n_pods, p=shares / shares.sum())
    pods = []
    for i, k in enumerate(picks):
        cpu, mem_gib, _ = SEED_MIX[int(k)]
        pods.append(Pod(name=f"seed-pod-{i:03d}",
                        requests=Resources(milli_cpu=int(cpu * 1000), memory_bytes=int(mem_gib * 1024) * MIB)))
    return pods
