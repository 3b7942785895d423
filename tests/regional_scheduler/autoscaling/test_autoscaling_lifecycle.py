"""The autoscaling tier's continual-learning scenario and retrainer, on the quick regime change."""

from __future__ import annotations

import hashlib
import tomllib
from importlib.metadata import EntryPoint
from pathlib import Path

import numpy as np
import pytest
import torch

from meridian.lifecycle.tiers import ENTRY_POINT_GROUP
from regional_scheduler.autoscaling.dqn.checkpoint import load_checkpoint
from regional_scheduler.autoscaling.lifecycle import AutoscalingLifecycle, AutoscalingRetrainer
from regional_scheduler.autoscaling.lifecycle_records import deployment_from_records
from regional_scheduler.autoscaling.lifecycle_scenario import QUICK_REGIME, AutoscalingRegimeScenario
from regional_scheduler.autoscaling.registry_validator import AutoscalingCheckpointValidator

METRICS = {"slo_violation_minutes", "replica_hours"}
# A retrain in a test: a few hundred steps show determinism and the checkpoint's layout, not learning.
TEST_RETRAINER = AutoscalingRetrainer(min_steps=200, max_steps=200)


@pytest.fixture(scope="module")
def scenario() -> AutoscalingRegimeScenario:
    return AutoscalingLifecycle().scenario(quick=True, seed=0)


@pytest.fixture(scope="module")
def stale_path(scenario: AutoscalingRegimeScenario, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return scenario.stale(tmp_path_factory.mktemp("stale") / "stale.pt").path


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_declared_in_the_entry_point_group() -> None:
    # Read from pyproject.toml rather than the installed metadata, which lags until a reinstall.
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    target = pyproject["project"]["entry-points"][ENTRY_POINT_GROUP]["autoscaling"]
    lifecycle = EntryPoint("autoscaling", target, ENTRY_POINT_GROUP).load()()
    assert isinstance(lifecycle, AutoscalingLifecycle)
    assert (lifecycle.model, lifecycle.tier) == ("autoscaling", "autoscaling")


def test_records_one_window_of_per_minute_rates_each(scenario: AutoscalingRegimeScenario) -> None:
    records = scenario.records()
    minutes = QUICK_REGIME.window_minutes
    assert [r.window for r in records] == list(range(scenario.windows))
    assert 0 < scenario.change_at < scenario.windows
    assert {f.name for f in scenario.drift_features()} == {"request_rate"}
    for record in records:
        assert set(record.features) == {"request_rate"} and len(record.features["request_rate"]) == minutes
        assert set(record.data) == {"requests_per_minute", "observed", "capacity_per_replica_rpm"}
        assert record.data["requests_per_minute"] == record.features["request_rate"]
        assert (record.end - record.start).total_seconds() == minutes * 60
        assert not record.outcomes and not record.served_by
    # The retrainer rebuilds exactly the scenario's minutes from the records, missing ones as missing.
    rebuilt = deployment_from_records(records)
    start = scenario.history_minutes
    assert np.allclose(rebuilt.requests_per_minute, scenario.deployment.requests_per_minute[start:], equal_nan=True)


def test_outcomes_per_window_independent_of_the_range(scenario: AutoscalingRegimeScenario,
                                                      stale_path: Path) -> None:
    whole = scenario.outcomes(stale_path, range(scenario.change_at, scenario.windows))
    part = scenario.outcomes(stale_path, range(scenario.change_at + 5, scenario.change_at + 25))
    assert set(whole) == METRICS == set(part)
    assert all(v.shape == (scenario.windows - scenario.change_at,) for v in whole.values())
    for metric in METRICS:
        assert np.array_equal(part[metric], whole[metric][5:25])
    # 15 minutes of at least one replica; violations are whole minutes of the window.
    assert np.all(whole["replica_hours"] >= 0.25 - 1e-9)
    assert np.all((whole["slo_violation_minutes"] >= 0) & (whole["slo_violation_minutes"] <= 15))


def test_retrainer_is_deterministic_and_passes_the_validator(scenario: AutoscalingRegimeScenario,
                                                             stale_path: Path, tmp_path: Path) -> None:
    records = scenario.records()[scenario.change_at:scenario.change_at + 40]
    first = TEST_RETRAINER.train(records, parent=stale_path, out=tmp_path / "a.pt", seed=3)
    again = TEST_RETRAINER.train(records, parent=stale_path, out=tmp_path / "b.pt", seed=3)
    other = TEST_RETRAINER.train(records, parent=stale_path, out=tmp_path / "c.pt", seed=4)
    weights = [load_checkpoint(m.path)[0].state_dict() for m in (first, again, other)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    assert not all(torch.equal(weights[0][k], weights[2][k]) for k in weights[0])
    assert _sha(first.path) != _sha(stale_path)
    assert AutoscalingCheckpointValidator().validate(first.path)["actions"] > 0


def test_sabotaged_candidates_are_distinct_valid_checkpoints(scenario: AutoscalingRegimeScenario,
                                                             stale_path: Path, tmp_path: Path) -> None:
    paths = [scenario.sabotage(kind, i, tmp_path / f"{kind}-{i}.pt").path
             for kind in ("random", "wrong_regime") for i in range(2)]
    oracle = scenario.oracle(tmp_path / "oracle.pt").path
    validator = AutoscalingCheckpointValidator()
    for path in [*paths, oracle]:
        validator.validate(path)
    assert len({_sha(p) for p in [*paths, oracle, stale_path]}) == len(paths) + 2
    outcomes = scenario.outcomes(paths[0], range(scenario.change_at, scenario.change_at + 8))
    assert all(v.shape == (8,) for v in outcomes.values())
