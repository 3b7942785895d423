import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meridian.cluster_state import AllocationError, ClusterState
from meridian.model import GIB, Node, Pod, Resources
from regional_scheduler.filters import fit_resources


def _cluster() -> ClusterState:
    return ClusterState.from_nodes([
        Node(name="a", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB, gpu=2), gpu_model="T4"),
        Node(name="b", capacity=Resources(milli_cpu=4000, memory_bytes=8 * GIB)),
        Node(name="c", capacity=Resources(milli_cpu=16000, memory_bytes=32 * GIB, gpu=8), gpu_model="G2"),
    ])


pod_strategy = st.builds(
    lambda cpu, mem, gpu, share: Pod(
        name="p",
        requests=Resources(milli_cpu=cpu, memory_bytes=mem * GIB // 4, gpu=gpu if not share else 0,
                           gpu_milli=share if gpu == 0 else 0)),
    st.integers(0, 6000), st.integers(0, 24), st.sampled_from([0, 0, 1, 2, 4]), st.sampled_from([0, 0, 250, 500, 900]),
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(pod_strategy, st.booleans()), max_size=40))
def test_allocate_release_conserve_and_never_exceed_allocatable(ops: list[tuple[Pod, bool]]) -> None:
    state = _cluster()
    initial = state.copy()
    placed = []
    for pod, release_one in ops:
        fit = np.flatnonzero(fit_resources(state, pod) & state.schedulable)
        if fit.size:
            placement = state.choose_devices(int(fit[0]), pod)
            state.allocate(pod, placement)
            placed.append((pod, placement))
        if release_one and placed:
            state.release(*placed.pop(0))
        assert (state.req_milli_cpu <= state.alloc_milli_cpu).all()
        assert (state.req_memory_bytes <= state.alloc_memory_bytes).all()
        assert (state.gpu_free_milli >= 0).all() and (state.gpu_free_milli <= 1000).all()
    for pod, placement in reversed(placed):
        state.release(pod, placement)
    assert np.array_equal(state.req_milli_cpu, initial.req_milli_cpu)
    assert np.array_equal(state.req_memory_bytes, initial.req_memory_bytes)
    assert np.array_equal(state.gpu_free_milli, initial.gpu_free_milli)
    assert np.array_equal(state.shape_class_count, initial.shape_class_count)


def test_overcommit_and_double_release_are_refused() -> None:
    state = _cluster()
    big = Pod(name="big", requests=Resources(milli_cpu=5000))
    placement = state.choose_devices(1, big)
    with pytest.raises(AllocationError):
        state.allocate(big, placement)
    small = Pod(name="small", requests=Resources(milli_cpu=1000))
    state.allocate(small, state.choose_devices(1, small))
    state.release(small, state.choose_devices(1, small))
    with pytest.raises(AllocationError):
        state.release(small, state.choose_devices(1, small))


def test_shared_gpu_takes_tightest_device() -> None:
    state = _cluster()
    a = Pod(name="a", requests=Resources(gpu_milli=600))
    state.allocate(a, state.choose_devices(0, a))
    b = Pod(name="b", requests=Resources(gpu_milli=300))
    placement = state.choose_devices(0, b)
    assert placement.devices == (0,)  # 400 free on device 0 is tighter than 1000 on device 1
