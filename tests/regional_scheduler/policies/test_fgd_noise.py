"""FGD's choice must not depend on its cache.

The score cache computes stale nodes in batches whose size varies with the decision history, and
numpy's reductions round differently by batch size (±1e-14 on a node's fragmentation). Before the
deltas were quantised, a node whose true delta is 0 scored 50 or 49 depending on that noise: on
``default``, seed 42, a warm and a cold FGD first chose different nodes at pod 3,105.
"""

import numpy as np
import pytest

from meridian.cluster_state import ClusterState
from meridian.fragmentation import TargetWorkload
from meridian.traces import openb
from regional_scheduler.filters import run_filters
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies import fgd, fgd_score


def test_warm_and_cold_fgd_score_every_node_alike_on_openb() -> None:
    nodes = openb.load_nodes()
    pod_list = openb.load_pods(openb.openb_dir() / "openb_pod_list_default.csv")
    cap = sum(n.allocatable_resources.gpu for n in nodes) * 1000
    arrivals = openb.inflate_pods(pod_list, cap, ratio=1.3, seed=42)[:3300]
    state = ClusterState.from_nodes(nodes)
    warm = fgd.FgdPolicy()
    scheduler = Scheduler(warm, seed=42)
    scheduler.prepare(state, pod_list)
    compared = 0
    for i, pod in enumerate(arrivals):
        if i % 5 == 0:
            candidates = np.flatnonzero(run_filters(state, pod)[0])
            cold = fgd.FgdPolicy(warm.workload)  # fresh caches: every node computed in one batch
            w, c = warm.score(state, pod, candidates), cold.score(state, pod, candidates)
            np.testing.assert_array_equal(w.scores, c.scores, err_msg=f"scores, pod {i}")
            np.testing.assert_array_equal(w.devices, c.devices, err_msg=f"devices, pod {i}")
            compared += 1
        placement = scheduler.place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)
    assert compared == 660


def test_noise_sized_deltas_are_quantised_away() -> None:
    noisy = np.array([3.4e-13, -2e-14, 0.0, 1e-4 + 3e-14, -1e-4 - 3e-14])
    assert np.array_equal(fgd_score.quantise(noisy), [0, 0, 0, 1e-4, -1e-4])
    score = np.floor(fgd_score.sigmoid(-fgd_score.quantise(np.array([3.4e-13, -3.4e-13])) / 1000.0) * 100)
    assert list(score) == [50, 50]


class _EmptyingFgd(fgd.FgdPolicy):
    """The old way: a new online target workload empties every cache."""

    def _reweight(self, state: ClusterState) -> None:
        self._state = None


@pytest.mark.parametrize("pod_list_name", ["gpushare40", "gpuspec25"])
def test_online_reweighting_decides_exactly_as_emptying_the_caches(monkeypatch, pod_list_name: str) -> None:
    """``gpuspec25``: pods constrained to GPU models, some of which these 200 nodes lack."""
    monkeypatch.setattr(fgd, "ONLINE_DRIFT", -1.0)  # a new estimate at every look: many re-weights
    nodes = openb.load_nodes()[:200]
    pod_list = openb.load_pods(openb.openb_dir() / f"openb_pod_list_{pod_list_name}.csv")
    cap = sum(n.allocatable_resources.gpu for n in nodes) * 1000
    arrivals = openb.inflate_pods(pod_list, cap, ratio=1.3, seed=7)

    def run(policy: fgd.FgdPolicy) -> list[tuple[int, tuple[int, ...]] | None]:
        state = ClusterState.from_nodes(nodes)
        scheduler = Scheduler(policy)
        chosen = []
        for pod in arrivals:
            placement = scheduler.place(state, pod)
            chosen.append(None if placement is None else (placement.node, placement.devices))
            if placement is not None:
                state.allocate(pod, placement)
        return chosen

    reweighting = fgd.FgdPolicy()
    chosen = run(reweighting)
    assert reweighting.online_rebuilds >= 10
    assert chosen == run(_EmptyingFgd())


def _workload(shapes: dict[tuple, int]) -> TargetWorkload:
    return TargetWorkload.from_counts(shapes, ["A100", "V100"])


def test_rows_keep_a_type_in_its_row_and_reuse_freed_rows() -> None:
    rows = fgd._Rows()
    rows.assign(_workload({(1000, 0, 0, ()): 3, (2000, 0, 0, ()): 1}))
    assert list(rows.of_type) == [0, 1] and list(rows.assigned) == [1, 1]
    # (1000, …) stays in row 0, (2000, …) leaves row 1, and the newcomer takes it.
    rows.assign(_workload({(1000, 0, 0, ()): 1, (4000, 0, 0, ()): 3}))
    assert list(rows.of_type) == [1, 0] and list(rows.assigned) == [1, 2]
    assert list(rows.new_since(1)) == [0] and rows.capacity == 2
    np.testing.assert_allclose(rows.weight, [0.25, 0.75])
    rows.assign(_workload({(1000, 0, 0, ()): 1, (4000, 0, 0, ()): 1, (8000, 0, 0, ()): 2}))
    assert rows.capacity == 3 and list(rows.new_since(2)) == [0]  # the largest count comes first


def test_rows_sum_the_weights_of_shapes_that_are_one_type() -> None:
    rows = fgd._Rows()
    # Neither model is in the cluster: both shapes have no access anywhere, i.e. one task type.
    rows.assign(_workload({(1000, 1000, 1, ("H100",)): 1, (1000, 1000, 1, ("T4",)): 1, (500, 0, 0, ()): 2}))
    assert rows.capacity == 2
    np.testing.assert_allclose(sorted(rows.weight), [0.5, 0.5])
