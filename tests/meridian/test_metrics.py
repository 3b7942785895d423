import numpy as np
import pytest

from meridian import metrics
from meridian.cluster_state import ClusterState
from meridian.fragmentation import TargetWorkload, node_fragmentation_milli
from meridian.model import GIB, Node, Pod, Resources


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([1, 1, 1, 1], 0.0, id="equal"),
        pytest.param([0, 0, 0, 4], 0.75, id="one-holds-all"),  # (n-1)/n
        pytest.param([1, 2, 3, 4], 0.25, id="linear"),  # Σ|xi-xj| / (2 n² mean) = 20 / (2·16·2.5)
        pytest.param([0, 0], 0.0, id="all-zero"),
    ],
)
def test_gini(values: list[float], expected: float) -> None:
    assert metrics.gini(np.array(values)) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("values", "expected"),
    [pytest.param([5, 5, 5], 1.0, id="equal"), pytest.param([1, 0, 0, 0], 0.25, id="one-of-four"),
     pytest.param([1, 2], 0.9, id="two")],  # (1+2)² / (2·(1+4)) = 9/10
)
def test_jain(values: list[float], expected: float) -> None:
    assert metrics.jain_fairness(np.array(values)) == pytest.approx(expected)


def test_fgd_fragmentation_hand_computed() -> None:
    # One node, 4 CPUs free, GPUs free: [1000, 300]. Workload: 50% "0.5 GPU, 2 CPU", 50% CPU-only.
    # Shared type fits (device 0): only the 300 slice is too small → 300 fragmented.
    # CPU-only type: all 1300 free milli-GPU count as fragment (the paper's x-axis case).
    # Expected = 0.5·300 + 0.5·1300 = 800.
    w = TargetWorkload(
        milli_cpu=np.array([2000, 1000]), gpu_milli_per_device=np.array([500, 0]), gpu_count=np.array([1, 0]),
        model_access=np.ones((2, 2), dtype=bool), probability=np.array([0.5, 0.5]))
    frag = node_fragmentation_milli(w, np.array([4000]), np.array([[1000, 300]]), np.array([0]))
    assert frag[0] == pytest.approx(800.0)
    # With only 1 CPU free the shared type cannot run (lacks CPU): all 1300 fragmented for it too.
    frag = node_fragmentation_milli(w, np.array([1000]), np.array([[1000, 300]]), np.array([0]))
    assert frag[0] == pytest.approx(1300.0)


def test_allocation_ratios() -> None:
    state = ClusterState.from_nodes([Node(name="n", capacity=Resources(milli_cpu=4000, memory_bytes=8 * GIB, gpu=2))])
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, memory_bytes=2 * GIB, gpu=1))
    state.allocate(pod, state.choose_devices(0, pod))
    assert metrics.cpu_alloc_pct(state) == pytest.approx(25.0)
    assert metrics.mem_alloc_pct(state) == pytest.approx(25.0)
    assert metrics.gpu_alloc_pct(state) == pytest.approx(50.0)
