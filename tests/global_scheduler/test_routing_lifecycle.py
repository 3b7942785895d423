"""The routing tier's continual-learning scenario and retrainer on the quick scenario: the records' shape,
outcomes per window (range-independent, so cached), a deterministic retrainer whose checkpoints the registry
accepts, and distinct, valid sabotaged candidates. A small retrainer keeps the file to a few tens of seconds."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch

from global_scheduler.routing_lifecycle import RoutingLifecycle, RoutingRegimeScenario
from global_scheduler.routing_retrainer import RoutingRetrainer
from gnn.registry_validator import RoutingCheckpointValidator
from meridian.lifecycle.tiers import TierLifecycle
from meridian.model_registry.gates import TIER_METRICS

SMALL = dict(history_windows=36, passes=1, epochs=1)


@pytest.fixture(scope="module")
def scenario(traces_dir: Path) -> RoutingRegimeScenario:
    return RoutingRegimeScenario(quick=True, seed=3, traces_dir=traces_dir,
                                 retrainer=RoutingRetrainer(traces_dir, **SMALL))


@pytest.fixture(scope="module")
def stale(scenario: RoutingRegimeScenario, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.stale(tmp_path_factory.mktemp("routing") / "stale.pt").path


def test_lifecycle_declaration() -> None:
    lifecycle: TierLifecycle = RoutingLifecycle()
    assert (lifecycle.model, lifecycle.tier) == ("routing", "routing")
    assert isinstance(lifecycle.retrainer(), RoutingRetrainer)


def test_records_shape(scenario: RoutingRegimeScenario) -> None:
    records = scenario.records()
    assert [r.window for r in records] == list(range(scenario.windows))
    assert 0 < scenario.change_at < scenario.windows
    watched = {s.name for s in scenario.drift_features()}
    assert watched == {"carbon_intensity"}
    for r in records:
        assert set(r.features) == watched and len(r.features["carbon_intensity"]) == 60
        assert len(r.data["carbon_g_per_kwh"]) == len(r.data["price_per_mwh"]) == 4
        assert len(r.data["arrivals"]) == len(r.data["tenants"]) == r.decisions
        assert r.outcomes == {} and r.served_by == ""
    # The watched region's grid changes at change_at (Norway's few g/kWh → Great Britain's hundreds).
    before = np.mean([r.features["carbon_intensity"] for r in records[:scenario.change_at]])
    after = np.mean([r.features["carbon_intensity"] for r in records[scenario.change_at:]])
    assert after > 5 * before
    assert sum(r.decisions for r in records) > scenario.windows


def test_outcomes_per_window_and_independent_of_the_range(scenario: RoutingRegimeScenario, stale: Path) -> None:
    metrics = {name for name, _role in TIER_METRICS["routing"]}
    wide = scenario.outcomes(stale, range(85, 105))  # crosses a segment boundary (96)
    assert set(wide) == metrics and all(v.shape == (20,) for v in wide.values())
    assert scenario.primary_metric in metrics
    narrow = scenario.outcomes(stale, range(90, 100))
    for name in metrics:
        np.testing.assert_array_equal(narrow[name], wide[name][5:15])
    assert (wide["carbon_per_replica_hour"] > 0).all() and (wide["slo_violations"] >= 0).all()


def test_retrainer_is_deterministic_and_valid(scenario: RoutingRegimeScenario, stale: Path, tmp_path: Path) -> None:
    retrainer = RoutingRetrainer(scenario.traces_dir, **SMALL)
    records = scenario.records()[:scenario.change_at + 12]
    a = retrainer.train(records, parent=stale, out=tmp_path / "a.pt", seed=5)
    b = retrainer.train(records, parent=stale, out=tmp_path / "b.pt", seed=5)
    sa, sb = (torch.load(p, weights_only=True)["state_dict"] for p in (a.path, b.path))
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert a.metrics["samples"] > 0 and a.train_command
    RoutingCheckpointValidator().validate(a.path)
    parent = torch.load(stale, weights_only=True)["state_dict"]
    assert not all(torch.equal(sa[k], parent[k]) for k in sa)  # the fine-tune moved the parent


def test_sabotage_candidates_distinct_and_valid(scenario: RoutingRegimeScenario, stale: Path, tmp_path: Path) -> None:
    paths = [stale] + [scenario.sabotage(kind, i, tmp_path / f"{kind}-{i}.pt").path
                       for kind in ("random", "wrong_regime") for i in range(2)]
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}
    assert len(digests) == len(paths)
    for p in paths:
        RoutingCheckpointValidator().validate(p)
    again = torch.load(scenario.sabotage("random", 1, tmp_path / "again.pt").path, weights_only=True)["state_dict"]
    first = torch.load(tmp_path / "random-1.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(again[k], first[k]) for k in first)  # deterministic for the seed
