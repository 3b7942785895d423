"""Serving: checkpoint round-trip and refusal, fallback to FGD (counted and logged), shadow mode."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from meridian.cluster_state import ClusterState
from meridian.model import GIB, Node, Pod, Resources
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned import checkpoint as checkpoint_module
from regional_scheduler.learned.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
)
from regional_scheduler.learned.features import FEATURE_LAYOUT, N_NODE, N_POD, FeatureBuilder
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet
from regional_scheduler.learned.serving import LearnedScorer, ServingSettings
from regional_scheduler.policies.fgd import FgdPolicy
from regional_scheduler.policies.learned import FALLBACKS, LearnedPolicy, ShadowPolicy
from tests.placement_helpers import decide_each


def _fallbacks(reason: str) -> float:
    return FALLBACKS.labels(reason=reason)._value.get()


def _features(cluster: list[Node], workload: list[Pod]) -> tuple[np.ndarray, np.ndarray]:
    state = ClusterState.from_nodes(cluster)
    builder = FeatureBuilder()
    builder.prepare(state, workload)
    nodes = np.arange(state.n_nodes)
    x, _ = builder.node_features(state, workload[3], nodes)  # the CPU pod fits everywhere
    return x, builder.pod_features(state, workload[3], nodes.size)


def test_checkpoint_round_trip_gives_the_same_scores(tmp_path: Path, untrained_nets, small_gpu_cluster,
                                                     small_workload) -> None:
    path = tmp_path / "p.pt"
    save_checkpoint(path, untrained_nets, extra={"note": "test"})
    loaded, extra = load_checkpoint(path)
    assert extra == {"note": "test"} and set(loaded) == {"gpu", "cpu"}
    x, p = _features(small_gpu_cluster, small_workload)
    for name, net in untrained_nets.items():
        np.testing.assert_allclose(loaded[name].predict(x, p), net.predict(x, p), rtol=1e-6)


def test_numpy_hot_path_equals_torch(untrained_nets, small_gpu_cluster, small_workload) -> None:
    net = untrained_nets["gpu"]
    with torch.no_grad():
        net.heuristic_head.weight.normal_()  # a non-zero head, so every term is exercised
        net.feature_mean.normal_()
    x, p = _features(small_gpu_cluster, small_workload)
    np.testing.assert_allclose(NumpyPlacementNet(net).predict(x, p), net.predict(x, p), rtol=1e-4, atol=1e-5)


def test_network_is_permutation_equivariant(untrained_nets) -> None:
    # Shuffling the nodes shuffles the logits the same way (the pooled context is order-free).
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, N_NODE)).astype(np.float32)
    p = rng.normal(size=N_POD).astype(np.float32)
    perm = rng.permutation(7)
    net = untrained_nets["gpu"]
    np.testing.assert_allclose(net.predict(x[perm], p), net.predict(x, p)[perm], rtol=1e-5, atol=1e-6)


def _tampered(path: Path, **changes: object) -> Path:
    payload = torch.load(path, weights_only=True)
    payload.update(changes)
    torch.save(payload, path)
    return path


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        pytest.param(lambda p: _tampered(p, version=99), "version 99", id="other-version"),
        pytest.param(lambda p: _tampered(p, feature_layout={**FEATURE_LAYOUT, "node": ["a", "b"]}),
                     "another feature layout", id="other-feature-layout"),
        pytest.param(lambda p: _tampered(p, feature_layout={**FEATURE_LAYOUT, "version": 0}),
                     "another feature layout", id="old-feature-version"),
        pytest.param(lambda p: (p.write_bytes(b"not a checkpoint"), p)[1], "cannot read", id="garbage-file"),
        pytest.param(lambda p: (p.unlink(), p)[1], "no checkpoint", id="missing-file"),
    ],
)
def test_mismatched_checkpoint_is_refused(tmp_path: Path, untrained_nets, tamper, message: str) -> None:
    path = tmp_path / "p.pt"
    save_checkpoint(path, untrained_nets)
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tamper(path))


def test_pickled_objects_are_not_loaded(tmp_path: Path) -> None:
    # weights_only=True refuses arbitrary objects: a checkpoint cannot run code on load.
    path = tmp_path / "evil.pt"
    torch.save({"version": checkpoint_module.CHECKPOINT_VERSION, "profiles": {}, "x": ServingSettings()}, path)
    with pytest.raises(CheckpointError, match="cannot read"):
        load_checkpoint(path)


class _Broken(LearnedScorer):
    def score(self, state, pod, nodes):
        raise RuntimeError("model exploded")


class _NaN(LearnedScorer):
    def score(self, state, pod, nodes):
        result = super().score(state, pod, nodes)
        return type(result)(np.full(nodes.size, np.nan), result.devices)


class _OneInf(LearnedScorer):
    """One non-finite score among finite ones (the last node's, so the first finite ones would win)."""

    def score(self, state, pod, nodes):
        result = super().score(state, pod, nodes)
        scores = np.array(result.scores, dtype=float)
        scores[-1] = np.inf
        return type(result)(scores, result.devices)


@pytest.mark.parametrize(
    ("make", "reason"),
    [
        pytest.param(lambda nets, tmp: LearnedPolicy(ServingSettings(checkpoint=tmp / "missing.pt")),
                     "missing_checkpoint", id="missing-checkpoint"),
        pytest.param(lambda nets, tmp: LearnedPolicy(ServingSettings(checkpoint=(tmp / "bad.pt", (tmp / "bad.pt")
                                                                                 .write_bytes(b"\x00junk"))[0])),
                     "bad_checkpoint", id="broken-checkpoint"),
        pytest.param(lambda nets, tmp: LearnedPolicy(scorer=_Broken(nets)), "model_error", id="model-raises"),
        pytest.param(lambda nets, tmp: LearnedPolicy(scorer=_NaN(nets)), "model_error", id="model-returns-nan"),
        pytest.param(lambda nets, tmp: LearnedPolicy(scorer=_OneInf(nets)), "model_error", id="one-score-inf"),
        pytest.param(lambda nets, tmp: LearnedPolicy(ServingSettings(budget_ms=1e-6), scorer=LearnedScorer(nets)),
                     "timeout", id="over-budget"),
    ],
)
def test_fallback_to_fgd_is_counted_and_logged(make, reason: str, tmp_path: Path, untrained_nets, small_gpu_cluster,
                                               small_workload, caplog: pytest.LogCaptureFixture) -> None:
    before = _fallbacks(reason)
    with caplog.at_level(logging.DEBUG, logger="regional_scheduler.learned.serving"):
        policy = make(untrained_nets, tmp_path)
        decisions = decide_each(policy, small_gpu_cluster, small_workload)
    # Every decision is FGD's, and every one is counted under the reason.
    assert decisions == decide_each(FgdPolicy(), small_gpu_cluster, small_workload)
    assert _fallbacks(reason) - before == len(small_workload)
    assert policy.fallback_count == {reason: len(small_workload)}
    assert any("fell back to fgd" in r.message and reason in r.message for r in caplog.records)


def test_shadow_mode_records_both_choices(untrained_nets, small_gpu_cluster, small_workload) -> None:
    learned = LearnedPolicy(scorer=LearnedScorer(untrained_nets))
    shadow = ShadowPolicy(FgdPolicy(), learned)
    decisions = decide_each(shadow, small_gpu_cluster, small_workload)
    # The live decisions are the active policy's, untouched by the shadow.
    assert decisions == decide_each(FgdPolicy(), small_gpu_cluster, small_workload)
    assert len(shadow.records) == shadow.n_decisions == len(small_workload)
    assert [r.active_node for r in shadow.records] == decisions
    assert shadow.agreement == sum(r.agree for r in shadow.records) / len(small_workload)


def test_shadow_mode_shows_an_unschedulable_pod_to_both_live_policies(untrained_nets, small_gpu_cluster) -> None:
    """Live, both FGD windows (the active policy's and the learned one's) must see a pod that fits
    no node, or their target workloads would drift apart from the arrivals."""
    active = FgdPolicy()
    learned = LearnedPolicy(scorer=LearnedScorer(untrained_nets))
    scheduler = Scheduler(ShadowPolicy(active, learned))
    state = ClusterState.from_nodes(small_gpu_cluster)
    fits = Pod(name="fits", requests=Resources(milli_cpu=1000, memory_bytes=GIB, gpu=1))
    too_big = Pod(name="too-big", requests=Resources(milli_cpu=1000, memory_bytes=GIB, gpu=16))
    assert scheduler.schedule(state, fits).placement is not None
    assert scheduler.schedule(state, too_big).placement is None
    assert learned.scorer is not None
    for fgd in (active, learned.scorer.features.fgd):
        assert [p.name for p in fgd.online_window] == ["fits", "too-big"]


def test_an_unprepared_scheduler_serves_the_profile_of_its_cluster(monkeypatch) -> None:
    """The live dispatch worker never calls ``prepare``: on a CPU-only cluster it must still use the
    committed checkpoint's ``cpu`` profile, and decide as a prepared scheduler does."""
    from meridian.simulator import seed_cluster, seed_pods
    from regional_scheduler.policies.registry import get_policy

    # A decision slowed past 5 ms by a loaded machine would be FGD's: count the budget, don't enforce it.
    monkeypatch.setenv("MERIDIAN_LEARNED_ENFORCE_BUDGET", "0")

    def nodes_chosen(prepare: bool) -> tuple[str, list[int | None]]:
        policy = get_policy("learned")
        state = ClusterState.from_nodes(seed_cluster())
        scheduler = Scheduler(policy)
        pods = seed_pods(3)
        if prepare:
            scheduler.prepare(state, pods)
        chosen: list[int | None] = []
        for pod in pods:
            placement = scheduler.place(state, pod)
            chosen.append(None if placement is None else placement.node)
            if placement is not None:
                state.allocate(pod, placement)
        return policy.scorer.profile, chosen

    live_profile, live = nodes_chosen(prepare=False)
    prepared_profile, prepared = nodes_chosen(prepare=True)
    assert live_profile == prepared_profile == "cpu"
    assert live == prepared


def test_an_unprepared_feature_builder_reads_gpu_model_scarcity_from_recent_pods(small_gpu_cluster) -> None:
    """Live, the scarcity column (``model_pressure``) comes from FGD's window of recent pods, as it
    comes from the whole workload when prepared: P100 pods make the P100 node scarce."""
    from regional_scheduler.learned.features import IDX, model_pressure

    state = ClusterState.from_nodes(small_gpu_cluster)
    builder = FeatureBuilder()
    p100 = Pod(name="p100", requests=Resources(milli_cpu=1000, memory_bytes=GIB, gpu=1), allowed_gpu_models=("P100",))
    nodes = np.arange(state.n_nodes)
    for _ in range(3):
        builder.fgd.score(state, p100, nodes)  # the scheduler scores (and so observes) each pod first
        features, _ = builder.node_features(state, p100, nodes)
    column = features[:, IDX["model_pressure"]]
    on_p100 = np.array([n.gpu_model == "P100" for n in small_gpu_cluster])
    assert np.all(column[on_p100] > 0) and np.all(column[~on_p100] == 0)
    expected = model_pressure(state, [p100] * 3)
    assert column[on_p100][0] == pytest.approx(expected[state.gpu_models.index("P100")])


def test_shadow_records_the_counterfactual_fragmentation_and_publishes_windows(
        untrained_nets, small_gpu_cluster, small_workload, redis_bus) -> None:
    from meridian.lifecycle.records import EvaluationRecord, evaluations_stream
    from regional_scheduler.learned.shadow_publisher import evaluation_publisher

    publisher = evaluation_publisher(redis_bus, candidate="placement-v2", active="placement-v1",
                                          window_decisions=2)
    shadow = ShadowPolicy(FgdPolicy(), LearnedPolicy(scorer=LearnedScorer(untrained_nets)), sink=publisher)
    decide_each(shadow, small_gpu_cluster, small_workload)
    records = list(shadow.records)
    # FGD serves and ranks by the same fragmentation increase: its choice is never worse than the learned one's
    assert all(r.active_fragmentation <= r.learned_fragmentation + 1e-9 for r in records)
    assert all(r.served == "active" for r in records)
    windows = [EvaluationRecord.model_validate_json(e.payload)
               for e in redis_bus.read_range(evaluations_stream("placement"))]
    assert len(windows) == len(records) // 2 == publisher.published
    first = windows[0]
    assert (first.candidate, first.active, first.decisions) == ("placement-v2", "placement-v1", 2)
    assert first.active_outcomes["gpu_fragmentation"] == pytest.approx(
        records[0].active_fragmentation + records[1].active_fragmentation)
    assert first.agreed == (records[0].agree + records[1].agree) / 2


def test_canary_serves_the_candidate_on_its_share_of_pods(untrained_nets, small_gpu_cluster, small_workload) -> None:
    from meridian.model_registry.evaluation import CanarySplit

    learned = LearnedPolicy(scorer=LearnedScorer(untrained_nets))
    everything = ShadowPolicy(FgdPolicy(), learned, canary=CanarySplit(1.0))
    served = decide_each(everything, small_gpu_cluster, small_workload)
    assert served == [r.learned_node for r in everything.records]
    assert all(r.served == "candidate" for r in everything.records)
    nothing = ShadowPolicy(FgdPolicy(), LearnedPolicy(scorer=LearnedScorer(untrained_nets)), canary=CanarySplit(0.0))
    assert decide_each(nothing, small_gpu_cluster, small_workload) == decide_each(FgdPolicy(), small_gpu_cluster,
                                                                                  small_workload)


def test_shadow_reads_fgds_own_fragmentation_and_measures_it_for_other_active_policies(
        untrained_nets, small_gpu_cluster, small_workload) -> None:
    from regional_scheduler.policies.registry import get_policy

    beside_fgd = ShadowPolicy(FgdPolicy(), LearnedPolicy(scorer=LearnedScorer(untrained_nets)))
    assert beside_fgd._fragmentation is None  # FGD's score already carries the fragmentation increase
    beside_best_fit = ShadowPolicy(get_policy("best-fit"), LearnedPolicy(scorer=LearnedScorer(untrained_nets)))
    assert beside_best_fit._fragmentation is not None
    decide_each(beside_fgd, small_gpu_cluster, small_workload)
    decide_each(beside_best_fit, small_gpu_cluster, small_workload)
    # the learned arm decides alike beside either active policy on the first pod (same empty cluster), and its
    # fragmentation increase is measured the same way whichever policy is active
    first_fgd, first_bf = beside_fgd.records[0], beside_best_fit.records[0]
    assert first_fgd.learned_node == first_bf.learned_node
    assert first_fgd.learned_fragmentation == pytest.approx(first_bf.learned_fragmentation)
