"""The CPU profile's training options: a Gini cap in the reward, the feature subset and
the MLP layers a policy search may move; a cap on a batch's *mean* Gini."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meridian import metrics
from meridian.cluster_state import ClusterState
from meridian.simulator import seed_cluster, seed_pods
from regional_scheduler.learned.algorithm import (
    CPU_SEARCH_FEATURES,
    EpisodeResult,
    EvolutionStrategy,
    MeanFragmentationCap,
    batch_fitness,
    line_search,
    rollout,
    search_mask,
    seed_episodes,
    train_profile,
)
from regional_scheduler.learned.commands import cpu_mean_cap, cpu_reward_config
from regional_scheduler.learned.features import IDX, N_NODE
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.learned.reward import CPU_REWARD, RewardConfig, terminal_reward


def _half_full_state() -> tuple[ClusterState, float]:
    """Seed cluster half filled first-fit (deterministic, packing): very unequal free resources."""
    state = ClusterState.from_nodes(seed_cluster())
    for pod in seed_pods(0)[:100]:
        node = int(np.flatnonzero((state.free_milli_cpu >= pod.requests.milli_cpu)
                                  & (state.free_memory_bytes >= pod.requests.memory_bytes))[0])
        state.allocate(pod, state.choose_devices(node, pod))
    return state, metrics.seed_fragmentation_score(state) / 100.0


def test_fragmentation_cap_costs_only_above_the_cap() -> None:
    state, frag = _half_full_state()
    assert 0.3 < frag < 0.95
    plain = RewardConfig(terminal_allocation=50.0, terminal_fragmentation=10.0)
    below = plain.model_copy(update={"fragmentation_cap": frag + 0.01, "fragmentation_over_cap": 1000.0})
    above = plain.model_copy(update={"fragmentation_cap": frag - 0.05, "fragmentation_over_cap": 1000.0})
    assert terminal_reward(below, state) == pytest.approx(terminal_reward(plain, state))
    assert terminal_reward(above, state) == pytest.approx(terminal_reward(plain, state) - 1000.0 * 0.05)


def test_cpu_reward_options_are_in_gini_points() -> None:
    cfg = cpu_reward_config(10.0, 10.0, 28.0, 10.0)
    assert cfg.unplaced_penalty == 10.0 and cfg.terminal_fragmentation == 10.0
    # 28 Gini points = 0.28 of the reward's fragmentation; 10 per point = 1000 per unit.
    assert cfg.fragmentation_cap == pytest.approx(0.28) and cfg.fragmentation_over_cap == pytest.approx(1000.0)
    default = cpu_reward_config(1.5, 100.0, None, 10.0)
    assert default == CPU_REWARD  # the defaults are the committed training reward


def test_cpu_search_mask_moves_cpu_columns_and_mlp_scale() -> None:
    mask = search_mask(CPU_SEARCH_FEATURES)
    assert mask is not None and mask[-1] and mask[IDX["best_fit_leftover"]]
    assert not mask[IDX["free_gpu_frac"]] and not mask[IDX["carbon_present"]]
    assert not search_mask(["best_fit_leftover"])[-1]  # type: ignore[index]  # mlp_scale only when named
    with pytest.raises(ValueError, match="unknown"):
        search_mask(["no_such_feature"])


def test_search_vector_with_layers_round_trips_and_numpy_matches_torch() -> None:
    torch.manual_seed(0)
    net = PlacementNet(hidden=16)
    layers = ("mlp.2", "mlp.4")
    vec = net.search_vector(layers)
    assert vec.size == N_NODE + 1 + 16 * 16 + 16 + 16 + 1
    moved = vec + 0.3 * np.random.default_rng(0).standard_normal(vec.size)
    fast = NumpyPlacementNet(net).with_search_vector(moved, layers)
    net.set_search_vector(moved, layers)
    np.testing.assert_allclose(net.search_vector(layers), moved, rtol=1e-6, atol=1e-6)
    x = np.random.default_rng(1).random((7, N_NODE)).astype(np.float32)
    p = np.random.default_rng(2).random(net.n_pod).astype(np.float32)
    np.testing.assert_allclose(fast.predict(x, p), net.predict(x, p), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="cannot move"):
        net.search_vector(("mlp.0",))


@pytest.mark.parametrize("layers", [(), ("mlp.4",)], ids=["head-only", "output-layer"])
def test_search_moves_layer_weights_only_when_asked(layers: tuple[str, ...]) -> None:
    torch.manual_seed(0)
    net = PlacementNet(hidden=16)
    net.set_search_vector(np.r_[np.zeros(N_NODE), 1.0])  # the MLP alone decides: its weights matter
    before = net.mlp[4].weight.detach().clone()
    es = EvolutionStrategy(net, seed_episodes(), reward=CPU_REWARD, pairs=2, sigma=0.5, learning_rate=0.3, seed=0,
                           active=search_mask(CPU_SEARCH_FEATURES), layers=layers)
    es.generation()
    moved = es.finish().mlp[4].weight.detach()
    assert torch.equal(moved, before) != bool(layers)


def _result(ret: float, frag: float) -> EpisodeResult:
    return EpisodeResult(episode_return=ret, allocation=0.9, n_arrived=200, n_failed=0, steps=200, fragmentation=frag)


def test_mean_cap_costs_only_when_the_batch_mean_is_above_it() -> None:
    cap = MeanFragmentationCap(cap=0.31, over_cap=1000.0)
    # One episode far above the cap, the mean below it: no cost (a per-episode cap would charge 90).
    under = [_result(-5.0, 0.20), _result(-7.0, 0.40)]
    assert batch_fitness(under, cap) == pytest.approx(-6.0) == batch_fitness(under)
    over = [_result(-5.0, 0.30), _result(-7.0, 0.40)]
    assert batch_fitness(over, cap) == pytest.approx(-6.0 - 1000.0 * 0.04)


def test_cpu_mean_cap_option_is_in_gini_points() -> None:
    assert cpu_mean_cap(None, 10.0) is None
    cap = cpu_mean_cap(28.0, 10.0)
    assert cap is not None and cap.cap == pytest.approx(0.28) and cap.over_cap == pytest.approx(1000.0)


def test_rollout_reports_the_final_seed_gini() -> None:
    """The greedy rollout's decisions do not depend on the reward, so one more unit of terminal
    fragmentation weight lowers the return by exactly the reported final fragmentation."""
    torch.manual_seed(0)
    fast = NumpyPlacementNet(PlacementNet(hidden=16))
    episode = seed_episodes()(0)
    plain = rollout(fast, episode, reward=CPU_REWARD)
    heavier = rollout(fast, episode, reward=CPU_REWARD.model_copy(
        update={"terminal_fragmentation": CPU_REWARD.terminal_fragmentation + 1.0}))
    assert 0.05 < plain.fragmentation < 1.0
    assert plain.episode_return - heavier.episode_return == pytest.approx(plain.fragmentation, abs=1e-9)


def test_search_fitness_applies_the_mean_cap() -> None:
    torch.manual_seed(0)
    net = PlacementNet(hidden=16)
    batch = [seed_episodes()(i) for i in range(2)]
    free = EvolutionStrategy(net, seed_episodes(), reward=CPU_REWARD, seed=0)
    capped = EvolutionStrategy(net, seed_episodes(), reward=CPU_REWARD, seed=0,
                               mean_cap=MeanFragmentationCap(cap=0.0, over_cap=1000.0))
    theta = free.theta
    results = [rollout(free.fast.with_search_vector(theta), ep, reward=CPU_REWARD) for ep in batch]
    mean_frag = float(np.mean([r.fragmentation for r in results]))
    assert free._fitness(theta, batch)[0] == pytest.approx(batch_fitness(results))
    assert capped._fitness(theta, batch)[0] == pytest.approx(batch_fitness(results) - 1000.0 * mean_frag)


def test_line_search_keeps_the_best_shift_and_always_tries_the_start() -> None:
    torch.manual_seed(0)
    net = PlacementNet(hidden=16)
    net.set_search_vector(np.zeros(N_NODE + 1))  # g ≡ 0: the shifted feature alone ranks the nodes
    theta0 = net.search_vector()
    # Mean Gini dominates the fitness: the kept shift must be the one with the lowest mean Gini.
    cap = MeanFragmentationCap(cap=0.0, over_cap=1e6)
    theta, records = line_search(net, seed_episodes(), coordinate="best_fit_leftover", deltas=[5.0, -5.0],
                                 n_episodes=2, reward=CPU_REWARD, mean_cap=cap)
    assert [r["delta"] for r in records] == [-5.0, 0.0, 5.0]
    assert len({round(r["mean_gini"], 6) for r in records}) > 1  # the shifts change decisions
    best = max(records, key=lambda r: r["fitness"])
    assert best["mean_gini"] == min(r["mean_gini"] for r in records)
    assert theta[IDX["best_fit_leftover"]] - theta0[IDX["best_fit_leftover"]] == pytest.approx(best["delta"])
    np.testing.assert_array_equal(np.delete(theta, IDX["best_fit_leftover"]),
                                  np.delete(theta0, IDX["best_fit_leftover"]))
    np.testing.assert_array_equal(net.search_vector(), theta0)  # the network itself is not changed
    with pytest.raises(ValueError, match="unknown"):
        line_search(net, seed_episodes(), coordinate="no_such", deltas=[1.0], n_episodes=1)


def test_train_profile_applies_the_line_search_before_the_policy_search() -> None:
    torch.manual_seed(0)
    start = PlacementNet(hidden=16)
    start.set_search_vector(np.zeros(N_NODE + 1))
    line = ("best_fit_leftover", [-5.0, 5.0], 2)
    result = train_profile(episodes=seed_episodes(), teacher="best-fit", reward=CPU_REWARD, bc_episodes=0, bc_every=1,
                           bc_epochs=0, es_steps=0, es_max_seconds=60.0, init=start,
                           mean_cap=MeanFragmentationCap(cap=0.0, over_cap=1e6), line=line)
    shifts = result.log["search"]["line_search"]["shifts"]
    kept = max(shifts, key=lambda r: r["fitness"])["delta"]
    # The cap makes the lowest mean Gini win: +5 prefers large leftovers (spreading), where g ≡ 0
    # (first fit) and −5 (best fit) pack.
    assert kept == 5.0 and min(shifts, key=lambda r: r["mean_gini"])["delta"] == 5.0
    assert result.net.search_vector()[IDX["best_fit_leftover"]] == pytest.approx(kept)
    np.testing.assert_array_equal(start.search_vector(), np.zeros(N_NODE + 1))  # the start is not changed


def test_search_feature_options_name_the_same_sets_for_both_profiles() -> None:
    from regional_scheduler.learned.algorithm import CORRECTION_FEATURES
    from regional_scheduler.learned.commands import _search_features

    assert _search_features("all") is None
    assert _search_features("correction") == CORRECTION_FEATURES
    assert _search_features("cpu") == CPU_SEARCH_FEATURES
    assert _search_features(" best_fit_leftover, mlp_scale ") == ["best_fit_leftover", "mlp_scale"]
