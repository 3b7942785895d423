"""``meridian bench lifecycle``: each tier's regime change replayed through the live code paths — learning and
evaluation records on Redis streams, a :class:`~.learner.ContinualLearner` consuming them, the model registry
on Redis and the sequential gates — and what came of it (docs/model-lifecycle.md, "Continual learning").

Per scenario, in one run:

1. **Bootstrap.** The tier's stale model (trained on the old regime only) is registered and made active
   through the registry's own transitions (``bench:bootstrap`` in the audit).
2. **Replay.** Window by window, the bench plays the tier: it publishes the window's learning record with the
   outcome of the model the registry says is active, and while the learner evaluates a candidate, the paired
   evaluation record (the simulator computes the candidate's counterfactual on the same window, which is what
   a tier running the candidate in shadow reports). The learner consumes both streams after each window, as a
   live learner would, and drives drift alerts, retraining, registration, shadow, canary and activation.
3. **Report.** Drift alerts before the change are false alarms; the first at or after it gives the detection
   delay. The stale model, the continually retrained one (the last candidate the learner trained after the
   change), the oracle (trained on new-regime data the replay never shows) and the model that ends active are
   compared on the same windows: those after the retrained model's training window, which none of them was
   trained on.
4. **Sabotage.** ``injections`` candidates of each kind (random weights; trained on the wrong regime) are
   registered and evaluated one after the other on those windows against the active model, through the same
   streams and gates; every promotion to active is counted (and undone).
5. **Forced rollback.** A bad model of each kind is forced active by operator transitions; the rollback monitor
   watches it against the model it replaced, and the windows and decisions until its rollback and the damage
   done meanwhile (the tier's metrics, summed) are reported.

Outcomes of a checkpoint are computed by the scenario in chunks of ``chunk_windows`` from the first window
asked for and cached, so each of the ~45 models of a scenario is simulated once over the windows it is judged
on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry
from pydantic import BaseModel, Field

from meridian.bus import StreamBus
from meridian.drift import DriftSettings
from meridian.lifecycle.learner import ContinualLearner, LearnerSettings
from meridian.lifecycle.records import EvaluationRecord, LearningRecord, evaluations_stream, records_stream
from meridian.lifecycle.tiers import RegimeScenario, SabotageKind, TierLifecycle, TrainedModel
from meridian.model_registry.evaluation import OnlineEvaluator, Phase
from meridian.model_registry.gates import GateSettings, RollbackSettings, tier_gate, tier_rollback
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import DataWindow, ModelState

log = logging.getLogger(__name__)

Progress = Callable[[str, float, float], None]  # (what, done, total)
SABOTAGE_KINDS: tuple[SabotageKind, ...] = ("random", "wrong_regime")


class LifecycleBenchSettings(BaseModel):
    """What one ``bench lifecycle`` run does."""

    quick: bool = Field(False, description="Each tier's small scenario (seconds; for tests and a first look).")
    seed: int = Field(0, description="Seed of the scenarios and of the learners' retraining.")
    injections: int = Field(20, ge=0, description="Sabotaged candidates of each kind per scenario.")
    chunk_windows: int = Field(100, ge=1, description="Windows a checkpoint's outcomes are computed for at once.")
    learner: LearnerSettings = Field(default_factory=LearnerSettings)
    drift: DriftSettings = Field(default_factory=DriftSettings)
    gates: GateSettings = Field(default_factory=GateSettings)
    rollback: RollbackSettings = Field(default_factory=RollbackSettings)


class OutcomeCache:
    """Each checkpoint's per-window outcomes, computed forward in chunks from the first window asked for."""

    def __init__(self, scenario: RegimeScenario, chunk: int) -> None:
        self.scenario, self.chunk = scenario, chunk
        self._runs: dict[Path, tuple[int, dict[str, np.ndarray]]] = {}

    def get(self, checkpoint: Path, window: int) -> dict[str, float]:
        start, values = self._runs.get(checkpoint, (window, {}))
        have = len(next(iter(values.values()))) if values else 0
        if window < start:  # asked for an earlier window than its run began with: start the run again there
            start, values, have = window, {}, 0
        while window >= start + have:
            upto = min(self.scenario.windows, start + have + self.chunk)
            more = self.scenario.outcomes(checkpoint, range(start + have, upto))
            values = {k: np.concatenate([values.get(k, np.empty(0)), np.asarray(v, dtype=float)])
                      for k, v in more.items()}
            have = upto - start
        self._runs[checkpoint] = (start, values)
        return {k: float(v[window - start]) for k, v in values.items()}

    def mean(self, checkpoint: Path, windows: range) -> dict[str, float]:
        rows = [self.get(checkpoint, w) for w in windows]
        return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]} if rows else {}


@dataclass
class ScenarioRun:
    """One scenario's state while it is replayed."""

    lifecycle: TierLifecycle
    scenario: RegimeScenario
    registry: ModelRegistry
    bus: StreamBus
    learner: ContinualLearner
    cache: OutcomeCache
    out_dir: Path
    records: list[LearningRecord]
    progress: Progress
    served: list[float] = field(default_factory=list)
    _paths: dict[str, Path] = field(default_factory=dict)

    @property
    def model(self) -> str:
        return self.lifecycle.model

    def path_of(self, version_id: str) -> Path:
        """The version's checkpoint, digest-checked by the store the first time only: the replay asks for the
        active model's path every window, and re-hashing the same file each time checks nothing new."""
        if version_id not in self._paths:
            self._paths[version_id] = self.registry.artifact_path(version_id)
        return self._paths[version_id]

    def decisions(self, windows: range) -> int:
        return sum(self.records[w].decisions for w in windows)


def _register_active(run: ScenarioRun, trained: TrainedModel, *, who: str, why: str) -> str:
    """Register a checkpoint and move it to active through the registry's transitions."""
    first, last = run.records[0], run.records[-1]
    window = DataWindow(start=first.start, end=last.end)
    version = run.registry.register(run.model, trained.path, data_window=window, who=who, why=why,
                                    train_command=trained.train_command, metrics=dict(trained.metrics))
    for state in (ModelState.SHADOW, ModelState.CANARY, ModelState.ACTIVE):
        run.registry.promote(version.version_id, state, who=who, why=why)
    return version.version_id


def _publish_window(run: ScenarioRun, w: int) -> None:
    """Play the tier for window ``w``: its learning record, and the evaluation record while one is asked for."""
    active = run.registry.active(run.model)
    assert active is not None, "the bench bootstraps an active model before replaying"
    served = run.cache.get(run.path_of(active.version_id), w)
    run.served.append(served[run.scenario.primary_metric])
    record = run.records[w].model_copy(update={"served_by": active.version_id, "outcomes": served})
    run.bus.publish(records_stream(run.model), record.model_dump_json().encode())
    _publish_evaluation(run, w)


def _publish_evaluation(run: ScenarioRun, w: int) -> None:
    pair = run.learner.comparing()
    if pair is None:
        return
    candidate, compared_with = pair
    evaluation = EvaluationRecord(model=run.model, window=w, candidate=candidate, active=compared_with,
                                  candidate_outcomes=run.cache.get(run.path_of(candidate), w),
                                  active_outcomes=run.cache.get(run.path_of(compared_with), w),
                                  decisions=run.records[w].decisions)
    run.bus.publish(evaluations_stream(run.model), evaluation.model_dump_json().encode())


def replay(run: ScenarioRun) -> None:
    """Every window through the bus, the learner stepping after each."""
    total = run.scenario.windows
    for w in range(total):
        _publish_window(run, w)
        run.learner.step()
        if w % 10 == 0 or w == total - 1:
            run.progress(f"{run.scenario.name}: replay", w + 1, total)


def _drift_report(run: ScenarioRun) -> tuple[dict[str, Any] | None, int]:
    change = run.scenario.change_at
    alerts = run.learner.state.drift_alerts
    false_alarms = sum(1 for w, _ in alerts if w < change)
    after = [(w, a) for w, a in alerts if w >= change]
    if not after:
        return None, false_alarms
    w, alert = after[0]
    delay = {"windows": w - change, "decisions": run.decisions(range(change, w + 1)), "feature": alert.feature,
             "detector": str(alert.detector), "window": w}
    return delay, false_alarms


def _post_change_retrains(run: ScenarioRun) -> list[dict[str, Any]]:
    """The learner's retrains whose training window reached into the new regime, in order."""
    return [r for r in run.learner.state.retrains if int(r["train_end"]) >= run.scenario.change_at]


def _comparison(run: ScenarioRun, stale: Path, oracle: Path) -> dict[str, Any]:
    """Stale, oracle, the continually retrained model (the first retrain on new-regime data: the longest
    stretch of windows none of them was trained on) and the model that ends active, on the windows after that
    retrain's training window. Every later retrain is compared with the stale model on its own later windows."""
    s = run.scenario
    retrains = _post_change_retrains(run)
    first = retrains[0] if retrains else None
    start = int(first["train_end"]) + 1 if first else s.change_at
    windows = range(start, s.windows)
    final = run.registry.active(run.model)
    assert final is not None
    report: dict[str, Any] = {"eval_windows": [start, s.windows], "metric": s.primary_metric,
                              "stale": run.cache.mean(stale, windows), "oracle": run.cache.mean(oracle, windows),
                              "final_active": {"version": final.version_id,
                                               **run.cache.mean(run.path_of(final.version_id), windows)},
                              "served_after_change": float(np.mean(run.served[s.change_at:]))}
    report["continual"] = ({"version": first["version"], **run.cache.mean(run.path_of(str(first["version"])),
                                                                          windows)} if first else None)
    report["later_retrains"] = []
    for later in retrains[1:]:
        own = range(int(later["train_end"]) + 1, s.windows)
        if len(own):
            report["later_retrains"].append({"version": later["version"], "eval_windows": [own.start, own.stop],
                                             "retrained": run.cache.mean(run.path_of(str(later["version"])), own),
                                             "stale": run.cache.mean(stale, own)})
    return report


def _judging_windows(run: ScenarioRun) -> range:
    """Where sabotaged candidates are judged against the active model: the new regime's windows the active
    model was not trained on (after its training window when it is a retrain; from the change otherwise).
    A sabotaged candidate was trained on none of them."""
    active = run.registry.active(run.model)
    assert active is not None
    own = [int(r["train_end"]) for r in run.learner.state.retrains if r["version"] == active.version_id]
    return range(max([run.scenario.change_at, *(end + 1 for end in own)]), run.scenario.windows)


def _retrain_outcomes(run: ScenarioRun) -> list[dict[str, Any]]:
    """Each retrain with where the online evaluation left it (its state and the last audit reason)."""
    trail = run.registry.audit(run.model)
    out = []
    for retrain in run.learner.state.retrains:
        mine = [r for r in trail if r.version_id == retrain["version"]]
        out.append({**retrain, "state": run.registry.get(str(retrain["version"])).state.value,
                    "last_decision": mine[-1].why if mine else ""})
    return out


def evaluate_injected(run: ScenarioRun, version_id: str, windows: range, *, phase_active: bool = False,
                      replaced: str | None = None) -> tuple[OnlineEvaluator, int]:
    """Evaluate one injected version through the bus and the learner on ``windows``; (evaluator, windows fed)."""
    learner = run.learner
    evaluator = OnlineEvaluator(run.registry, run.model, version_id, tier_gate(run.lifecycle.tier, learner.gates),
                                tier_rollback(run.lifecycle.tier, learner.rollback), who="bench:sabotage")
    if phase_active:
        evaluator.replaced = replaced
    else:
        evaluator.enter_shadow(why="sabotage injection: a deliberately bad candidate")
    learner.evaluator, learner.train_end = evaluator, windows.start - 1
    fed = 0
    for w in windows:
        if evaluator.phase is Phase.DONE or (not phase_active and evaluator.phase is Phase.ACTIVE):
            break
        _publish_evaluation(run, w)
        learner.step()
        fed += 1
    learner.evaluator = None
    return evaluator, fed


def sabotage(run: ScenarioRun, windows: range, injections: int) -> dict[str, Any]:
    """``injections`` bad candidates of each kind, each judged by the gates; promotions are counted and undone."""
    report: dict[str, Any] = {}
    for kind in SABOTAGE_KINDS:
        counts = {"injected": 0, "promoted": 0, "reached_canary": 0, "rejected": 0, "undecided": 0}
        fed_to_reject: list[int] = []
        for i in range(injections):
            trained = run.scenario.sabotage(kind, i, run.out_dir / f"sabotage-{kind}-{i}.pt")
            version = run.registry.register(run.model, trained.path, who="bench:sabotage",
                                            data_window=DataWindow(start=run.records[0].start,
                                                                   end=run.records[-1].end),
                                            train_command=trained.train_command, why=f"sabotage: {kind} #{i}")
            evaluator, fed = evaluate_injected(run, version.version_id, windows)
            state = run.registry.get(version.version_id).state
            counts["injected"] += 1
            counts["reached_canary"] += int(state in (ModelState.CANARY, ModelState.ACTIVE)
                                            or evaluator.phase in (Phase.CANARY, Phase.ACTIVE))
            if state is ModelState.ACTIVE:
                counts["promoted"] += 1
                run.registry.rollback(run.model, who="bench:sabotage", why="undo a sabotaged promotion")
            elif state is ModelState.RETIRED:
                counts["rejected"] += 1
                fed_to_reject.append(fed)
            else:
                counts["undecided"] += 1
                run.registry.promote(version.version_id, ModelState.RETIRED, who="bench:sabotage",
                                     why="sabotage injection undecided when the windows ran out")
            run.progress(f"{run.scenario.name}: sabotage {kind}", i + 1, injections)
        report[kind] = {**counts, "windows_to_reject_median": float(np.median(fed_to_reject))
                        if fed_to_reject else None}
    return report


def forced_rollback(run: ScenarioRun, windows: range, index: int) -> dict[str, Any]:
    """A bad model of each kind forced active; how long until the monitor rolled it back, and the damage."""
    report: dict[str, Any] = {}
    for kind in SABOTAGE_KINDS:
        before = run.registry.active(run.model)
        assert before is not None
        trained = run.scenario.sabotage(kind, index, run.out_dir / f"forced-{kind}.pt")
        bad = _register_active(run, trained, who="bench:forced", why=f"forced active ({kind}) to measure rollback")
        evaluator, fed = evaluate_injected(run, bad, windows, phase_active=True, replaced=before.version_id)
        fed_windows = range(windows.start, windows.start + fed)
        bad_path, old_path = run.path_of(bad), run.path_of(before.version_id)
        bad_mean, old_mean = run.cache.mean(bad_path, fed_windows), run.cache.mean(old_path, fed_windows)
        excess = {k: bad_mean[k] - old_mean[k] for k in bad_mean}  # per window, in the metric's own unit
        rolled_back = run.registry.get(bad).state is ModelState.RETIRED
        if not rolled_back:  # the monitor did not decide within the windows left: undo by hand, say so
            run.registry.rollback(run.model, who="bench:forced", why="windows ran out before the monitor decided")
        report[kind] = {"rolled_back": rolled_back, "windows": fed, "decisions": run.decisions(fed_windows),
                        "bound_windows": run.learner.rollback.max_decisions,
                        "damage": {k: fed * v for k, v in excess.items()}, "damage_per_window": excess,
                        "decision": evaluator.last.decision}
    return report


def _checks(report: dict[str, Any]) -> dict[str, bool]:
    cmp, metric = report["comparison"], report["comparison"]["metric"]
    stale = cmp["stale"][metric]
    continual = cmp["continual"][metric] if cmp["continual"] else None
    return {
        "continual_beats_stale": continual is not None and continual < stale,
        "final_active_not_worse_than_stale": cmp["final_active"][metric] <= stale,
        "no_sabotage_promoted": all(v["promoted"] == 0 for v in report["sabotage_promotions"].values()),
        # the random-weights model is the "bad model forced active"; the subtly worse one is reported beside
        # it: a regression within the monitor's bound is, by design, not something it must undo quickly
        "bad_model_rolled_back_within_bound": (report["rollback_within"]["random"]["rolled_back"]
                                               and report["rollback_within"]["random"]["windows"]
                                               <= report["rollback_within"]["random"]["bound_windows"]),
        "at_most_one_false_alarm": report["false_alarms"] <= 1,
    }


def run_scenario(lifecycle: TierLifecycle, *, registry: ModelRegistry, bus: StreamBus, out_dir: Path,
                 settings: LifecycleBenchSettings, progress: Progress) -> dict[str, Any]:
    """One tier's scenario, end to end (see the module docstring); its report (``scenarios.<name>``)."""
    started = time.perf_counter()
    scenario = lifecycle.scenario(quick=settings.quick, seed=settings.seed)
    out_dir.mkdir(parents=True, exist_ok=True)
    learner = ContinualLearner(model=lifecycle.model, tier=lifecycle.tier, registry=registry, bus=bus,
                               retrainer=lifecycle.retrainer(), features=scenario.drift_features(),
                               out_dir=out_dir / "retrained", who=f"learner@bench-{scenario.name}",
                               settings=settings.learner.model_copy(update={"seed": settings.seed}),
                               gates=settings.gates, rollback=settings.rollback,
                               drift=settings.drift, metrics=CollectorRegistry())
    run = ScenarioRun(lifecycle, scenario, registry, bus, learner, OutcomeCache(scenario, settings.chunk_windows),
                      out_dir, scenario.records(), progress)
    progress(f"{scenario.name}: training the stale and oracle models", 0, 1)
    stale = scenario.stale(out_dir / "stale.pt")
    oracle = scenario.oracle(out_dir / "oracle.pt")
    _register_active(run, stale, who="bench:bootstrap", why="the model before the regime change")
    replay(run)
    delay, false_alarms = _drift_report(run)
    comparison = _comparison(run, stale.path, oracle.path)
    continual = comparison["continual"]
    judged = _judging_windows(run)
    report: dict[str, Any] = {
        "description": scenario.description, "windows": scenario.windows, "change_at": scenario.change_at,
        "detection_delay": delay, "false_alarms": false_alarms, "comparison": comparison,
        "stale": comparison["stale"][scenario.primary_metric], "oracle": comparison["oracle"][scenario.primary_metric],
        "continual": comparison["continual"][scenario.primary_metric] if continual else None,
        "retrains": _retrain_outcomes(run), "refused_evaluations": learner.state.refused_evaluations,
        "failed_retrains": learner.state.failed_retrains, "judged_windows": [judged.start, judged.stop],
    }
    report["sabotage_promotions"] = sabotage(run, judged, settings.injections)
    report["rollback_within"] = forced_rollback(run, judged, settings.injections)
    report["checks"] = _checks(report)
    report["seconds"] = round(time.perf_counter() - started, 1)
    return report


def run_lifecycle_bench(lifecycles: dict[str, TierLifecycle], *, redis_url: str, out_dir: Path,
                        settings: LifecycleBenchSettings, progress: Progress) -> dict[str, Any]:
    """Every named tier's scenario under a private key prefix of one Redis (removed afterwards); the JSON
    report (``scenarios.<name>``)."""
    import uuid

    from meridian.bus import open_bus, redis_client
    from meridian.bus.cleanup import delete_key_prefix
    from meridian.model_registry.registry import open_registry

    prefix = f"bench-lifecycle-{uuid.uuid4().hex[:8]}:"
    report: dict[str, Any] = {"settings": settings.model_dump(mode="json"), "scenarios": {}}
    try:
        for name, lifecycle in lifecycles.items():
            registry = open_registry(redis_url, artifacts_dir=out_dir / name / "artifacts", key_prefix=prefix)
            bus = open_bus(redis_url, key_prefix=prefix)
            try:
                report["scenarios"][name] = run_scenario(lifecycle, registry=registry, bus=bus,
                                                         out_dir=out_dir / name, settings=settings,
                                                         progress=progress)
            finally:
                registry.close()
                bus.close()
    finally:
        client = redis_client(redis_url)
        delete_key_prefix(client, prefix)
        client.close()
    return report
