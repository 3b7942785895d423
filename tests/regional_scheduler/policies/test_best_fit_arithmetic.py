"""``best-fit`` worked by hand: ``s = 0.5 · (free CPU − request)/128 CPUs + 0.5 · (free GPU − request)/8 GPUs``,
score ``int((1 − s) · 100)``; the scheduler picks the highest score, the first in node order on a tie."""

from __future__ import annotations

import numpy as np
import pytest

from meridian.cluster_state import ClusterState
from meridian.model import GIB, GpuDevice, Node, Pod, Resources
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies import best_fit


def _node(name: str, milli_cpu: int, gpu_free_milli: tuple[int, ...] = ()) -> Node:
    """A node with ``milli_cpu`` free and one GPU device per entry of ``gpu_free_milli`` (its free share)."""
    return Node(name=name, capacity=Resources(milli_cpu=milli_cpu, memory_bytes=64 * GIB, gpu=len(gpu_free_milli)),
                gpu_model="T4" if gpu_free_milli else "",
                gpus=tuple(GpuDevice(index=i, free_milli=f) for i, f in enumerate(gpu_free_milli)))


def _scores_and_choice(nodes: list[Node], requests: Resources) -> tuple[list[float], str]:
    state = ClusterState.from_nodes(nodes)
    pod = Pod(name="p", requests=requests)
    scores = best_fit.build().score(state, pod, np.arange(len(nodes))).scores.tolist()
    decision = Scheduler(best_fit.build()).schedule(state, pod)
    assert decision.node is not None
    return scores, state.names[decision.node]


@pytest.mark.parametrize(
    ("nodes", "requests", "expected_scores", "expected_node"),
    [
        pytest.param(
            [_node("n8", 8000), _node("n16", 16000), _node("n64", 64000)],
            Resources(milli_cpu=4000),
            # n8:  s = 0.5 · (8000 − 4000)/128000  = 0.015625 → (1 − 0.015625) · 100 = 98.4375 → 98
            # n16: s = 0.5 · (16000 − 4000)/128000 = 0.046875 → 95.3125 → 95
            # n64: s = 0.5 · (64000 − 4000)/128000 = 0.234375 → 76.5625 → 76
            [98, 95, 76], "n8", id="cpu-only-smallest-leftover-wins"),
        pytest.param(
            [_node("idle8", 32000, (1000,) * 8), _node("idle2", 32000, (1000, 1000)), _node("used1", 32000, (600,))],
            Resources(milli_cpu=4000, gpu_milli=500),
            # CPU term for all three: 0.5 · (32000 − 4000)/128000 = 0.109375
            # idle8: GPU term 0.5 · (8000 − 500)/8000 = 0.46875 → s = 0.578125 → 42.1875 → 42
            # idle2: GPU term 0.5 · (2000 − 500)/8000 = 0.09375 → s = 0.203125 → 79.6875 → 79
            # used1: GPU term 0.5 · (600 − 500)/8000  = 0.00625 → s = 0.115625 → 88.4375 → 88
            [42, 79, 88], "used1", id="shared-gpu-fewest-free-gpus-wins"),
        pytest.param(
            [_node("cpu-a", 64000), _node("gpu-b", 16000, (1000, 1000))],
            Resources(milli_cpu=8000, gpu=1),
            # cpu-a cannot hold a GPU pod (the filter drops it), but its score is still defined:
            # cpu-a: 0.5 · 56000/128000 + 0.5 · (0 − 1000)/8000 = 0.21875 − 0.0625 = 0.15625 → 84.375 → 84
            # gpu-b: 0.5 · 8000/128000 + 0.5 · (2000 − 1000)/8000 = 0.03125 + 0.0625 = 0.09375 → 90.625 → 90
            [84, 90], "gpu-b", id="whole-gpu-counts-1000-milli-per-device"),
    ],
)
def test_best_fit_scores(nodes: list[Node], requests: Resources, expected_scores: list[float],
                         expected_node: str) -> None:
    scores, chosen = _scores_and_choice(nodes, requests)
    assert scores == expected_scores
    assert chosen == expected_node


@pytest.mark.parametrize(
    ("nodes", "expected_node"),
    [
        # 4000m asked. n8000: s = 0.5 · 4000/128000 = 0.015625 → 98.4375 → 98;
        # n8500: s = 0.5 · 4500/128000 = 0.017578125 → 98.2421875 → 98. Truncation makes them equal.
        pytest.param([_node("n8000", 8000), _node("n8500", 8500)], "n8000", id="tighter-first"),
        # The same two nodes the other way round: the looser node wins because it comes first.
        pytest.param([_node("n8500", 8500), _node("n8000", 8000)], "n8500", id="looser-first"),
    ],
)
def test_best_fit_tie_goes_to_first_node_in_order(nodes: list[Node], expected_node: str) -> None:
    scores, chosen = _scores_and_choice(nodes, Resources(milli_cpu=4000))
    assert scores == [98, 98]
    assert chosen == expected_node
