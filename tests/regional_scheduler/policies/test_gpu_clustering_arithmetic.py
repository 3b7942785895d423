"""``gpu-clustering`` worked by hand: ``score = 25 · band + 25 · (8000 − free milli-GPU) // 8000`` with band
3 = the node holds only the pod's GPU shape class, 2 = that class among others, 1 = no GPU pod yet,
0 = only other classes (classes: shared, 1, 2, 4, 8 GPUs). CPU-only pods score 0. Ties go to the first
node in node order."""

from __future__ import annotations

import numpy as np

from meridian.cluster_state import ClusterState
from meridian.model import GIB, Node, Pod, Resources
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies import gpu_clustering


def _cluster(gpus_per_node: list[int], placed: list[list[Resources]]) -> ClusterState:
    """Nodes ``n0``, ``n1``, … with the given GPU counts, each already holding the ``placed`` pods."""
    state = ClusterState.from_nodes([
        Node(name=f"n{i}", capacity=Resources(milli_cpu=64000, memory_bytes=64 * GIB, gpu=g), gpu_model="T4")
        for i, g in enumerate(gpus_per_node)])
    for i, pods in enumerate(placed):
        for j, requests in enumerate(pods):
            pod = Pod(name=f"placed-{i}-{j}", requests=requests)
            state.allocate(pod, state.choose_devices(i, pod))
    return state


def _score(state: ClusterState, pod: Pod) -> list[float]:
    return gpu_clustering.build().score(state, pod, np.arange(state.n_nodes)).scores.tolist()


SHARE_300 = Resources(milli_cpu=1000, gpu_milli=300)
ONE_GPU = Resources(milli_cpu=1000, gpu=1)
TWO_GPUS = Resources(milli_cpu=1000, gpu=2)


def test_shared_pod_goes_where_only_shared_pods_are() -> None:
    state = _cluster([4, 4, 4, 4], [[], [SHARE_300], [SHARE_300, ONE_GPU], [TWO_GPUS]])
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, gpu_milli=500))
    # n0 idle:                    free 4000 → 25 · 4000 // 8000 = 12 (12.5),   band 1 → 12 + 25 = 37
    # n1 shared only:             free 3700 → 25 · 4300 // 8000 = 13 (13.44),  band 3 → 13 + 75 = 88
    # n2 shared and 1-GPU:        free 2700 → 25 · 5300 // 8000 = 16 (16.56),  band 2 → 16 + 50 = 66
    # n3 2-GPU only (other class): free 2000 → 25 · 6000 // 8000 = 18 (18.75), band 0 → 18
    assert _score(state, pod) == [37, 88, 66, 18]
    assert Scheduler(gpu_clustering.build()).schedule(state, pod).node == 1


def test_within_a_band_the_fuller_node_wins() -> None:
    state = _cluster([8, 4, 8], [[ONE_GPU], [ONE_GPU, ONE_GPU], []])
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, gpu=1))
    # n0 one 1-GPU pod on 8:  free 7000 → 25 · 1000 // 8000 = 3 (3.125), band 3 → 78
    # n1 two 1-GPU pods on 4: free 2000 → 25 · 6000 // 8000 = 18,         band 3 → 93
    # n2 idle 8-GPU node:     free 8000 → 0, band 1 → 25 — exactly 25, not inside the module's "(25, 50]"
    assert _score(state, pod) == [78, 93, 25]
    assert Scheduler(gpu_clustering.build()).schedule(state, pod).node == 1


def test_clustering_tie_goes_to_first_node_in_order() -> None:
    share_200 = Resources(milli_cpu=1000, gpu_milli=200)
    state = _cluster([4, 4], [[share_200], [SHARE_300]])
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, gpu_milli=100))
    # n0: free 3800 → 25 · 4200 // 8000 = 13 (13.125) → 88; n1: free 3700 → 25 · 4300 // 8000 = 13 (13.44) → 88.
    # Equal after integer division: n0 wins by node order although n1 has less GPU left.
    assert _score(state, pod) == [88, 88]
    assert Scheduler(gpu_clustering.build()).schedule(state, pod).node == 0


def test_cpu_only_pod_scores_zero() -> None:
    state = _cluster([4, 2], [[SHARE_300], []])
    assert _score(state, Pod(name="p", requests=Resources(milli_cpu=1000))) == [0, 0]
