"""Replay selection: a prepared workload's replays decide whether the correction serves."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
import torch

from meridian.cluster_state import ClusterState
from meridian.model import GIB, Node, Pod, Resources
from meridian.traces import openb
from regional_scheduler.bench_placement import BenchInput, run_one, summarize
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned import replay as replay_module
from regional_scheduler.learned.checkpoint import load_checkpoint, save_checkpoint
from regional_scheduler.learned.explain import explain
from regional_scheduler.learned.features import IDX, N_NODE
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.learned.replay import replay_arrivals
from regional_scheduler.learned.serving import LearnedPolicy, LearnedScorer, ServingSettings
from regional_scheduler.policies.fgd import FgdPolicy

NODES = openb.load_nodes()[::12]  # 101 nodes
WORKLOAD = openb.load_pods(openb.openb_dir() / "openb_pod_list_default.csv")
ARRIVALS = openb.inflate_pods(WORKLOAD, sum(n.allocatable_resources.gpu for n in NODES) * 1000, seed=7)


def _spreading_net(replays: int) -> PlacementNet:
    """A correction that undoes FGD's packing: among FGD's near-best nodes it prefers the emptiest."""
    torch.manual_seed(0)  # the (unused) MLP's initial weights, so two such nets are equal
    net = PlacementNet(hidden=8, residual_bound=0.95, replays=replays)
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
    served = _learned(_spreading_net(replays=2))
    chosen = _decide(served, ARRIVALS)
    assert served.scorer is not None and served.scorer.replay is not None
    assert served.scorer.replay.mean_gain < 0 and served.scorer.left_to_fgd
    assert chosen == _decide(FgdPolicy(), ARRIVALS)
    # Without replays the same correction does change decisions: the test can see a broken replay.
    assert _decide(_learned(_spreading_net(replays=0)), ARRIVALS) != chosen


def test_the_replays_decide_by_their_mean_gain_and_leave_the_state_alone() -> None:
    nets, _ = load_checkpoint(Path(replay_module.__file__).parent / "checkpoints" / "placement.pt")
    net = copy.deepcopy(nets["gpu"])
    net.replays = 2
    scorer = LearnedScorer({"gpu": net})
    state = ClusterState.from_nodes(NODES)
    state.allocate(ARRIVALS[0], Scheduler(FgdPolicy()).schedule(state, ARRIVALS[0]).placement)
    before = copy.deepcopy(vars(state))
    scorer.prepare(state, WORKLOAD)
    assert scorer.replay is not None and len(scorer.replay.gains) == 2 and scorer.replay.resource == "gpu"
    assert scorer.left_to_fgd == (scorer.replay.mean_gain <= 0)
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
        LearnedScorer({"gpu": _spreading_net(replays=1)}).prepare(ClusterState.from_nodes(NODES), WORKLOAD)
    assert len(calls) == 1
    LearnedScorer({"gpu": _spreading_net(replays=1)}).prepare(ClusterState.from_nodes(NODES), WORKLOAD[:-1])
    other = _spreading_net(replays=1)
    other.set_search_vector(other.search_vector() * 2)
    LearnedScorer({"gpu": other}).prepare(ClusterState.from_nodes(NODES), WORKLOAD)
    assert len(calls) == 3


def test_replays_round_trip_through_a_checkpoint_and_are_validated(tmp_path: Path) -> None:
    path = tmp_path / "r.pt"
    save_checkpoint(path, {"gpu": _spreading_net(replays=3), "cpu": PlacementNet()})
    nets, _ = load_checkpoint(path)
    assert nets["gpu"].replays == 3 and nets["cpu"].replays == 0
    with pytest.raises(ValueError, match="replays must be >= 0"):
        PlacementNet(replays=-1)


def test_explain_and_the_bench_say_when_the_replays_left_the_workload_to_fgd() -> None:
    policy = _learned(_spreading_net(replays=2))
    state = ClusterState.from_nodes(NODES)
    Scheduler(policy).prepare(state, WORKLOAD)
    assert policy.scorer is not None
    result = explain(policy.scorer, state, ARRIVALS[0])
    assert result.gate is not None and "replays" in result.gate and "FGD places every pod" in result.gate
    assert all(n.score == n.fgd_score for n in result.nodes)

    run = run_one(BenchInput("openb", NODES, WORKLOAD), "learned", 7,
                  scheduler_factory=lambda _name, _seed: Scheduler(_learned(_spreading_net(replays=2))))
    assert summarize([run], 1)["replays_chose_fgd_seeds"] == 1
