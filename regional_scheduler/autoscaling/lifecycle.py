"""The autoscaling tier's part in continual learning (``meridian bench lifecycle --scenarios autoscaling``).

* :class:`AutoscalingRetrainer` fine-tunes the DQN from learning records alone: it rebuilds the
  deployment's request series from the records' ``data`` (:mod:`.lifecycle_records`), the service and
  its causal forecast from that series (:mod:`.lifecycle_replay`), and trains on the newest
  ``recent_minutes`` of it, the older minutes only giving the forecast its history.
* :class:`~.lifecycle_scenario.AutoscalingRegimeScenario` switches the deployment's traffic from one
  shared request series to another (:mod:`.lifecycle_scenario`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from meridian.lifecycle.records import LearningRecord
from meridian.lifecycle.tiers import TrainedModel
from meridian.model_registry.gates import Tier
from regional_scheduler.autoscaling.dqn.checkpoint import load_checkpoint, save_checkpoint
from regional_scheduler.autoscaling.lifecycle_records import MODEL, RecordsError, deployment_from_records
from regional_scheduler.autoscaling.lifecycle_replay import deployment_scenario, train_on_stretch
from regional_scheduler.autoscaling.lifecycle_scenario import (
    DEFAULT_REGIME,
    QUICK_REGIME,
    AutoscalingRegimeScenario,
)

STEPS_PER_MINUTE = 4
MIN_STEPS, MAX_STEPS = 1_000, 6_000
MIN_MINUTES = 60


class AutoscalingRetrainer:
    """Fine-tunes the parent DQN (a fresh one without a parent) on the newest minutes of the records.

    :param recent_minutes: newest minutes trained on: after a drift alert the newest minutes are the
        regime to fit; older ones only feed the forecast's history.
    :param steps_per_minute: DQN steps per trained minute (each step is one simulated minute), so a
        retrain visits every minute a few times whatever the learner hands it, bounded by
        ``min_steps`` and ``max_steps`` (6,000 steps: ~15 s on a free core).
    :param violation_penalty: the reward's penalty per SLO-violation minute, the shipped checkpoint's.
    :param learning_rate: Adam step size of the fine-tune.
    :param initial_epsilon: exploration at the start of a fine-tune (a fresh network starts at 1): the
        parent's action values are roughly right, so it explores to correct them, not from scratch.
    """

    def __init__(self, *, recent_minutes: int = 2 * 1440, steps_per_minute: int = STEPS_PER_MINUTE,
                 min_steps: int = MIN_STEPS, max_steps: int = MAX_STEPS,
                 violation_penalty: float = 3.0, learning_rate: float = 1e-3,
                 initial_epsilon: float = 0.3) -> None:
        self.recent_minutes = recent_minutes
        self.violation_penalty = violation_penalty
        self.learning_rate, self.initial_epsilon = learning_rate, initial_epsilon
        self.steps_per_minute = steps_per_minute
        self.min_steps, self.max_steps = min_steps, max_steps

    def train(self, records: Sequence[LearningRecord], *, parent: Path | None, out: Path,
              seed: int) -> TrainedModel:
        deployment = deployment_from_records(records)
        first = max(0, deployment.minutes - self.recent_minutes)
        trained = deployment.minutes - first
        if trained < MIN_MINUTES:
            raise RecordsError(f"{trained} minutes of {deployment.name} in the records; a retrain needs "
                               f"{MIN_MINUTES} (episodes of half the minutes)")
        steps = min(max(self.steps_per_minute * trained, self.min_steps), self.max_steps)
        network = train_on_stretch(
            deployment_scenario(deployment), first_minute=first, steps=steps, seed=seed,
            parent=None if parent is None else load_checkpoint(Path(parent))[0],
            violation_penalty=self.violation_penalty, learning_rate=self.learning_rate,
            initial_epsilon=self.initial_epsilon)
        windows = sorted(r.window for r in records if r.source == deployment.name)
        save_checkpoint(Path(out), network, {
            "role": "retrain", "source": deployment.name, "seed": seed, "windows": [windows[0], windows[-1]],
            "steps": steps, "trained_minutes": trained})
        return TrainedModel(Path(out), train_command=(
            f"AutoscalingRetrainer(recent_minutes={self.recent_minutes}, max_steps={self.max_steps})"
            f".train({deployment.name} windows {windows[0]}-{windows[-1]}, parent="
            f"{'none' if parent is None else Path(parent).name}, seed={seed})"),
            metrics={"steps": float(steps), "trained_minutes": float(trained)})


class AutoscalingLifecycle:
    """The autoscaling DQN's continual learning: its retrainer and its regime change."""

    model = MODEL
    tier: Tier = "autoscaling"

    def retrainer(self) -> AutoscalingRetrainer:
        return AutoscalingRetrainer()

    def scenario(self, *, quick: bool, seed: int) -> AutoscalingRegimeScenario:
        return AutoscalingRegimeScenario(QUICK_REGIME if quick else DEFAULT_REGIME, seed=seed)
