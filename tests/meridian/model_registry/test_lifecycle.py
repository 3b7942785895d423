"""The continual learner and ``bench lifecycle``'s runner on the real Redis, with a toy tier whose "model" is one
number (a JSON checkpoint the stand-in validator accepts): the window's outcome is the model's squared error
against the regime's mean, so a model trained on the new regime is better after the change, a stale one worse,
and the arithmetic of every report figure can be checked by hand."""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from meridian.bus import StreamBus
from meridian.drift import Detector, DriftSettings, FeatureSpec
from meridian.lifecycle.bench import LifecycleBenchSettings, run_scenario
from meridian.lifecycle.learner import ContinualLearner, LearnerSettings, records_window
from meridian.lifecycle.records import (
    DriftEvent,
    EvaluationRecord,
    LearningRecord,
    drift_stream,
    evaluations_stream,
    records_stream,
)
from meridian.lifecycle.tiers import SabotageKind, TrainedModel
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import ModelState

LAYOUT = "layout-v7"  # the stand-in validator's layout (conftest.py)

T0 = datetime(2026, 11, 1, tzinfo=UTC)
OLD_MEAN, NEW_MEAN = 0.0, 3.0


def write_model(out: Path, theta: float, note: str) -> TrainedModel:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"layout": LAYOUT, "theta": theta, "note": note}))
    return TrainedModel(out, f"toy-train {note}", {"theta": theta})


def theta_of(path: Path) -> float:
    return float(json.loads(Path(path).read_text())["theta"])


class ToyRetrainer:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def train(self, records: Sequence[LearningRecord], *, parent: Path | None, out: Path, seed: int) -> TrainedModel:
        self.calls.append((records[0].window, records[-1].window))
        values = np.concatenate([np.asarray(r.data["x"], dtype=float) for r in records])
        return write_model(out, float(values.mean()), f"seed={seed} windows={records[0].window}-{records[-1].window}")


class ToyScenario:
    name = "toy"
    description = "the mean of x moves from 0 to 3"
    primary_metric = "unschedulable_pods"

    def __init__(self, windows: int = 700, change_at: int = 200, seed: int = 0) -> None:
        self.windows, self.change_at = windows, change_at
        rng = np.random.default_rng(seed)
        means = np.where(np.arange(windows) < change_at, OLD_MEAN, NEW_MEAN)
        self.x = means[:, None] + rng.normal(size=(windows, 10))
        self.noise = rng.normal(scale=0.05, size=windows)

    def drift_features(self) -> tuple[FeatureSpec, ...]:
        return (FeatureSpec("x", (Detector.ADWIN,)),)

    def records(self) -> list[LearningRecord]:
        return [LearningRecord(model="placement", window=w, start=T0 + timedelta(minutes=w),
                               end=T0 + timedelta(minutes=w + 1), source="toy", decisions=10,
                               features={"x": self.x[w].tolist()}, data={"x": self.x[w].tolist()})
                for w in range(self.windows)]

    def outcomes(self, checkpoint: Path, windows: range) -> dict[str, np.ndarray]:
        idx = np.arange(windows.start, windows.stop)
        error = (self.x[idx].mean(axis=1) - theta_of(checkpoint)) ** 2
        return {"unschedulable_pods": error + 1.0, "gpu_fragmentation": 1.0 + self.noise[idx] ** 2}

    def stale(self, out: Path) -> TrainedModel:
        return write_model(out, OLD_MEAN + 0.01, "stale")

    def oracle(self, out: Path) -> TrainedModel:
        return write_model(out, NEW_MEAN, "oracle")

    def sabotage(self, kind: SabotageKind, index: int, out: Path) -> TrainedModel:
        theta = 20.0 + index if kind == "random" else OLD_MEAN + 0.5 + index / 1000
        return write_model(out, theta, f"{kind}-{index}")


class ToyLifecycle:
    model = "placement"
    tier = "placement"

    def __init__(self) -> None:
        self.retrainer_ = ToyRetrainer()

    def retrainer(self) -> ToyRetrainer:
        return self.retrainer_

    def scenario(self, *, quick: bool, seed: int) -> ToyScenario:
        return ToyScenario(seed=seed)


def bench_settings(**overrides: Any) -> LifecycleBenchSettings:
    return LifecycleBenchSettings(
        injections=3, learner=LearnerSettings(post_drift_windows=30, min_train_windows=20),
        drift=DriftSettings(warmup_samples=500, cooldown_samples=5000), **overrides)


def test_bench_runner_detects_retrains_promotes_and_rejects_sabotage(registry: ModelRegistry,
                                                                    redis_bus: StreamBus, tmp_path: Path) -> None:
    lifecycle = ToyLifecycle()
    seen: list[tuple[str, float, float]] = []
    report = run_scenario(lifecycle, registry=registry, bus=redis_bus, out_dir=tmp_path / "toy",
                          settings=bench_settings(), progress=lambda *a: seen.append(a))
    delay = report["detection_delay"]
    assert delay is not None and 0 <= delay["windows"] < 30 and delay["feature"] == "x"
    assert delay["decisions"] == 10 * (delay["windows"] + 1)
    assert report["false_alarms"] == 0
    events = [DriftEvent.model_validate_json(e.payload) for e in redis_bus.read_range(drift_stream("placement"))]
    assert events and events[0].feature == "x" and events[0].window == delay["window"]
    # the retrain read only windows after the alert (lookback 0) and ended before its evaluation began
    first, last = lifecycle.retrainer_.calls[0]
    assert first >= 200 + delay["windows"] and last == report["retrains"][0]["train_end"]
    assert report["comparison"]["eval_windows"][0] == last + 1
    assert report["continual"] < report["stale"] and report["oracle"] < report["stale"]
    cmp = report["comparison"]
    assert cmp["final_active"]["version"] == report["retrains"][0]["version"]  # promoted through the gates
    assert report["refused_evaluations"] == 0 and report["failed_retrains"] == 0
    assert report["retrains"][0]["state"] == "active" and "keeps it" in report["retrains"][0]["last_decision"]
    assert report["judged_windows"][0] == last + 1  # sabotage is judged where the active model never trained
    for kind in ("random", "wrong_regime"):
        assert report["sabotage_promotions"][kind]["promoted"] == 0
        assert report["sabotage_promotions"][kind]["rejected"] == 3
        forced = report["rollback_within"][kind]
        assert forced["rolled_back"] and forced["windows"] <= forced["bound_windows"]
        assert forced["damage"]["unschedulable_pods"] > 0
    assert all(report["checks"].values()), report["checks"]
    assert registry.active("placement").version_id == cmp["final_active"]["version"]  # the forced ones undone
    audit = registry.audit("placement")
    assert {r.who for r in audit} >= {"bench:bootstrap", "learner@bench-toy", "bench:sabotage", "bench:forced"}
    assert any(what.startswith("toy: replay") for what, _, _ in seen)


def _learner(registry: ModelRegistry, bus: StreamBus, tmp_path: Path, **settings: Any) -> ContinualLearner:
    return ContinualLearner(model="placement", tier="placement", registry=registry, bus=bus,
                            retrainer=ToyRetrainer(), features=(FeatureSpec("x", (Detector.ADWIN,)),),
                            out_dir=tmp_path / "out", who="learner@test",
                            settings=LearnerSettings(**settings), drift=DriftSettings(warmup_samples=50),
                            metrics=CollectorRegistry())


def test_learner_dead_letters_malformed_records_and_keeps_going(registry: ModelRegistry, redis_bus: StreamBus,
                                                                tmp_path: Path) -> None:
    learner = _learner(registry, redis_bus, tmp_path)
    good = ToyScenario(windows=3).records()
    redis_bus.publish(records_stream("placement"), good[0].model_dump_json().encode())
    redis_bus.publish(records_stream("placement"), b'{"model": "placement", "window": -1}')
    redis_bus.publish(records_stream("placement"), good[1].model_dump_json().encode())
    other = good[2].model_copy(update={"model": "routing"})
    redis_bus.publish(records_stream("placement"), other.model_dump_json().encode())
    assert learner.step() == 4
    assert learner.state.records == 2 and learner.state.dead_lettered == 2
    dead = redis_bus.read_range(records_stream("placement") + ":dead")
    assert len(dead) == 2 and b"window" in dead[0].payload
    assert redis_bus.pending(records_stream("placement"), "learner") == 0  # acknowledged after apply


def test_learner_retrains_on_schedule_and_refuses_evaluation_inside_the_training_window(
        registry: ModelRegistry, redis_bus: StreamBus, tmp_path: Path) -> None:
    learner = _learner(registry, redis_bus, tmp_path, retrain_every=40, min_train_windows=20)
    scenario = ToyScenario(windows=60, change_at=1000)
    stale = registry.register("placement", scenario.stale(tmp_path / "stale.json").path,
                              data_window=records_window(scenario.records()[:5]), train_command="toy", who="t")
    for state in (ModelState.SHADOW, ModelState.CANARY, ModelState.ACTIVE):
        registry.promote(stale.version_id, state, who="t", why="bootstrap")
    for record in scenario.records()[:45]:
        redis_bus.publish(records_stream("placement"), record.model_dump_json().encode())
    learner.step()
    assert len(learner.state.retrains) == 1
    retrain = learner.state.retrains[0]
    candidate = registry.get(str(retrain["version"]))
    assert candidate.state is ModelState.SHADOW and candidate.parent == stale.version_id
    assert retrain["train_end"] == 39  # due at window 39 (40 windows since none); 40-44 were not trained on
    assert candidate.data_window.digest == records_window(scenario.records()[:40]).digest
    for window in (39, 40):  # 39 was trained on: refused; 40 was not: fed to the gate
        evaluation = EvaluationRecord(model="placement", window=window, candidate=candidate.version_id,
                                      active=stale.version_id, candidate_outcomes={"unschedulable_pods": 1.0,
                                                                                   "gpu_fragmentation": 1.0},
                                      active_outcomes={"unschedulable_pods": 2.0, "gpu_fragmentation": 1.0})
        redis_bus.publish(evaluations_stream("placement"), evaluation.model_dump_json().encode())
    learner.step()
    assert learner.state.refused_evaluations == 1
    assert learner.evaluator is not None and learner.evaluator.last.decision == "hold"
    assert learner.comparing() == (candidate.version_id, stale.version_id)



def test_learner_recovers_when_redis_loses_its_streams_and_groups(registry: ModelRegistry, redis_bus: StreamBus,
                                                                  tmp_path: Path) -> None:
    """A Redis restarted without persistence has neither the streams nor the groups: the learner's next read
    recreates its group from the stream's start (the bus's NOGROUP rule), so nothing published after the
    restart is skipped, and nothing it applied before is applied twice."""
    learner = _learner(registry, redis_bus, tmp_path)
    records = ToyScenario(windows=3).records()
    redis_bus.publish(records_stream("placement"), records[0].model_dump_json().encode())
    assert learner.step() == 1
    redis_bus.delete(*learner.bus_streams())
    for record in records[1:]:
        redis_bus.publish(records_stream("placement"), record.model_dump_json().encode())
    assert learner.step() == 2
    assert [r.window for r in learner.window] == [0, 1, 2]


def test_entries_applied_before_a_failure_are_acknowledged_and_the_rest_stay_pending(
        registry: ModelRegistry, redis_bus: StreamBus, tmp_path: Path) -> None:
    """A retrain that raises something the learner does not handle stops the step at that record: the records
    before it are acknowledged (never applied twice), it and the ones after stay pending for a retry."""

    class Broken(ToyRetrainer):
        def train(self, records, *, parent, out, seed):  # type: ignore[no-untyped-def]
            raise KeyError("no GPU model table")

    learner = _learner(registry, redis_bus, tmp_path, retrain_every=3, min_train_windows=1)
    learner.retrainer = Broken()
    for record in ToyScenario(windows=6).records():
        redis_bus.publish(records_stream("placement"), record.model_dump_json().encode())
    with pytest.raises(KeyError, match="no GPU model table"):
        learner.step()
    assert learner.state.records == 3  # windows 0, 1, 2; the retrain at window 2 raised
    assert redis_bus.pending(records_stream("placement"), "learner") == 4  # window 2's, and windows 3-5 read but not applied
