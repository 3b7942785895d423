"""The residual policy over FGD, the budget counted instead of enforced, and the fast linear path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meridian.cluster_state import ClusterState
from meridian.model import Node, Pod
from meridian.traces import openb
from regional_scheduler.bench_placement import BenchInput, run_one
from regional_scheduler.filters import run_filters
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from regional_scheduler.learned.features import IDX, N_NODE, FeatureBuilder
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet
from regional_scheduler.learned.policy import (
    CONSTRAINED,
    CPU_ONLY,
    PlacementNet,
    residual_logits,
)
from regional_scheduler.learned.serving import LearnedScorer, ServingSettings
from regional_scheduler.policies.fgd import FgdPolicy
from regional_scheduler.policies.learned import LearnedPolicy
from tests.placement_helpers import decide_each


@pytest.fixture(scope="module")
def openb_slice(make_openb_slice) -> tuple[list[Node], list[Pod], list[Pod]]:
    """Every 12th openb node (101 nodes) and the default list inflated to their capacity."""
    return make_openb_slice(12, "default", seed=7, count=900)


def _linear_net(weights: dict[str, float], bound: float = 0.45) -> PlacementNet:
    torch.manual_seed(0)
    net = PlacementNet(hidden=8, residual_bound=bound)
    vec = np.zeros(N_NODE + 1)
    for name, w in weights.items():
        vec[IDX[name]] = w
    net.set_search_vector(vec)  # mlp_scale 0: a linear correction
    return net


def _random_net(seed: int, mlp_scale: float, **gates: bool) -> PlacementNet:
    torch.manual_seed(seed)
    net = PlacementNet(hidden=8, **gates)
    vec = np.random.default_rng(seed).normal(size=N_NODE + 1)
    vec[-1] = mlp_scale
    net.set_search_vector(vec)
    return net


def _first_gpu_pod(openb_slice) -> tuple[FeatureBuilder, ClusterState, Pod, np.ndarray]:
    """The feature builder on the empty slice, its first GPU pod and that pod's feasible nodes."""
    nodes, workload, arrivals = openb_slice
    state = ClusterState.from_nodes(nodes)
    builder = FeatureBuilder()
    builder.prepare(state, workload)
    pod = next(p for p in arrivals if p.requests.gpu_milli)
    return builder, state, pod, np.flatnonzero(run_filters(state, pod)[0])


def test_zero_correction_is_fgd(openb_slice) -> None:
    nodes, workload, arrivals = openb_slice
    torch.manual_seed(1)
    net = PlacementNet(hidden=8)
    with torch.no_grad():
        net.heuristic_head.weight.normal_()  # whatever the network was, zeroing the correction gives FGD
    net.zero_correction()
    learned = LearnedPolicy(ServingSettings(enforce_budget=False), scorer=LearnedScorer({"gpu": net}))
    assert decide_each(learned, nodes, workload, arrivals) == decide_each(FgdPolicy(), nodes, workload, arrivals)


@pytest.mark.parametrize("bound", [0.45, 0.95])
def test_a_correction_changes_only_the_order_of_fgds_best(openb_slice, bound: float) -> None:
    # 0.45 (v3, v3c): only FGD's exact ties; 0.95 (v3e): also FGD's next integer score bin, never further.
    nodes, workload, arrivals = openb_slice
    net = _linear_net({"best_fit_leftover": -1.0, "free_gpu_frac": 0.3}, bound=bound)
    scorer = LearnedScorer({"gpu": net})
    fgd = FgdPolicy()
    state = ClusterState.from_nodes(nodes)
    scorer.prepare(state, workload)
    fgd.prepare(state, workload)
    moved = 0
    for pod in arrivals:
        mask, _ = run_filters(state, pod)
        cand = np.flatnonzero(mask)
        if cand.size == 0:
            continue
        base = fgd.score(state, pod, cand).scores
        served = scorer.score(state, pod, cand).scores
        pick = int(np.argmax(served))
        assert base[pick] >= base.max() - (0 if bound < 0.5 else 1)
        moved += pick != int(np.argmax(base))
        state.allocate(pod, state.choose_devices(int(cand[pick]), pod))
    assert moved > 0, "the correction never re-ranked a tie: the test would not catch a no-op"


def test_only_a_bound_above_half_lets_the_next_score_bin_win() -> None:
    base = np.array([7.0, 7.0, 6.0, 5.0])
    g = np.array([-9.0, -9.0, 9.0, 9.0])  # FGD's tied best nodes strongly disliked, the others liked
    assert int(np.argmax(residual_logits(base, 0.45, lambda idx: g[idx]))) == 0  # ties only: FGD's first
    assert int(np.argmax(residual_logits(base, 0.95, lambda idx: g[idx]))) == 2  # next bin, never two bins down
    weak = np.array([-0.1, -0.1, 0.1, 9.0])  # a weak preference does not cross a bin
    assert int(np.argmax(residual_logits(base, 0.95, lambda idx: weak[idx]))) == 0


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.lists(st.integers(0, 100), min_size=1, max_size=40), seed=st.integers(0, 2**16),
       bound=st.floats(0.05, 1.5))
def test_residual_logits_bound(base: list[int], seed: int, bound: float) -> None:
    b = np.asarray(base, dtype=np.float64)
    g = np.random.default_rng(seed).normal(scale=5.0, size=b.size)
    out = residual_logits(b, bound, lambda idx: g[idx])
    assert np.all(np.abs(out - b) <= bound + 1e-12)  # never more than the bound away from FGD
    winner = int(np.argmax(out))
    assert b[winner] > b.max() - 2 * bound  # only a near-best node can win
    assert np.array_equal(residual_logits(b, bound, lambda idx: np.zeros(idx.size)).argmax(), b.argmax())


def test_linear_fast_path_equals_torch_and_reads_only_its_columns(openb_slice) -> None:
    net = _linear_net({"best_fit_leftover": -0.7, "fgd_delta_gpus": 0.2, "model_pressure_free_pod": -0.4})
    with torch.no_grad():
        net.feature_mean.normal_()
        net.feature_std.uniform_(0.5, 2.0)
    fast = NumpyPlacementNet(net)
    assert fast.linear and set(np.flatnonzero(fast.columns)) == {IDX["best_fit_leftover"], IDX["fgd_delta_gpus"],
                                                                  IDX["model_pressure_free_pod"]}
    builder, state, pod, cand = _first_gpu_pod(openb_slice)
    full, _ = builder.node_features(state, pod, cand)
    part, _ = builder.node_features(state, pod, cand, fast.columns)
    np.testing.assert_array_equal(part[:, fast.columns], full[:, fast.columns])
    p = builder.pod_features(state, pod, cand.size)
    np.testing.assert_allclose(fast.predict(part, p), net.predict(full, p), rtol=1e-4, atol=1e-5)


def test_budget_counted_not_enforced(untrained_nets, small_gpu_cluster, small_workload) -> None:
    generous = LearnedPolicy(ServingSettings(budget_ms=60_000), scorer=LearnedScorer(untrained_nets))
    counted = LearnedPolicy(ServingSettings(budget_ms=1e-6, enforce_budget=False),
                            scorer=LearnedScorer(untrained_nets))
    enforced = LearnedPolicy(ServingSettings(budget_ms=1e-6), scorer=LearnedScorer(untrained_nets))
    model = decide_each(generous, small_gpu_cluster, small_workload, small_workload)
    assert decide_each(counted, small_gpu_cluster, small_workload, small_workload) == model  # the model decided
    assert counted.over_budget == len(small_workload) and counted.fallback_count == {}
    decide_each(enforced, small_gpu_cluster, small_workload, small_workload)
    assert enforced.over_budget == len(small_workload)
    assert enforced.fallback_count == {"timeout": len(small_workload)}


def test_enforce_budget_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ServingSettings.from_env().enforce_budget is True
    monkeypatch.setenv("MERIDIAN_LEARNED_ENFORCE_BUDGET", "0")
    assert ServingSettings.from_env().enforce_budget is False


def test_bench_reports_over_budget_decisions_instead_of_falling_back(tmp_path: Path, untrained_nets,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.pt"
    save_checkpoint(path, untrained_nets)
    monkeypatch.setenv("MERIDIAN_LEARNED_CHECKPOINT", str(path))
    monkeypatch.setenv("MERIDIAN_LEARNED_BUDGET_MS", "0.000001")  # every decision is over budget
    from meridian.simulator import seed_cluster

    result = run_one(BenchInput("seed-50x200", seed_cluster(), []), "learned", 0)
    assert result.final["over_budget_decisions"] == result.n_arrived - result.n_failed > 0
    assert result.final["fallback_decisions"] == 0


def test_version_1_checkpoint_is_refused_with_the_reason(tmp_path: Path, untrained_nets) -> None:
    path = tmp_path / "v1.pt"
    save_checkpoint(path, untrained_nets)
    payload = torch.load(path, weights_only=True)
    payload["version"] = 1
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"version 1.*reads version 2.*residual policy over FGD"):
        load_checkpoint(path)


def test_gate_unused_keeps_fgds_order_between_empty_nodes(openb_slice) -> None:
    nodes, workload, arrivals = openb_slice
    # A correction that strongly prefers small nodes: ungated it opens nodes by size, gated it may
    # not choose between empty nodes at all, so on an empty cluster every pod goes where FGD puts it.
    net = _linear_net({"gpu_count_abs": -3.0, "free_cpu_abs": -1.0})
    state = ClusterState.from_nodes(nodes)
    fgd = FgdPolicy()
    fgd.prepare(state, workload)
    scorers = {}
    for gate in (False, True):
        gated = _linear_net({"gpu_count_abs": -3.0, "free_cpu_abs": -1.0})
        gated.gate_unused = gate
        scorers[gate] = LearnedScorer({"gpu": gated})
        scorers[gate].prepare(state, workload)
    differs = 0
    for pod in arrivals[:60]:
        cand = np.flatnonzero(run_filters(state, pod)[0])
        pick = int(np.argmax(fgd.score(state, pod, cand).scores))
        assert int(np.argmax(scorers[True].score(state, pod, cand).scores)) == pick
        differs += int(np.argmax(scorers[False].score(state, pod, cand).scores)) != pick
    assert differs > 0, "the ungated correction should have re-ranked the empty nodes"
    assert net.gate_unused is False


@pytest.mark.parametrize("mlp_scale", [pytest.param(0.0, id="linear"), pytest.param(1.0, id="with-mlp")])
def test_gated_numpy_equals_torch(mlp_scale: float, openb_slice) -> None:
    nodes, workload, arrivals = openb_slice
    net = _random_net(3, mlp_scale, gate_unused=True)
    state = ClusterState.from_nodes(nodes)
    builder = FeatureBuilder()
    builder.prepare(state, workload)
    fgd = FgdPolicy()
    fgd.prepare(state, workload)
    for pod in arrivals[:40]:  # some nodes used, most still empty
        placement = Scheduler(fgd).place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)
    pod = arrivals[40]
    cand = np.flatnonzero(run_filters(state, pod)[0])
    x, _ = builder.node_features(state, pod, cand)
    p = builder.pod_features(state, pod, cand.size)
    assert 0 < x[:, IDX["node_unused"]].sum() < cand.size
    np.testing.assert_allclose(NumpyPlacementNet(net).predict(x, p), net.predict(x, p), rtol=1e-4, atol=1e-4)


def _gated_walk(nodes: list[Node], workload: list[Pod], arrivals: list[Pod], weights: dict[str, float],
                gate: str, tmp_path: Path):
    """Place ``arrivals`` with the gated scorer (``gate`` set on a linear net, through a checkpoint round
    trip); yield, per placed pod, its features and the FGD, gated and ungated picks."""
    scorers = {}
    for on in (False, True):
        net = _linear_net(weights)
        net.gate_unused = True
        setattr(net, gate, on)
        path = tmp_path / f"{gate}-{on}.pt"
        save_checkpoint(path, {"gpu": net})
        loaded, _ = load_checkpoint(path)  # the flag survives the round trip
        assert getattr(loaded["gpu"], gate) is on
        scorers[on] = LearnedScorer(loaded)
    builder, fgd, state = FeatureBuilder(), FgdPolicy(), ClusterState.from_nodes(nodes)
    for s in (*scorers.values(), fgd, builder):
        s.prepare(state, workload)
    for pod in arrivals:
        cand = np.flatnonzero(run_filters(state, pod)[0])
        if cand.size == 0:
            continue
        picks = [int(np.argmax(p.score(state, pod, cand).scores)) for p in (fgd, scorers[True], scorers[False])]
        yield (builder.pod_features(state, pod, cand.size), *picks)
        state.allocate(pod, state.choose_devices(int(cand[picks[1]]), pod))


def test_gate_constrained_leaves_model_constrained_pods_to_fgd(openb_slice, tmp_path: Path) -> None:
    from regional_scheduler.learned.augment import augmented_pod_list

    nodes, workload, _ = openb_slice
    constrained_list, share = augmented_pod_list(workload, nodes, 11, p_augment=1.0)
    assert share > 0
    arrivals = openb.inflate_pods(constrained_list, sum(n.allocatable_resources.gpu for n in nodes) * 1000,
                                  seed=7)[:500]
    weights = {"best_fit_leftover": -1.0, "free_gpu_frac": 0.3, "model_pressure": -0.5}
    counts = {"constrained": 0, "ungated_moved": 0, "free_moved": 0}
    for p, fgd_pick, gated_pick, ungated_pick in _gated_walk(nodes, constrained_list, arrivals, weights,
                                                              "gate_constrained", tmp_path):
        if p[CONSTRAINED] > 0:
            counts["constrained"] += 1
            assert gated_pick == fgd_pick
            counts["ungated_moved"] += ungated_pick != fgd_pick
        else:
            assert gated_pick == ungated_pick  # the gate touches constrained pods only
            counts["free_moved"] += gated_pick != fgd_pick
    assert counts["constrained"] > 20
    assert counts["ungated_moved"] > 0, "without the gate the correction should move some constrained pods"
    assert counts["free_moved"] > 0, "the correction should still act on unconstrained pods"


@pytest.mark.parametrize(("gate", "column", "gated", "free"), [
    pytest.param("gate_constrained", CONSTRAINED, 1.0, 0.0, id="model-constrained-pod"),
    pytest.param("gate_gpu_pods", CPU_ONLY, 0.0, 1.0, id="gpu-pod"),
])
def test_pod_gates_numpy_equals_torch(openb_slice, gate: str, column: int, gated: float, free: float) -> None:
    net = _random_net(4, 1.0, gate_unused=True, **{gate: True})  # with the MLP
    builder, state, pod, cand = _first_gpu_pod(openb_slice)
    x, _ = builder.node_features(state, pod, cand)
    p = builder.pod_features(state, pod, cand.size)
    for flag in (gated, free):
        p[column] = flag
        np.testing.assert_allclose(NumpyPlacementNet(net).predict(x, p), net.predict(x, p), rtol=1e-4, atol=1e-4)
    assert np.any(net.predict(x, p))  # a pod the gate lets through: corrected
    p[column] = gated
    assert not np.any(net.predict(x, p)) and not np.any(NumpyPlacementNet(net).predict(x, p))  # g ≡ 0


def test_gate_gpu_pods_leaves_every_gpu_pod_to_fgd(openb_slice, tmp_path: Path) -> None:
    nodes, workload, arrivals = openb_slice
    weights = {"best_fit_leftover": -1.0, "free_gpu_frac": 0.3, "free_cpu_frac": 0.5}
    counts = {"gpu": 0, "ungated_moved": 0, "cpu": 0, "cpu_moved": 0}
    for p, fgd_pick, gated_pick, ungated_pick in _gated_walk(nodes, workload, arrivals[:600], weights,
                                                              "gate_gpu_pods", tmp_path):
        if p[CPU_ONLY] == 0:
            counts["gpu"] += 1
            assert gated_pick == fgd_pick
            counts["ungated_moved"] += ungated_pick != fgd_pick
        else:
            counts["cpu"] += 1
            assert gated_pick == ungated_pick  # CPU-only pods keep the correction
            counts["cpu_moved"] += gated_pick != fgd_pick
    assert counts["gpu"] > 100 and counts["cpu"] > 20
    assert counts["ungated_moved"] > 0, "without the gate the correction should move some GPU pods"
    assert counts["cpu_moved"] > 0, "the correction should still move some CPU-only pods"


def _builder_beside_fgd(openb_slice) -> tuple[ClusterState, FeatureBuilder, Scheduler, list[Pod]]:
    """The empty slice, a prepared feature builder, and an FGD scheduler to place the arrivals."""
    nodes, workload, arrivals = openb_slice
    state = ClusterState.from_nodes(nodes)
    builder = FeatureBuilder()
    builder.prepare(state, workload)
    scheduler = Scheduler(FgdPolicy(), seed=0)
    scheduler.prepare(state, workload)
    return state, builder, scheduler, arrivals


def test_fgds_handed_over_deltas_give_the_features_fgd_would_look_up(openb_slice) -> None:
    """Serving hands FGD's deltas of the candidates to the feature builder instead of looking them up
    again: the features must be the same, through a run in which every node changes."""
    state, builder, scheduler, arrivals = _builder_beside_fgd(openb_slice)
    compared = 0
    for i, pod in enumerate(arrivals):
        candidates = np.flatnonzero(run_filters(state, pod)[0])
        if i % 3 == 0 and candidates.size > 1:
            base, delta = builder.fgd.score_with_delta(state, pod, candidates)
            half = candidates[::2]
            handed, devices = builder.node_features(state, pod, half, fgd_delta=(delta[::2], base.devices[::2]))
            looked_up, looked_up_devices = builder.node_features(state, pod, half)
            np.testing.assert_array_equal(handed, looked_up, err_msg=f"pod {i}")
            np.testing.assert_array_equal(devices, looked_up_devices)
            compared += 1
        placement = scheduler.place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)
    assert compared > 200


def test_one_node_refresh_gives_the_vectorised_refresh_bits(openb_slice) -> None:
    """A decision refreshes the cached features of the one node the last placement changed in Python
    floats (``_fill_one``); every node, at several points of a run, must get the same bits as the
    vectorised refresh."""
    from regional_scheduler.learned.features import _NodeCache

    state, builder, scheduler, arrivals = _builder_beside_fgd(openb_slice)
    every = np.arange(state.n_nodes)
    checked, unused_shares = 0, []
    for i, pod in enumerate(arrivals):
        placement = scheduler.place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)
        if i % 150 == 0 or i == len(arrivals) - 1:
            vectorised, one_by_one = _NodeCache(state), _NodeCache(state)
            builder._fill(state, vectorised, every)
            for node in every:
                builder._fill_one(state, one_by_one, int(node))
            for name in ("static", "free_cpu", "free_mem", "gpu_free_total", "idle"):
                assert getattr(vectorised, name).tobytes() == getattr(one_by_one, name).tobytes(), (i, name)
            checked += 1
            unused_shares.append(float(vectorised.static[:, IDX["node_unused"]].mean()))
    assert checked >= 6
    assert any(0 < share < 1 for share in unused_shares)  # used and unused nodes in one check


def test_unused_nodes_features_skipped_scores_unchanged(openb_slice) -> None:
    """With ``gate_unused`` a linear correction gives every unused node one constant, so serving never
    builds their features; the scores must be those of the path that builds them all."""
    nodes, workload, arrivals = openb_slice
    net = _linear_net({"gpu_count_abs": -3.0, "free_cpu_abs": -1.0, "fgd_delta_gpus": 2.0, "node_unused": 0.7},
                      bound=0.95)
    net.gate_unused = True
    state = ClusterState.from_nodes(nodes)
    scorer = LearnedScorer({"gpu": net})
    scorer.prepare(state, workload)
    fast = scorer.fast["gpu"]
    mixed = 0
    for pod in arrivals[:400]:
        cand = np.flatnonzero(run_filters(state, pod)[0])
        if cand.size == 0:
            continue
        served = scorer.score(state, pod, cand)
        base, delta = scorer.features.fgd.score_with_delta(state, pod, cand)
        everything = fast.residual_columns(
            base.scores, lambda idx, cols, pod=pod, cand=cand, delta=delta, devices=base.devices:
            scorer.features.node_features(state, pod, cand[idx], cols, fgd_delta=(delta[idx], devices[idx]))[0],
            scorer.features.pod_features(state, pod, cand.size))
        # Equal up to float32 rounding: a matrix product over fewer rows may sum in another order.
        np.testing.assert_allclose(served.scores, everything, rtol=0, atol=1e-6)
        unused = scorer.features.unused(state, cand)
        mixed += bool(unused.any() and not unused.all())
        pick = int(np.argmax(served.scores))
        state.allocate(pod, state.choose_devices(int(cand[pick]), pod))
    assert mixed > 50
