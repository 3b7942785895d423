"""The CPU profile's training options (session 3): a Gini cap in the reward, the feature subset and
the MLP layers a policy search may move."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from meridian import metrics
from meridian.cluster_state import ClusterState
from meridian.simulator import seed_cluster, seed_pods
from regional_scheduler.learned.algorithm import (
    CPU_SEARCH_FEATURES,
    EvolutionStrategy,
    search_mask,
    seed_episodes,
)
from regional_scheduler.learned.commands import cpu_reward_config
from regional_scheduler.learned.features import IDX, N_NODE
from regional_scheduler.learned.policy import NumpyPlacementNet, PlacementNet
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
