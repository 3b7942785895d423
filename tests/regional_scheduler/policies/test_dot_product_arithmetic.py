"""``dot-product`` worked by hand. Per node, with CPU normalised by 128 CPUs:
``cpu = free/128000 · request/128000``; the GPU term is, for a shared-GPU pod, per fitting device
``free/1000 · share/1000`` (the best, smallest, device kept), otherwise ``free total/8000 · request/8000``;
``dot = (cpu + gpu)/2`` and the score is ``int((1 − dot) · 100)``. Ties go to the first node in order."""

from __future__ import annotations

import numpy as np
import pytest

from meridian.cluster_state import ClusterState
from meridian.model import GIB, GpuDevice, Node, Pod, Resources
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies import dot_product


def _node(name: str, milli_cpu: int, gpu_free_milli: tuple[int, ...] = ()) -> Node:
    """A node with ``milli_cpu`` free and one GPU device per entry of ``gpu_free_milli`` (its free share)."""
    return Node(name=name, capacity=Resources(milli_cpu=milli_cpu, memory_bytes=64 * GIB, gpu=len(gpu_free_milli)),
                gpu_model="T4" if gpu_free_milli else "",
                gpus=tuple(GpuDevice(index=i, free_milli=f) for i, f in enumerate(gpu_free_milli)))


def test_whole_gpu_pod_prefers_the_smallest_product_of_free_and_asked() -> None:
    nodes = [_node("big", 128000, (1000,) * 8), _node("half", 64000, (1000,) * 4),
             _node("cpu-heavy", 96000, (1000,) * 4)]
    state = ClusterState.from_nodes(nodes)
    pod = Pod(name="p", requests=Resources(milli_cpu=64000, gpu=4))
    result = dot_product.build().score(state, pod, np.arange(3))
    # big:       cpu 128000/128000 · 64000/128000 = 0.5,   gpu 8000/8000 · 4000/8000 = 0.5  → dot 0.5    → 50
    # half:      cpu 0.5 · 0.5 = 0.25,                      gpu 4000/8000 · 0.5 = 0.25      → dot 0.25   → 75
    # cpu-heavy: cpu 0.75 · 0.5 = 0.375,                    gpu 0.25                         → dot 0.3125 → 68.75 → 68
    assert result.scores.tolist() == [50, 75, 68]
    assert result.devices.tolist() == [-1, -1, -1]  # whole GPUs: the state's idle-device rule
    assert state.names[Scheduler(dot_product.build()).schedule(state, pod).node] == "half"


def test_shared_gpu_pod_scores_each_device_and_keeps_the_best() -> None:
    nodes = [_node("two", 64000, (1000, 600)), _node("one", 32000, (1000,)),
             _node("four", 128000, (1000, 400, 1000, 500))]
    state = ClusterState.from_nodes(nodes)
    pod = Pod(name="p", requests=Resources(milli_cpu=32000, gpu_milli=500))
    result = dot_product.build().score(state, pod, np.arange(3))
    # two:  cpu 64000/128000 · 32000/128000 = 0.125; device 0: 1.0 · 0.5 = 0.5 → (0.125 + 0.5)/2 = 0.3125,
    #       device 1: 0.6 · 0.5 = 0.3 → (0.125 + 0.3)/2 = 0.2125 (best) → (1 − 0.2125) · 100 = 78.75 → 78
    # one:  cpu 0.25 · 0.25 = 0.0625; device 0: 0.5 → (0.0625 + 0.5)/2 = 0.28125 → 71.875 → 71
    # four: cpu 1.0 · 0.25 = 0.25; device 0 and 2: (0.25 + 0.5)/2 = 0.375, device 1 (400 < 500) does not fit,
    #       device 3: 0.5 · 0.5 = 0.25 → (0.25 + 0.25)/2 = 0.25 (best) → 75
    assert result.scores.tolist() == [78, 71, 75]
    assert result.devices.tolist() == [1, 0, 3]
    decision = Scheduler(dot_product.build()).schedule(state, pod)
    assert state.names[decision.node] == "two"
    assert decision.placement.devices == (1,)


@pytest.mark.parametrize(
    ("nodes", "expected_node"),
    [
        # 32000m asked, no GPU. n64: cpu 64000/128000 · 0.25 = 0.125 → dot 0.0625 → 93.75 → 93;
        # n68: 68000/128000 · 0.25 = 0.1328125 → dot 0.06640625 → 93.359375 → 93. Equal after truncation.
        pytest.param([_node("n64", 64000), _node("n68", 68000)], "n64", id="smaller-product-first"),
        pytest.param([_node("n68", 68000), _node("n64", 64000)], "n68", id="larger-product-first"),
    ],
)
def test_dot_product_tie_goes_to_first_node_in_order(nodes: list[Node], expected_node: str) -> None:
    state = ClusterState.from_nodes(nodes)
    pod = Pod(name="p", requests=Resources(milli_cpu=32000))
    assert dot_product.build().score(state, pod, np.arange(2)).scores.tolist() == [93, 93]
    assert state.names[Scheduler(dot_product.build()).schedule(state, pod).node] == expected_node


def test_equal_devices_tie_goes_to_the_lowest_device_slot() -> None:
    state = ClusterState.from_nodes([_node("n", 16000, (300, 1000, 1000))])
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, gpu_milli=500))
    result = dot_product.build().score(state, pod, np.arange(1))
    # Device 0 (300 free) does not fit; devices 1 and 2 both give (16000/128000 · 1000/128000 + 1.0 · 0.5)/2
    # = (0.0009765625 + 0.5)/2 = 0.25048828125 → 74.951… → 74; argmin keeps the first, slot 1.
    assert result.scores.tolist() == [74]
    assert result.devices.tolist() == [1]
