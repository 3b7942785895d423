"""``bench placement`` gives a policy only the past; the paper protocol only the workload's distribution.

Online (the default), a decision may depend on the pods placed so far and on nothing after them: two
workloads with the same head and different tails get the same decisions on the head, for every
registered policy. Under the paper protocol the policy is told the target workload before the run, and
the test shows that this *is* visible (a different tail changes FGD's decisions), so the online check
could see a leak. What the paper protocol may tell is the distribution only: reordering the target
list changes no decision.
"""

from __future__ import annotations

import random

import pytest

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from meridian.traces import openb
from regional_scheduler.bench_placement import BenchInput, bench_policy, run_one
from regional_scheduler.framework import Placement, Scheduler
from regional_scheduler.policies.registry import REGISTRY

NODES = openb.load_nodes()[::24]  # 51 GPU nodes of the openb cluster
_LIST = openb.load_pods(openb.openb_dir() / "openb_pod_list_gpuspec25.csv")
_OTHER = openb.load_pods(openb.openb_dir() / "openb_pod_list_multigpu50.csv")
HEAD = 120


def _renamed(pods: list[Pod], tag: str) -> list[Pod]:
    """``pods``, never deleted, renamed so the head and a tail never share a name."""
    return [p.model_copy(update={"name": f"{tag}-{i}", "deletion_time_s": None}) for i, p in enumerate(pods)]


HEAD_PODS = _renamed(_LIST[:HEAD], "head")
TAIL_A = _renamed(_LIST[HEAD:HEAD + 300], "tail")
TAIL_B = _renamed(_OTHER[:300], "tail")  # another list's shapes: another distribution


class RecordingScheduler(Scheduler):
    """The framework's scheduler, remembering the node of every placement in arrival order."""

    def __init__(self, policy, *, seed: int = 0) -> None:
        super().__init__(policy, seed=seed)
        self.decisions: list[int | None] = []

    def place(self, state: ClusterState, pod: Pod) -> Placement | None:
        placement = super().place(state, pod)
        self.decisions.append(None if placement is None else placement.node)
        return placement


def _decisions(policy: str, pods: list[Pod], *, paper: bool) -> list[int | None]:
    made: list[RecordingScheduler] = []

    def factory(name: str, seed: int) -> Scheduler:
        scheduler = RecordingScheduler(bench_policy(name), seed=seed)
        made.append(scheduler)
        return scheduler

    # The timeline protocol places the list in order, so the head arrives first, one pod a second.
    inp = BenchInput("timeline", NODES, [p.model_copy(update={"creation_time_s": float(i)}) for i, p in enumerate(pods)])
    run_one(inp, policy, 7, scheduler_factory=factory, paper=paper)
    return made[0].decisions


@pytest.mark.parametrize("policy", list(REGISTRY))
def test_online_no_decision_depends_on_a_pod_still_to_come(policy: str) -> None:
    with_a = _decisions(policy, HEAD_PODS + TAIL_A, paper=False)
    with_b = _decisions(policy, HEAD_PODS + TAIL_B, paper=False)
    assert len(with_a) == len(with_b) == HEAD + 300
    assert with_a[:HEAD] == with_b[:HEAD]
    assert any(node is not None for node in with_a[:HEAD])


def test_the_paper_protocol_is_visible_to_the_check() -> None:
    """FGD told the target workload decides the head differently when the tail changes: the online
    test above would see a policy that read the future."""
    with_a = _decisions("fgd", HEAD_PODS + TAIL_A, paper=True)
    with_b = _decisions("fgd", HEAD_PODS + TAIL_B, paper=True)
    assert with_a[:HEAD] != with_b[:HEAD]


@pytest.mark.parametrize("policy", ["fgd", "learned"])
def test_the_paper_protocol_tells_the_distribution_only(policy: str) -> None:
    """Decided on the same arrivals, a policy prepared with the target list and one prepared with the
    same list shuffled make the same decisions: only the frequencies of pod shapes reach it."""
    workload = HEAD_PODS + TAIL_A
    shuffled = workload[:]
    random.Random(3).shuffle(shuffled)
    decisions = []
    for target in (workload, shuffled):
        scheduler = RecordingScheduler(bench_policy(policy))  # the budget counted, not enforced
        state = ClusterState.from_nodes(NODES)
        scheduler.prepare(state, target)
        for pod in workload:
            placement = scheduler.place(state, pod)
            if placement is not None:
                state.allocate(pod, placement)
        decisions.append(scheduler.decisions)
    assert decisions[0] == decisions[1]
