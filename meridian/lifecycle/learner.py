"""The continual learner of one model: consume the records a tier publishes, watch drift, retrain on a recent
window, register the result as a candidate and take it through online evaluation (shadow → canary → active,
and rollback) on the evaluation records that follow.

Why it is built this way:

* **Through the bus, acknowledged after apply.** Records arrive on the model's stream
  (:func:`~.records.records_stream`) through a consumer group, so a learner that dies leaves its unapplied
  records pending for the next (``XAUTOCLAIM``), and two learners of one model share the work instead of
  training twice on the same window. A record that does not parse is dead-lettered with the reason and
  acknowledged: one malformed record never stops learning.
* **Retrain when there is a reason.** Drift on a watched feature (:class:`~meridian.drift.DriftMonitor`)
  schedules a retrain ``post_drift_windows`` later, so the training window holds enough of the new regime;
  ``retrain_every`` adds a schedule for changes no detector sees. A retrain never starts while a candidate is
  being evaluated: its evidence would be split between two candidates.
* **Training data never contains its evaluation window.** A candidate is trained on records up to window
  ``train_end`` and judged only on evaluation records of later windows; an evaluation record of an earlier
  window is refused (counted in ``refused_evaluations`` and logged), never fed to the gate.
* **Lineage.** Each candidate is registered with the active version as parent, the training window's first
  and last record times and the sha256 of the records it was trained on, and the retrainer's command.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client import REGISTRY, CollectorRegistry
from pydantic import BaseModel, Field, ValidationError

from meridian.bus import StreamBus, StreamEntry
from meridian.drift import DriftAlert, DriftMonitor, DriftSettings, FeatureSpec
from meridian.lifecycle.drift_events import BusDriftPublisher
from meridian.lifecycle.records import EvaluationRecord, LearningRecord, evaluations_stream, records_stream
from meridian.lifecycle.tiers import Retrainer
from meridian.model_registry.evaluation import OnlineEvaluator, Phase
from meridian.model_registry.gates import GateSettings, RollbackSettings, Tier, tier_gate, tier_rollback
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import DataWindow, ModelVersion

log = logging.getLogger(__name__)


class LearnerSettings(BaseModel):
    """When and on what the learner retrains."""

    train_windows: int = Field(200, ge=1, description="Most recent windows a retrain reads (per source): a "
                               "recent window, so the model follows the current regime rather than averaging "
                               "it with the old one.")
    min_train_windows: int = Field(50, ge=1, description="Fewest records a retrain needs; fewer and the trigger "
                                   "waits for more.")
    post_drift_windows: int = Field(100, ge=0, description="Windows collected after a drift alert before the "
                                    "retrain, so the training window holds enough of the new regime.")
    drift_lookback_windows: int = Field(0, ge=0, description="Windows before the alert the retrain may still "
                                        "read (the detectors fire some windows after a change; 0 trains only on "
                                        "what came after the alert).")
    retrain_every: int | None = Field(None, ge=1, description="Retrain on a schedule too, every n windows "
                                      "since the last retrain; None: only on drift (or on demand).")
    seed: int = Field(0, description="Seed of the first retrain; each later one adds its ordinal.")
    group: str = Field("learner", description="Consumer group of the learners of one model.")
    consumer: str = Field("learner-1", description="This learner's consumer name in the group.")
    read_count: int = Field(500, ge=1, description="Records read per round trip.")
    claim_idle_ms: int = Field(60_000, ge=1, description="A dead learner's pending records are claimed after "
                               "this long idle.")


@dataclass
class LearnerState:
    """What the learner has done, for the bench's report and the service's progress line."""

    records: int = 0
    dead_lettered: int = 0
    failed_retrains: int = 0
    refused_evaluations: int = 0
    retrains: list[dict[str, object]] = field(default_factory=list)
    drift_alerts: list[tuple[int, DriftAlert]] = field(default_factory=list)  # (window, alert)


class ContinualLearner:
    """One model's learner (see the module docstring). ``who`` signs its registrations and transitions; drift
    alerts are counted in ``metrics`` (a benchmark passes its own registry), logged and published on the bus."""

    def __init__(self, *, model: str, tier: Tier, registry: ModelRegistry, bus: StreamBus, retrainer: Retrainer,
                 features: Sequence[FeatureSpec], out_dir: Path, who: str,
                 settings: LearnerSettings | None = None, gates: GateSettings | None = None,
                 rollback: RollbackSettings | None = None, drift: DriftSettings | None = None,
                 metrics: CollectorRegistry = REGISTRY) -> None:
        self.model, self.tier, self.registry, self.bus = model, tier, registry, bus
        self.retrainer, self.out_dir, self.who = retrainer, Path(out_dir), who
        self.settings = settings or LearnerSettings()
        self.gates, self.rollback = gates or GateSettings(), rollback or RollbackSettings()
        self.drift_events = BusDriftPublisher(bus, model)
        self.drift = DriftMonitor(model, features, settings=drift, publish=self.drift_events, registry=metrics)
        self.state = LearnerState()
        self.window: deque[LearningRecord] = deque(maxlen=self.settings.train_windows)
        self.evaluator: OnlineEvaluator | None = None
        self.train_end = -1  # last window the current candidate was trained on
        self._retrain_at: int | None = None
        self._last_retrain_window = -1
        self._streams = (records_stream(model), evaluations_stream(model))
        self.ensure_groups()

    def ensure_groups(self) -> None:
        """Create the consumer groups if they are missing (a new stream, or a Redis restarted without them)."""
        for stream in self._streams:
            self.bus.ensure_group(stream, self.settings.group)

    def bus_streams(self) -> tuple[str, str]:
        """The learning and evaluation streams this learner consumes."""
        return self._streams

    # ------------------------------------------------------------------ consuming
    def step(self, *, block_ms: int | None = None) -> int:
        """Apply what is on both streams (a dead learner's pending entries first); the entries applied."""
        applied = 0
        for stream, apply in zip(self._streams, (self._apply_record, self._apply_evaluation), strict=True):
            s = self.settings
            entries = self.bus.claim_stale(stream, s.group, s.consumer, min_idle_ms=s.claim_idle_ms,
                                           count=s.read_count)
            entries += self.bus.read_group(stream, s.group, s.consumer, count=s.read_count, block_ms=block_ms)
            done: list[str] = []
            try:
                for entry in entries:
                    self._apply_entry(stream, entry, apply)
                    done.append(entry.entry_id)
            finally:  # what was applied is acknowledged even when a later entry raises (e.g. Redis went away)
                if done:
                    self.bus.ack(stream, s.group, done)
            applied += len(done)
        return applied

    def _apply_entry(self, stream: str, entry: StreamEntry, apply: Callable[[bytes], None]) -> None:
        try:
            apply(entry.payload)
        except (ValidationError, ValueError) as exc:
            self.state.dead_lettered += 1
            self.bus.dead_letter(stream, entry, reason=f"not a valid {stream} entry: {exc}"[:500],
                                 group=self.settings.group, consumer=self.settings.consumer)
            log.warning("learner %s dead-lettered %s entry %s: %s", self.model, stream, entry.entry_id, exc)

    def _apply_record(self, payload: bytes) -> None:
        record = LearningRecord.model_validate_json(payload)
        if record.model != self.model:
            raise ValueError(f"a record of model {record.model!r} on the stream of {self.model!r}")
        self.observe(record)

    def _apply_evaluation(self, payload: bytes) -> None:
        record = EvaluationRecord.model_validate_json(payload)
        if record.model != self.model:
            raise ValueError(f"an evaluation of model {record.model!r} on the stream of {self.model!r}")
        self.evaluate(record)

    # ------------------------------------------------------------------ learning
    def observe(self, record: LearningRecord) -> None:
        """One learning record: keep it for training, feed drift, retrain when due."""
        self.state.records += 1
        self.window.append(record)
        self.drift_events.window = record.window
        for name in self.drift.features:
            for alert in self.drift.update_many(name, record.features.get(name, ())):
                self.state.drift_alerts.append((record.window, alert))
                if self._retrain_at is None:
                    self._retrain_at = record.window + self.settings.post_drift_windows
        self._retrain_if_due(record.window)

    def _due(self, window: int) -> bool:
        s = self.settings
        scheduled = s.retrain_every is not None and window - self._last_retrain_window >= s.retrain_every
        return scheduled or (self._retrain_at is not None and window >= self._retrain_at)

    def _retrain_if_due(self, window: int) -> None:
        busy = self.evaluator is not None and self.evaluator.phase is not Phase.DONE
        if busy or not self._due(window):
            return
        lookback = self._training_start()
        records = [r for r in self.window if r.window >= lookback]
        if len(records) < self.settings.min_train_windows:
            return
        why = "drift" if self._retrain_at is not None else "schedule"
        try:
            self.retrain(records, why=why)
        except (ValueError, RuntimeError, OSError) as exc:  # a failed retrain must not stop consuming
            self.state.failed_retrains += 1
            self._retrain_at, self._last_retrain_window = None, window
            log.error("learner %s: retrain on windows %d-%d (%s) failed, waiting for the next trigger: %s",
                      self.model, records[0].window, records[-1].window, why, exc)

    def _training_start(self) -> int:
        if self._retrain_at is None:
            return -1
        alert_window = self._retrain_at - self.settings.post_drift_windows
        return alert_window - self.settings.drift_lookback_windows

    def retrain(self, records: Sequence[LearningRecord] | None = None, *, why: str = "on demand") -> ModelVersion:
        """Train on ``records`` (default: the kept window), register a candidate and start its shadow."""
        records = list(records if records is not None else self.window)
        if not records:
            raise ValueError(f"no learning records of {self.model} to train on")
        active = self.registry.active(self.model)
        parent = self.registry.artifact_path(active.version_id) if active else None
        ordinal = len(self.state.retrains)
        started = time.perf_counter()
        out = self.out_dir / f"{self.model}-retrain-{ordinal}-w{records[-1].window}.pt"
        out.parent.mkdir(parents=True, exist_ok=True)
        trained = self.retrainer.train(records, parent=parent, out=out, seed=self.settings.seed + ordinal)
        version = self.registry.register(
            self.model, trained.path, data_window=records_window(records), train_command=trained.train_command,
            metrics=dict(trained.metrics), parent=active.version_id if active else None, who=self.who,
            why=f"continual learning ({why}): windows {records[0].window}-{records[-1].window}",
            evidence={"trigger": why, "records": len(records), "first_window": records[0].window,
                      "last_window": records[-1].window})
        self.train_end = records[-1].window
        self._retrain_at, self._last_retrain_window = None, records[-1].window
        self.evaluator = self._evaluator_for(version.version_id)
        self.evaluator.enter_shadow(why=f"continual learning: shadow {active.version_id if active else 'none'}")
        self.state.retrains.append({"version": version.version_id, "trigger": why, "records": len(records),
                                    "first_window": records[0].window, "train_end": self.train_end,
                                    "seconds": round(time.perf_counter() - started, 2)})
        log.info("learner %s: registered %s (trained on windows %d-%d, %s) and started its shadow", self.model,
                 version.version_id, records[0].window, records[-1].window, why)
        return version

    def _evaluator_for(self, version_id: str) -> OnlineEvaluator:
        return OnlineEvaluator(self.registry, self.model, version_id, tier_gate(self.tier, self.gates),
                               tier_rollback(self.tier, self.rollback), who=self.who)

    # ------------------------------------------------------------------ evaluating
    def comparing(self) -> tuple[str, str] | None:
        """(candidate, the version it is compared with) while an evaluation runs: what a tier running the
        candidate beside the active model needs to know to publish evaluation records."""
        ev = self.evaluator
        if ev is None or ev.phase in (Phase.DONE, Phase.CANDIDATE):
            return None
        if ev.phase is Phase.ACTIVE:
            return (ev.candidate_version, ev.replaced) if ev.replaced else None
        active = self.registry.active(self.model)
        return (ev.candidate_version, active.version_id) if active else None

    def evaluate(self, record: EvaluationRecord) -> None:
        """One paired evaluation window, fed to the candidate's evaluator (refused when it is not after the
        candidate's training window, or is of another candidate)."""
        ev = self.evaluator
        if ev is None or ev.phase is Phase.DONE or record.candidate != ev.candidate_version:
            return
        if record.window <= self.train_end:
            self.state.refused_evaluations += 1
            log.warning("learner %s refused evaluation window %d of %s: it is inside the training window "
                        "(up to %d)", self.model, record.window, record.candidate, self.train_end)
            return
        ev.observe(record.candidate_outcomes, record.active_outcomes,
                   agreed=None if record.agreed is None else record.agreed >= 0.5)


def records_window(records: Sequence[LearningRecord]) -> DataWindow:
    """The data window of a retrain: its first and last record times and the sha256 of the records."""
    digest = hashlib.sha256()
    for record in records:
        digest.update(record.model_dump_json().encode())
    return DataWindow(start=min(r.start for r in records), end=max(r.end for r in records),
                      digest=digest.hexdigest())

