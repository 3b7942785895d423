"""The placement correction trained across regions on Flower (real server and clients over loopback gRPC),
each region on its own openb pod list and node pool: shapes, determinism, a region sending back a search only
when it beats the weights it received, the comparison's figures, registration as a candidate, and regions
that share no data with each other or with the held-out lists."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from meridian.federated.engine import run_federated
from meridian.model_registry.registry import open_registry
from regional_scheduler.federated_cli import _register
from regional_scheduler.learned.checkpoint import load_checkpoint
from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT, TRAINING_LISTS
from regional_scheduler.learned.federated import (
    ACTIVE,
    HELD_OUT_LISTS,
    REGION_LISTS,
    TEST,
    TRAIN,
    VALIDATION,
    PlacementTask,
    SearchSettings,
    compare_placement,
    online_allocation_pct,
    placement_regions,
    save_federated_checkpoint,
    start_network,
    with_weights,
)

# Tiny: 12-node episodes, one generation of 1 ± pair per round, two check and two validation episodes.
TINY = SearchSettings(generations=1, pairs=1)


def _tasks(*, check_episodes: int = 2) -> dict[str, PlacementTask]:
    regions = placement_regions(2, 0, pool_nodes=40, episode_nodes=12)
    net = start_network()
    return {r.name: PlacementTask([r], net, TINY, validation_episodes=2, noise_key=r.index,
                                  check_episodes=check_episodes) for r in regions}


@pytest.fixture(scope="module")
def federated_run():
    tasks = _tasks()
    return tasks, run_federated(tasks, rounds=2, strategy="fedavg", seed=3)


def test_a_short_federated_run_sends_the_corrections_weights_and_finite_losses(federated_run) -> None:
    _, result = federated_run
    assert [r.round for r in result.rounds] == [1, 2] and not result.refused_updates
    assert [a.shape for a in result.parameters] == [(ACTIVE.size,)] == [(17,)]
    assert np.all(np.isfinite(result.parameters[0]))
    assert result.rounds[0].bytes_to_server == 2 * 17 * 8
    for region, sent in result.sent.items():
        fits = [body for kind, body in sent if kind == "fit"]
        losses = [body[0] for kind, body in sent if kind == "evaluate"]
        assert len(fits) == 2 and len(losses) == 2, region
        for arrays, n, metrics in fits:
            assert [a.shape for a in arrays] == [(17,)] and n == 1 and set(metrics) == {"train_return", "kept_search"}
            assert metrics["kept_search"] in (0.0, 1.0) and np.isfinite(metrics["train_return"])
        # a loss is minus a GPU allocation in percent
        assert all(np.isfinite(loss) and -100.0 <= loss <= 0.0 for loss in losses), (region, losses)


def test_the_same_seed_gives_the_same_weights() -> None:
    # Without the acceptance check every search is sent, so the weights move in both runs.
    first, second = (run_federated(_tasks(check_episodes=0), rounds=2, strategy="fedprox", proximal_mu=1.0,
                                   seed=3).parameters[0] for _ in range(2))
    assert np.any(first != 0)
    np.testing.assert_array_equal(first, second)


def test_a_regions_search_moves_the_weights_and_is_kept_only_if_it_beats_its_start() -> None:
    region = placement_regions(1, 0, pool_nodes=40, episode_nodes=12)[0]
    net = start_network()
    free = PlacementTask([region], net, TINY, validation_episodes=1, noise_key=0, check_episodes=0)
    checked = PlacementTask([region], net, TINY, validation_episodes=1, noise_key=0, check_episodes=2)
    [found], n, metrics = free.fit_from(np.zeros(17), first_episode=0, generations=1, seed=5)
    assert n == 1 and metrics["kept_search"] == 1.0 and np.any(found != 0)
    [sent], _, metrics = checked.fit_from(np.zeros(17), first_episode=0, generations=1, seed=5)
    np.testing.assert_array_equal(sent, found if metrics["kept_search"] else np.zeros(17))
    check = [region.episode(TRAIN, 500_000 + j) for j in range(2)]
    online = [np.mean([online_allocation_pct(with_weights(net, w), ep) for ep in check]) for w in (found, np.zeros(17))]
    assert bool(metrics["kept_search"]) == (online[0] > online[1])


def test_the_zero_correction_is_fgd() -> None:
    region = placement_regions(1, 0, pool_nodes=40, episode_nodes=8)[0]
    episode = region.episode(TEST, 0)
    assert online_allocation_pct(with_weights(start_network(), np.zeros(17)), episode) == \
        online_allocation_pct(None, episode)


def test_regions_share_no_pod_list_node_or_episode_and_never_use_held_out_lists() -> None:
    assert set(REGION_LISTS) == set(TRAINING_LISTS) and not set(REGION_LISTS) & set(HELD_OUT_LISTS)
    regions = placement_regions(8, 0)
    assert len({r.pod_list for r in regions}) == 8 and {r.pod_list for r in regions} <= set(TRAINING_LISTS)
    pools = [set(r.node_indices) for r in regions]
    assert sum(map(len, pools)) == len(set().union(*pools)) == 8 * 120
    assert len({r.favoured_model for r in regions}) == 6
    assert [max(r.model_mix(), key=r.model_mix().get) for r in regions[:2]] == ["G2", "T4"]
    seeds = [r.episode_seed(split, i) for r in regions for split in (TRAIN, VALIDATION, TEST)
             for i in (0, 1, 999_999)]
    assert len(set(seeds)) == len(seeds)
    with pytest.raises(ValueError):
        regions[0].episode_seed(TRAIN, 1_000_000)
    with pytest.raises(ValueError):
        placement_regions(len(REGION_LISTS) + 1)
    assert placement_regions(4, 0) == placement_regions(8, 0)[:4]


def test_the_federated_correction_is_registered_as_a_placement_candidate(redis_url: str, key_prefix: str,
                                                                         tmp_path: Path) -> None:
    weights = np.linspace(-0.5, 0.5, ACTIVE.size)
    path = tmp_path / "federated-placement.pt"
    save_federated_checkpoint(path, [weights])
    nets, extra = load_checkpoint(path)
    assert extra["federated"] is True
    assert np.allclose(nets["gpu"].search_vector()[ACTIVE], weights)  # served as trained
    committed, _ = load_checkpoint(DEFAULT_CHECKPOINT)
    assert np.array_equal(nets["cpu"].search_vector(), committed["cpu"].search_vector())  # CPU profile kept
    record = {"train_command": "meridian train federated --model placement --regions 2",
              "regions": ["r0", "r1"], "settings": {"rounds": 1}, "results": {"totals": {"federated": 91.5}}}
    _register(path, record, redis_url, tmp_path / "store", key_prefix)
    registry = open_registry(redis_url, artifacts_dir=tmp_path / "store", key_prefix=key_prefix)
    try:
        (version,) = registry.versions("placement")
        assert version.state == "candidate" and version.metrics == {"federated": 91.5}
        assert version.train_command == record["train_command"]
    finally:
        registry.close()
    with pytest.raises(ValueError, match="17 weights"):
        save_federated_checkpoint(tmp_path / "bad.pt", [np.zeros(3)])


def test_the_comparison_reports_every_model_on_every_regions_test_episodes() -> None:
    regions = placement_regions(2, 0, pool_nodes=40, episode_nodes=12)
    comparison, result = compare_placement(regions, rounds=1, generations_per_round=1, pairs=1, test_episodes=1,
                                           test_nodes=16, check_episodes=1, finetune_generations=1)
    assert set(comparison.regions) == {r.name for r in regions}
    for v in comparison.regions.values():
        for model in ("untrained", "local", "federated", "federated_finetuned", "central"):
            assert 0.0 <= v[model] <= 100.0, (model, v)
    totals = comparison.totals
    assert "higher is better" in totals["metric"]
    assert 0 <= totals["federated_beats_local_regions"] <= 2
    assert totals["federated_vs_untrained"] == pytest.approx(totals["federated"] - totals["untrained"])
    assert [r.round for r in comparison.rounds] == [1] and result.parameters[0].shape == (ACTIVE.size,)
    json.dumps(comparison.as_dict())  # what `bench federated --json` writes
