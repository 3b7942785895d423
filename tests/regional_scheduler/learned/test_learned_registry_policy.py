"""The placement policy a regional scheduler serves under the model registry (real Redis, the tier's real
validator): the active version served, the candidate in shadow judged on every decision and published to the
learner, its canary share served."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.bus import StreamBus
from meridian.lifecycle.records import EvaluationRecord, evaluations_stream
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import ModelState
from regional_scheduler.learned.registry_policy import policy_from_registry
from regional_scheduler.policies.fgd import FgdPolicy
from regional_scheduler.policies.learned import LearnedPolicy, ShadowPolicy
from tests.model_registry_helpers import placement_checkpoint, register_version
from tests.placement_helpers import decide_each


def _register(registry: ModelRegistry, path: Path, *states: ModelState) -> str:
    return register_version(registry, "placement", placement_checkpoint(path), *states)


def test_served_policy_follows_the_registry_and_judges_its_candidate(
        registry: ModelRegistry, redis_bus: StreamBus, tmp_path: Path, small_gpu_cluster, small_workload) -> None:
    assert isinstance(policy_from_registry(registry, redis_bus), FgdPolicy)  # no version yet: the fallback
    active = _register(registry, tmp_path / "a.pt", ModelState.SHADOW, ModelState.CANARY, ModelState.ACTIVE)
    served = policy_from_registry(registry, redis_bus)
    assert isinstance(served, LearnedPolicy) and served.load_error is None
    assert served.settings.checkpoint == registry.artifact_path(active)

    candidate = _register(registry, tmp_path / "b.pt", ModelState.SHADOW)
    shadow = policy_from_registry(registry, redis_bus, window_decisions=2)
    assert isinstance(shadow, ShadowPolicy) and shadow.canary is None
    assert shadow.learned.settings.checkpoint == registry.artifact_path(candidate)
    decide_each(shadow, small_gpu_cluster, small_workload)
    windows = [EvaluationRecord.model_validate_json(e.payload)
               for e in redis_bus.read_range(evaluations_stream("placement"))]
    assert windows and {(w.candidate, w.active) for w in windows} == {(candidate, active)}
    assert len(windows) == len(shadow.records) // 2

    registry.promote(candidate, ModelState.CANARY, who="test", why="test")
    canary = policy_from_registry(registry, redis_bus, canary_share=1.0)
    assert isinstance(canary, ShadowPolicy) and canary.canary is not None
    served_nodes = decide_each(canary, small_gpu_cluster, small_workload)
    assert served_nodes == [r.learned_node for r in canary.records]  # share 1.0: the candidate serves every pod


def test_the_regional_scheduler_command_serves_the_registry_when_asked(
        registry: ModelRegistry, redis_url: str, key_prefix: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    from regional_scheduler.kube_cli import served_policy
    from regional_scheduler.kube_scheduler import KubeSchedulerSettings

    settings = KubeSchedulerSettings(cluster="c1", policy="best-fit", bus_url=redis_url)
    assert served_policy(settings, False) == "best-fit"
    with pytest.raises(typer.BadParameter, match="--bus-url"):
        served_policy(KubeSchedulerSettings(cluster="c1", policy="best-fit"), True)
    monkeypatch.setenv("MERIDIAN_MODELS_ARTIFACTS", str(tmp_path / "store"))
    monkeypatch.setenv("MERIDIAN_MODELS_KEY_PREFIX", key_prefix)
    assert served_policy(settings, True).name == "best-fit"  # type: ignore[union-attr]  # an empty registry
    _register(registry, tmp_path / "a.pt", ModelState.SHADOW, ModelState.CANARY, ModelState.ACTIVE)
    candidate = _register(registry, tmp_path / "b.pt", ModelState.SHADOW)
    policy = served_policy(settings, True)
    assert isinstance(policy, ShadowPolicy) and isinstance(policy.active, LearnedPolicy)
    assert policy.learned.settings.checkpoint == registry.artifact_path(candidate)
