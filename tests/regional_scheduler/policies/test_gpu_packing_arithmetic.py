"""``gpu-packing`` worked by hand, case by case (``gpu_packing.py``'s three rules, integer arithmetic):
1. fits on a partly used GPU: ``max(100 − (tightest such GPU's free milli · 100 // 1000) // 10, 50)``;
2. needs an idle GPU of a partly used node: ``max(50 − idle GPUs taken, 33)``;
3. the node is idle: ``max(33 − its GPU count, its GPU count)``.
CPU-only pods score 0 on every node. Ties go to the first node in node order."""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import GIB, GpuDevice, Node, Pod, Resources
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies import gpu_packing


def _node(name: str, gpu_free_milli: tuple[int, ...] = (), milli_cpu: int = 32000) -> Node:
    """A node with one GPU device per entry of ``gpu_free_milli`` (its free share)."""
    return Node(name=name, capacity=Resources(milli_cpu=milli_cpu, memory_bytes=64 * GIB, gpu=len(gpu_free_milli)),
                gpu_model="T4" if gpu_free_milli else "",
                gpus=tuple(GpuDevice(index=i, free_milli=f) for i, f in enumerate(gpu_free_milli)))


def _score(state: ClusterState, pod: Pod) -> list[float]:
    return gpu_packing.build().score(state, pod, np.arange(state.n_nodes)).scores.tolist()


def test_whole_gpu_pod_prefers_a_partly_used_node_to_idle_ones() -> None:
    state = ClusterState.from_nodes([_node("idle8", (1000,) * 8), _node("used4", (700, 1000, 1000, 1000)),
                                     _node("idle2", (1000, 1000))])
    pod = Pod(name="p", requests=Resources(milli_cpu=4000, gpu=2))
    # idle8: rule 3, max(33 − 8, 8) = 25
    # used4: rule 2 (one GPU in use, 3 idle ≥ 2), max(50 − 2, 33) = 48
    # idle2: rule 3, max(33 − 2, 2) = 31 — of idle nodes, the one with fewer GPUs scores higher
    assert _score(state, pod) == [25, 48, 31]
    decision = Scheduler(gpu_packing.build()).schedule(state, pod)
    assert state.names[decision.node] == "used4"
    assert decision.placement.devices == (1, 2)  # the lowest-index idle devices


def test_shared_gpu_pod_fills_the_tightest_partly_used_gpu() -> None:
    state = ClusterState.from_nodes([
        _node("idle4", (1000,) * 4),
        _node("whole-used", (1000, 1000, 1000, 0)),
        _node("tight", (600, 400)),
        _node("loose", (900, 1000)),
        _node("too-small", (200, 1000)),
    ])
    pod = Pod(name="p", requests=Resources(milli_cpu=4000, gpu_milli=300))
    # idle4:      rule 3, max(33 − 4, 4) = 29
    # whole-used: the used GPU has 0 free (does not fit), no partly used GPU fits → rule 2, max(50 − 1, 33) = 49
    # tight:      partly used GPUs that fit: 600 and 400, tightest 400 → 400 · 100 // 1000 = 40, 40 // 10 = 4 → 96
    # loose:      900 → 90 // 10 = 9 → 100 − 9 = 91
    # too-small:  200 < 300 does not fit, the other GPU is idle → rule 2, 49
    assert _score(state, pod) == [29, 49, 96, 91, 49]
    decision = Scheduler(gpu_packing.build()).schedule(state, pod)
    assert state.names[decision.node] == "tight"
    assert decision.placement.devices == (1,)  # the state's tightest-fit device, 400 free


def test_case_one_never_reaches_its_floor_of_50() -> None:
    # A 100-milli pod on a GPU with 999 free: 999 · 100 // 1000 = 99, 99 // 10 = 9 → 91 (not below 50, so kept).
    # The floor of 50 cannot bind: free < 1000 gives at most 99 // 10 = 9, so case 1 is always 91..100.
    state = ClusterState.from_nodes([_node("a", (999,)), _node("b", (100,))])
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, gpu_milli=100))
    # b: 100 · 100 // 1000 = 10 → 10 // 10 = 1 → 99
    assert _score(state, pod) == [91, 99]


def test_packing_tie_goes_to_first_node_in_order() -> None:
    # 100 milli asked. first: 450 free → 450 · 100 // 1000 = 45 → 45 // 10 = 4 → 96;
    # second: 400 free → 40 // 10 = 4 → 96. Equal after integer division: the first node wins, though the
    # second is tighter.
    state = ClusterState.from_nodes([_node("first", (450,)), _node("second", (400,))])
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, gpu_milli=100))
    assert _score(state, pod) == [96, 96]
    assert state.names[Scheduler(gpu_packing.build()).schedule(state, pod).node] == "first"


def test_cpu_only_pod_scores_zero_and_goes_to_the_first_feasible_node() -> None:
    state = ClusterState.from_nodes([_node("small", milli_cpu=1000), _node("gpu", (500,)), _node("cpu")])
    pod = Pod(name="p", requests=Resources(milli_cpu=2000))
    assert _score(state, pod) == [0, 0, 0]
    # "small" has only 1000m and is filtered out; of the rest, all score 0 and the first in order wins.
    assert state.names[Scheduler(gpu_packing.build()).schedule(state, pod).node] == "gpu"
