"""A tiny training run: finite losses, a policy that beats ``random``, the same result for the same seed."""

from __future__ import annotations

import math

import numpy as np
import pytest

from regional_scheduler.learned.algorithm import rollout, seed_episodes, train_profile
from regional_scheduler.learned.env import PlacementEnv, seed_episode
from regional_scheduler.learned.numpy_policy import NumpyPlacementNet
from regional_scheduler.learned.reward import CPU_REWARD, RewardConfig, band


@pytest.fixture(scope="module")
def episodes():
    return seed_episodes()  # seed-50x200 on training seeds 1000+: 200 placements per episode


def _train(episodes, seed: int):
    return train_profile(episodes=episodes, teacher="best-fit", reward=CPU_REWARD, bc_episodes=2, bc_every=1,
                         bc_epochs=3, es_steps=2_000, es_max_seconds=120, pairs=2, sigma=1.0, learning_rate=0.3,
                         seed=seed)


@pytest.fixture(scope="module")
def trained(episodes):
    return _train(episodes, seed=3)


def test_losses_are_finite_and_imitation_learns(trained) -> None:
    epochs = trained.log["imitation"]["epochs"]
    assert all(math.isfinite(e["loss"]) for e in epochs)
    assert epochs[-1]["loss"] < epochs[0]["loss"]
    assert trained.log["search"]["generations"], "policy search ran no generation"
    assert all(math.isfinite(g["centre_return"]) for g in trained.log["search"]["generations"])


def _random_return(episode) -> float:
    env = PlacementEnv(episode, reward=CPU_REWARD)
    _, info = env.reset(seed=0)
    rng = np.random.default_rng(0)  # ``random``: equal scores, ties broken uniformly at random
    total = 0.0
    while not env.done:
        _, r, _, _, info = env.step(int(info["candidates"][rng.integers(info["candidates"].size)]))
        total += r
    return total


def test_trained_policy_beats_random(trained) -> None:
    # On the training objective (the CPU profile's reward: allocation, Gini, unplaced pods), on the
    # benchmark's seeds 0-4, which training never saw.
    fast = NumpyPlacementNet(trained.net)
    held = [seed_episode(s) for s in range(5)]
    learned = np.mean([rollout(fast, ep, reward=CPU_REWARD).episode_return for ep in held])
    rand = np.mean([_random_return(ep) for ep in held])
    assert learned > rand, f"learned return {learned:.2f} ≤ random {rand:.2f}"


def test_same_seed_same_policy(trained, episodes) -> None:
    again = _train(episodes, seed=3)
    np.testing.assert_array_equal(again.log["search_vector"], trained.log["search_vector"])
    ep = episodes(777)
    a = rollout(NumpyPlacementNet(trained.net), ep)
    b = rollout(NumpyPlacementNet(again.net), ep)
    assert (a.allocation, a.n_failed, a.episode_return) == (b.allocation, b.n_failed, b.episode_return)


@pytest.mark.parametrize(
    ("weights", "ok"),
    [
        pytest.param({}, True, id="defaults-sum-to-1"),
        pytest.param({"fragmentation": 0.25, "balance": 0.25, "spreading": 0.25, "utilisation": 0.25}, True,
                     id="equal-quarters"),
        pytest.param({"fragmentation": 0.5, "balance": 0.5, "spreading": 0.5, "utilisation": 0.5}, False,
                     id="sum-2"),
        pytest.param({"fragmentation": 0.0, "balance": 0.0, "spreading": 0.0, "utilisation": 0.9}, False,
                     id="sum-0.9"),
    ],
)
def test_layered_weights_must_sum_to_one(weights: dict[str, float], ok: bool) -> None:
    if ok:
        RewardConfig(**weights)
    else:
        with pytest.raises(ValueError, match="sum to 1"):
            RewardConfig(**weights)


@pytest.mark.parametrize(
    ("util", "expected"),
    [
        pytest.param(0.40, 0.5, id="below-band"),  # 0.40 / 0.80
        pytest.param(0.80, 1.0, id="band-low-edge"),
        pytest.param(0.90, 1.0, id="inside-band"),
        pytest.param(0.95, 1.0, id="band-high-edge"),
        pytest.param(0.975, 0.5, id="above-band"),  # (1 − 0.975) / (1 − 0.95)
        pytest.param(1.0, 0.0, id="full"),
    ],
)
def test_utilisation_band(util: float, expected: float) -> None:
    assert band(util) == pytest.approx(expected)


def test_search_can_start_from_an_earlier_network(trained, episodes) -> None:
    # ``init`` skips imitation and starts the search (and the validation's reference) from that net.
    result = train_profile(episodes=episodes, teacher="best-fit", reward=CPU_REWARD, bc_episodes=2, bc_every=1,
                           bc_epochs=3, es_steps=400, es_max_seconds=60, pairs=2, sigma=1.0, learning_rate=0.3,
                           validation_episodes=1, seed=3, init=trained.net)
    assert result.log["imitation"]["skipped_for_init"] and not result.log["imitation"]["epochs"]
    assert result.log["search"]["generations"]
    if result.log["validation"]["kept"] == "imitation":  # the start was kept: it is the init network
        np.testing.assert_allclose(result.log["search_vector"], trained.log["search_vector"], rtol=1e-6)
    np.testing.assert_allclose(trained.net.search_vector(), trained.log["search_vector"], rtol=1e-6)  # not mutated


def test_search_with_gate_gpu_pods_leaves_every_gpu_pod_to_fgd() -> None:
    from meridian.traces import openb
    from regional_scheduler.learned.algorithm import openb_episodes
    from regional_scheduler.learned.policy import CPU_ONLY
    from regional_scheduler.learned.reward import GPU_REWARD

    pods = openb.load_pods(openb.openb_dir() / "openb_pod_list_cpu300.csv")
    episodes = openb_episodes([pods], openb.load_nodes(), node_fraction=0.03)
    result = train_profile(episodes=episodes, teacher="fgd", reward=GPU_REWARD, bc_episodes=1, bc_every=4,
                           bc_epochs=1, es_steps=600, es_max_seconds=120, pairs=2, sigma=0.5, learning_rate=0.05,
                           seed=0, residual_bound=0.45, zero_correction=True, gate_gpu_pods=True)
    assert result.net.gate_gpu_pods
    assert np.any(result.net.search_vector() != 0.0), "the search never moved off FGD"
    fast = NumpyPlacementNet(result.net)
    env = PlacementEnv(episodes(7), lazy_features=True)
    obs, info = env.reset()
    gpu_pods = 0
    while not env.done:
        base = info["base_scores"]
        logits = fast.residual_columns(base, info["features_of"], obs["pod_features"])
        if obs["pod_features"][CPU_ONLY] == 0:
            gpu_pods += 1
            assert int(np.argmax(logits)) == int(np.argmax(base))  # FGD's own first best node
        obs, _, _, _, info = env.step(int(info["candidates"][int(np.argmax(logits))]))
    assert gpu_pods > 0
