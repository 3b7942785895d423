"""The replay-selection experiment: a prepared workload's replays decide whether the correction serves."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from experiments import replay_selection as replay_module
from experiments.replay_selection import ReplaySelectedPolicy, replay_arrivals
from meridian.cluster_state import ClusterState
from meridian.model import GIB, Node, Pod, Resources
from meridian.traces import openb
from regional_scheduler.bench_placement import BenchInput, run_one
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned.checkpoint import load_checkpoint
from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT
from regional_scheduler.learned.features import IDX, N_NODE
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.learned.serving import LearnedScorer, ServingSettings
from regional_scheduler.policies.fgd import FgdPolicy
from regional_scheduler.policies.learned import LearnedPolicy

NODES = openb.load_nodes()[::12]  # 101 nodes
WORKLOAD = openb.load_pods(openb.openb_dir() / "openb_pod_list_default.csv")
ARRIVALS = openb.inflate_pods(WORKLOAD, sum(n.allocatable_resources.gpu for n in NODES) * 1000, seed=7)


def _spreading_net() -> PlacementNet:
    """A correction that undoes FGD's packing: among FGD's near-best nodes it prefers the emptiest."""
    torch.manual_seed(0)  # the (unused) MLP's initial weights, so two such nets are equal
    net = PlacementNet(hidden=8, residual_bound=0.95)
    vec = np.zeros(N_NODE + 1)
    vec[IDX["free_gpu_frac"]] = 3.0
    vec[IDX["idle_gpus_abs"]] = 3.0
    net.set_search_vector(vec)
    return net


def _decide(policy, arrivals: list[Pod]) -> list[int | None]:
    state = ClusterState.from_nodes(NODES)
    scheduler = Scheduler(policy)
    scheduler.prepare(state, WORKLOAD)
    chosen = []
    for pod in arrivals:
        placement = scheduler.place(state, pod)
        chosen.append(None if placement is None else placement.node)
        if placement is not None:
            state.allocate(pod, placement)
    return chosen


def _learned(net: PlacementNet) -> LearnedPolicy:
    return LearnedPolicy(ServingSettings(enforce_budget=False), scorer=LearnedScorer({"gpu": net}))


def _selected(net: PlacementNet, replays: int) -> ReplaySelectedPolicy:
    return ReplaySelectedPolicy(_learned(net), replays)


def test_replay_arrivals_reach_the_free_gpu_capacity_and_follow_their_seed() -> None:
    state = ClusterState.from_nodes(NODES)
    capacity = int(state.gpu_free_milli.sum())
    arrivals = replay_arrivals(WORKLOAD, state, 1)
    requested = np.cumsum([p.requests.gpu_milli_total for p in arrivals])
    assert requested[-1] >= capacity > requested[-2]  # the last draw is the one that reaches it
    assert replay_arrivals(WORKLOAD, state, 1) == arrivals
    assert replay_arrivals(WORKLOAD, state, 2) != arrivals
    assert {p.name for p in arrivals} <= {p.name for p in WORKLOAD}
    assert replay_arrivals([], state, 1) == []


def test_replay_arrivals_count_cpu_on_a_cpu_only_cluster() -> None:
    nodes = [Node(name=f"c{i}", capacity=Resources(milli_cpu=8000, memory_bytes=32 * GIB)) for i in range(5)]
    pods = [Pod(name=f"p{i}", requests=Resources(milli_cpu=1000 * (i + 1), memory_bytes=GIB)) for i in range(3)]
    arrivals = replay_arrivals(pods, ClusterState.from_nodes(nodes), 0)
    requested = np.cumsum([p.requests.milli_cpu for p in arrivals])
    assert requested[-1] >= 40_000 > requested[-2]


def test_a_correction_the_replays_find_worse_is_never_served() -> None:
    served = _selected(_spreading_net(), replays=2)
    chosen = _decide(served, ARRIVALS)
    assert served.replay is not None and served.replay.mean_gain < 0 and served.left_to_fgd
    assert chosen == _decide(FgdPolicy(), ARRIVALS)
    # Without replays the same correction does change decisions: the test can see a broken replay.
    assert _decide(_learned(_spreading_net()), ARRIVALS) != chosen


def test_the_replays_decide_by_their_mean_gain_and_leave_the_state_alone() -> None:
    nets, _ = load_checkpoint(DEFAULT_CHECKPOINT)
    policy = ReplaySelectedPolicy(LearnedPolicy(scorer=LearnedScorer({"gpu": copy.deepcopy(nets["gpu"])})), 2)
    state = ClusterState.from_nodes(NODES)
    state.allocate(ARRIVALS[0], Scheduler(FgdPolicy()).schedule(state, ARRIVALS[0]).placement)
    before = copy.deepcopy(vars(state))
    policy.prepare(state, WORKLOAD)
    assert policy.replay is not None and len(policy.replay.gains) == 2 and policy.replay.resource == "gpu"
    assert policy.left_to_fgd == (policy.replay.mean_gain <= 0)
    for name, value in before.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(getattr(state, name), value, err_msg=name)


def test_replays_are_memoised_on_the_network_the_cluster_and_the_workload(monkeypatch) -> None:
    calls = []
    real = replay_module.replay

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(replay_module, "replay", counting)
    monkeypatch.setattr(replay_module, "_memo", replay_module.OrderedDict())
    for _ in range(2):
        _selected(_spreading_net(), 1).prepare(ClusterState.from_nodes(NODES), WORKLOAD)
    assert len(calls) == 1
    _selected(_spreading_net(), 1).prepare(ClusterState.from_nodes(NODES), WORKLOAD[:-1])
    other = _spreading_net()
    other.set_search_vector(other.search_vector() * 2)
    _selected(other, 1).prepare(ClusterState.from_nodes(NODES), WORKLOAD)
    assert len(calls) == 3


def test_the_bench_reports_when_the_replays_left_the_workload_to_fgd() -> None:
    run = run_one(BenchInput("openb", NODES, WORKLOAD), "learned", 7, paper=True,
                  scheduler_factory=lambda _name, _seed: Scheduler(_selected(_spreading_net(), 2)))
    assert run.final["replays_chose_fgd"] == 1.0
    with pytest.raises(ValueError, match="replays must be >= 1"):
        _selected(_spreading_net(), 0)
