"""The rollout (lookahead) teacher over FGD (``docs/history/bench-learned-diary.md``), on real components."""

from __future__ import annotations

import numpy as np
import pytest

from experiments.rollout import RolloutPolicy, node_signature
from meridian.cluster_state import ClusterState
from meridian.model import Node, Pod
from meridian.simulator import run_arrivals
from regional_scheduler.filters import run_filters
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies.fgd import FgdPolicy


@pytest.fixture(scope="module")
def openb_slice(make_openb_slice) -> tuple[list[Node], list[Pod], list[Pod]]:
    """Every 24th openb node (51 nodes), a GPU-model-constrained version of a training list inflated
    to their capacity, cut at 400 pods (enough to fill the nodes and make pods fail)."""
    return make_openb_slice(24, "gpushare40", seed=7, count=400, augment_seed=3)


def _decisions(policy, nodes: list[Node], workload: list[Pod], arrivals: list[Pod]) -> list:
    """Every placement of a run, checking each one against the filter before it is applied."""
    if isinstance(policy, RolloutPolicy):
        policy.prepare_arrivals(arrivals)
    state = ClusterState.from_nodes(nodes)
    policy.prepare(state, workload)
    out = []
    for pod in arrivals:
        mask, _ = run_filters(state, pod)
        before = (state.req_milli_cpu.copy(), state.gpu_free_milli.copy())
        placement = policy.place(state, pod)
        # The rollouts ran on this state and must have left it exactly as they found it.
        assert np.array_equal(before[0], state.req_milli_cpu) and np.array_equal(before[1], state.gpu_free_milli)
        if placement is None:
            assert not mask.any()
        else:
            assert mask[placement.node], "the teacher chose an infeasible node"
            state.allocate(pod, placement)
        out.append(placement)
    return out


def test_zero_horizon_is_fgd(openb_slice) -> None:
    nodes, workload, arrivals = openb_slice
    assert _decisions(RolloutPolicy(horizon=0), nodes, workload, arrivals) == \
        _decisions(Scheduler(FgdPolicy()), nodes, workload, arrivals)


@pytest.mark.parametrize("future", ["trace", "sampled"])
def test_feasible_deterministic_and_not_fgd(openb_slice, future: str) -> None:
    nodes, workload, arrivals = openb_slice
    runs = [_decisions(RolloutPolicy(horizon=6, k=3, score_slack=1, future=future, samples=2), nodes, workload,
                       arrivals) for _ in range(2)]
    assert runs[0] == runs[1]
    # The lookahead does change decisions (else the experiment measured nothing).
    assert runs[0] != _decisions(Scheduler(FgdPolicy()), nodes, workload, arrivals)


def test_candidates_are_distinct_and_start_with_fgds_node(openb_slice) -> None:
    nodes, workload, arrivals = openb_slice
    state = ClusterState.from_nodes(nodes)
    teacher = RolloutPolicy(horizon=4, k=50, score_slack=3)
    teacher.prepare(state, workload)
    fgd = FgdPolicy()
    fgd.prepare(state, workload)
    for pod in arrivals[:60]:
        feasible = np.flatnonzero(run_filters(state, pod)[0])
        scores = fgd.score(state, pod, feasible).scores
        cand = teacher.candidates(state, feasible, scores)
        assert cand[0] == int(np.argmax(scores))
        sig = node_signature(state, feasible[cand])
        assert len({tuple(row) for row in sig}) == cand.size
        assert (scores[cand] >= scores.max() - 3).all()
        placement = Scheduler(fgd).place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)


def test_run_through_the_simulator(openb_slice) -> None:
    nodes, workload, arrivals = openb_slice
    teacher = RolloutPolicy(horizon=4, k=2)
    teacher.prepare_arrivals(arrivals)
    result = run_arrivals(teacher, nodes, arrivals, workload=workload, scenario="openb", seed=0)
    assert result.n_arrived == len(arrivals) and teacher.stats.decisions == len(arrivals)
    assert teacher.stats.rolled > 0 and teacher.stats.rollout_steps > 0
