"""The autoscaling policy a deployment runs under the model registry (real Redis, the tier's real validator):
the fallback with no version, the active checkpoint served, a shadow candidate's windows published, and in
canary the candidate live for the deployments of its share, its records saying so."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from meridian.bus import StreamBus
from meridian.lifecycle.records import EvaluationRecord, evaluations_stream
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import ModelState
from regional_scheduler.autoscaling.dqn.checkpoint import load_checkpoint
from regional_scheduler.autoscaling.policies.learned_policy import LearnedPolicy
from regional_scheduler.autoscaling.registry_policy import policy_from_registry
from regional_scheduler.autoscaling.scenario import build_scenario
from regional_scheduler.autoscaling.shadow import ShadowRunner
from tests.model_registry_helpers import autoscaling_checkpoint, register_version


def _register(registry: ModelRegistry, path: Path, *states: ModelState) -> str:
    return register_version(registry, "autoscaling", autoscaling_checkpoint(path), *states)


def test_deployment_policy_follows_the_registry_and_judges_its_candidate(
        registry: ModelRegistry, redis_bus: StreamBus, tmp_path: Path, per_minute_csv: Path) -> None:
    deployment = "prod/web"
    assert policy_from_registry(registry, redis_bus, deployment=deployment).name == "quantile-budget"
    active = _register(registry, tmp_path / "a.pt", ModelState.SHADOW, ModelState.CANARY, ModelState.ACTIVE)
    served = policy_from_registry(registry, redis_bus, deployment=deployment)
    assert isinstance(served, LearnedPolicy) and served.network is not None

    candidate = _register(registry, tmp_path / "b.pt", ModelState.SHADOW)
    runner = policy_from_registry(registry, redis_bus, deployment=deployment, window_decisions=60)
    assert isinstance(runner, ShadowRunner)
    build_scenario(per_minute_csv).held_back(runner)  # type: ignore[arg-type]
    windows = [EvaluationRecord.model_validate_json(e.payload)
               for e in redis_bus.read_range(evaluations_stream("autoscaling"))]
    assert windows and {(w.candidate, w.active) for w in windows} == {(candidate, active)}
    first = runner.records[:60]
    assert windows[0].active_outcomes["replica_hours"] == pytest.approx(
        sum(r.live_replicas * r.interval_s for r in first) / 3600)  # shadow: the served policy is live

    registry.promote(candidate, ModelState.CANARY, who="test", why="test")
    candidate_net = load_checkpoint(registry.artifact_path(candidate))[0]

    def is_candidate(policy: object) -> bool:
        assert isinstance(policy, LearnedPolicy) and policy.network is not None
        pairs = zip(policy.network.state_dict().values(), candidate_net.state_dict().values(), strict=True)
        return all(torch.equal(a, b) for a, b in pairs)

    everyone = policy_from_registry(registry, redis_bus, deployment=deployment, canary_share=1.0)
    assert isinstance(everyone, ShadowRunner) and is_candidate(everyone.live) and not is_candidate(everyone.shadow)
    nobody = policy_from_registry(registry, redis_bus, deployment=deployment, canary_share=0.0)
    assert isinstance(nobody, ShadowRunner) and is_candidate(nobody.shadow) and not is_candidate(nobody.live)
