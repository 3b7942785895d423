"""``gate_share``: a workload whose GPU pods are model-constrained at or above the profile's share is
left to FGD entirely (``docs/results-learned-placement.md``)."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

from meridian.cluster_state import ClusterState
from meridian.model import Pod
from meridian.traces import openb
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned.augment import spec_like_pod_list
from regional_scheduler.learned.checkpoint import load_checkpoint, save_checkpoint
from regional_scheduler.learned.explain import explain
from regional_scheduler.learned.features import constrained_share
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.learned.serving import DEFAULT_CHECKPOINT, LearnedScorer, ServingSettings
from regional_scheduler.policies.fgd import FgdPolicy
from regional_scheduler.policies.learned import LearnedPolicy

NODES = openb.load_nodes()[:200]
N_PODS = 500


def _constrained_list(share: float) -> list[Pod]:
    """``cpu050`` (its CPU-only pods come first in the file), constrained like ``gpuspec`` and shuffled."""
    pods = openb.load_pods(openb.openb_dir() / "openb_pod_list_cpu050.csv")
    pods = spec_like_pod_list(pods, openb.load_nodes(), 6_100_000, share)
    random.Random(0).shuffle(pods)
    return pods


def _decide(policy, workload: list[Pod], *, prepare: bool = True) -> list[int | None]:
    scheduler = Scheduler(policy)
    state = ClusterState.from_nodes(NODES)
    if prepare:
        scheduler.prepare(state, workload)
    chosen = []
    for pod in workload[:N_PODS]:
        placement = scheduler.place(state, pod)
        chosen.append(None if placement is None else placement.node)
        if placement is not None:
            state.allocate(pod, placement)
    return chosen


def _learned(gate: float | None) -> LearnedPolicy:
    nets, _ = load_checkpoint(DEFAULT_CHECKPOINT)
    nets = copy.deepcopy(nets)
    nets["gpu"].gate_share = gate
    nets["gpu"].replays = 0  # the gate alone: the replays would leave these workloads to FGD as well
    return LearnedPolicy(ServingSettings(enforce_budget=False), scorer=LearnedScorer(nets))


def test_the_committed_gpu_profile_gates_at_thirty_percent() -> None:
    nets, extra = load_checkpoint(DEFAULT_CHECKPOINT)
    assert nets["gpu"].gate_share == pytest.approx(0.30) and nets["cpu"].gate_share is None
    assert extra["gate_share"] == pytest.approx(0.30)


@pytest.mark.parametrize("prepare", [True, False], ids=["prepared", "live"])
def test_a_workload_above_the_gate_is_placed_exactly_as_fgd_places_it(prepare: bool) -> None:
    workload = _constrained_list(0.40)
    # Live, the share comes from FGD's window, first estimated from the first pod alone: start with a
    # constrained one, so the window is above the gate from the first decision on.
    first = next(i for i, p in enumerate(workload) if p.allowed_gpu_models)
    workload = [workload[first], *workload[:first], *workload[first + 1:]]
    assert constrained_share(workload) >= 0.35
    fgd = _decide(FgdPolicy(), workload, prepare=prepare)
    ungated = _decide(_learned(None), workload, prepare=prepare)
    assert ungated != fgd  # otherwise this test could not see a broken gate
    gated = _learned(0.30)
    assert _decide(gated, workload, prepare=prepare) == fgd
    assert gated.scorer is not None and gated.scorer.gated
    assert gated.scorer.constrained_share == pytest.approx(
        constrained_share(workload) if prepare else constrained_share(workload[:N_PODS]), abs=0.05)


def test_a_workload_below_the_gate_keeps_the_correction() -> None:
    workload = _constrained_list(0.10)
    policy = _learned(0.30)
    assert _decide(policy, workload) == _decide(_learned(None), workload)
    assert policy.scorer is not None and not policy.scorer.gated


def test_gate_share_is_checked_and_kept_in_checkpoints(tmp_path: Path) -> None:
    for bad in (0.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="gate_share"):
            PlacementNet(gate_share=bad)
    save_checkpoint(tmp_path / "g.pt", {"gpu": PlacementNet(gate_share=0.25), "cpu": PlacementNet()})
    nets, _ = load_checkpoint(tmp_path / "g.pt")
    assert nets["gpu"].gate_share == 0.25 and nets["cpu"].gate_share is None


def test_explain_says_the_workload_is_left_to_fgd() -> None:
    workload = _constrained_list(0.40)
    policy = _learned(0.30)
    scheduler = Scheduler(policy)
    state = ClusterState.from_nodes(NODES)
    scheduler.prepare(state, workload)
    assert policy.scorer is not None
    result = explain(policy.scorer, state, workload[0])
    assert result.gate is not None and "gate_share 30%" in result.gate
    assert result.nodes and all(not n.top_features for n in result.nodes)
    assert all(n.score == n.fgd_score for n in result.nodes)


def test_live_the_gate_follows_the_window_of_recent_pods() -> None:
    """Unconstrained pods first: the correction serves; once the window is mostly constrained
    pods, the workload is left to FGD."""
    workload = _constrained_list(0.0)
    constrained = [p for p in _constrained_list(1.0) if p.allowed_gpu_models]
    policy = _learned(0.30)
    scheduler = Scheduler(policy)
    state = ClusterState.from_nodes(NODES)
    assert policy.scorer is not None
    for pod in workload[:300]:
        scheduler.place(state, pod)
    assert not policy.scorer.gated and policy.scorer.constrained_share == 0.0
    for pod in constrained[:2000]:
        scheduler.place(state, pod)
    assert policy.scorer.gated and policy.scorer.constrained_share > 0.9


def test_live_a_full_cluster_still_counts_its_unschedulable_pods_in_the_gate() -> None:
    """On a full cluster many pods fit no node and are never scored. They still arrive, so FGD's window,
    and the gate's share read from it, hold them: before, a saturated ``gpuspec25`` run's live share fell
    to 0.14 against the workload's 0.25, as constrained pods were the ones that stopped fitting."""
    workload = _constrained_list(0.40)[:3000]  # ~2.5× what 200 nodes hold
    policy = _learned(0.30)
    scheduler = Scheduler(policy)
    state = ClusterState.from_nodes(NODES)
    assert policy.scorer is not None
    failed = 0
    for pod in workload:
        placement = scheduler.place(state, pod)
        failed += placement is None
        if placement is not None:
            state.allocate(pod, placement)
    window = policy.scorer.features.fgd.online_window
    assert failed > 1000
    assert window is not None and all(a is b for a, b in zip(window, workload[-2000:], strict=True))
    assert policy.scorer.constrained_share == pytest.approx(constrained_share(workload[-2000:]), abs=0.03)
    assert policy.scorer.gated


def test_live_the_fallback_reads_the_scorers_window_and_counts_each_pod_once() -> None:
    """Every decision over a tiny budget falls back to FGD: the scorer's own FGD (the same window and
    caches), and a pod the scorer already saw is not counted again."""
    nets, _ = load_checkpoint(DEFAULT_CHECKPOINT)
    policy = LearnedPolicy(ServingSettings(budget_ms=1e-6), scorer=LearnedScorer(nets))
    assert policy.scorer is not None and policy._fallback is policy.scorer.features.fgd
    scheduler = Scheduler(policy)
    state = ClusterState.from_nodes(NODES)
    workload = _constrained_list(0.0)[:150]
    for pod in workload:
        placement = scheduler.place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)
    assert policy.fallback_count.get("timeout", 0) > 100
    window = policy.scorer.features.fgd.online_window
    assert window is not None and [p.name for p in window] == [p.name for p in workload]
