"""What a tier declares to take part in continual learning and in ``meridian bench lifecycle``.

A tier implements :class:`TierLifecycle` next to its model and names a zero-argument factory for it in
``pyproject.toml``'s ``meridian.lifecycle`` entry-point group under the model's name (``placement``,
``routing``, ``autoscaling``), as it does for its checkpoint validator: the core finds tiers through the
group and never imports one.

* :class:`Retrainer` — trains a checkpoint from learning records alone (their ``data``), starting from a
  parent checkpoint when given. The learner passes only records of windows before the evaluation begins.
* :class:`RegimeScenario` — the benchmark's regime change for the tier, replayed window by window: the
  learning records a live tier would have published, each model's outcomes on every window (the simulator
  computes the counterfactual of any checkpoint), the stale model (trained before the change), the oracle
  (trained on the new regime from data the evaluation never sees) and sabotaged candidates.

Every checkpoint a tier writes here must pass its registry validator (the registry refuses it otherwise)
and differ byte for byte from every other (the registry refuses the same bytes twice).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from meridian.drift import FeatureSpec
from meridian.lifecycle.records import LearningRecord
from meridian.model_registry.gates import Tier

ENTRY_POINT_GROUP = "meridian.lifecycle"
SabotageKind = Literal["random", "wrong_regime"]


@dataclass(frozen=True)
class TrainedModel:
    """A checkpoint a retrainer wrote, with what the registry records about it."""

    path: Path
    train_command: str
    metrics: Mapping[str, float] = field(default_factory=dict)


class Retrainer(Protocol):
    """Trains the tier's model from learning records (deterministic for a seed)."""

    def train(self, records: Sequence[LearningRecord], *, parent: Path | None, out: Path,
              seed: int) -> TrainedModel: ...


class RegimeScenario(Protocol):
    """One regime change of the tier, as the bench replays it (see the module docstring).

    Windows are numbered 0 … ``windows - 1``; the new regime starts at ``change_at``. Outcome arrays hold one
    value per window, for each metric of the tier's gate (``TIER_METRICS``), lower is better.
    """

    name: str
    description: str
    windows: int
    change_at: int
    primary_metric: str  # the metric the stale / continual / oracle comparison is reported on

    def drift_features(self) -> tuple[FeatureSpec, ...]:
        """The drift detectors' features (names as in the records' ``features``)."""
        ...

    def records(self) -> list[LearningRecord]:
        """The learning records of every window in order, ``outcomes`` and ``served_by`` left empty (the bench
        fills them from the model that served each window)."""
        ...

    def outcomes(self, checkpoint: Path, windows: range) -> dict[str, np.ndarray]:
        """The tier's metrics of ``checkpoint`` on each window of ``windows`` (one value per window)."""
        ...

    def stale(self, out: Path) -> TrainedModel:
        """The model before the change: trained on old-regime data only."""
        ...

    def oracle(self, out: Path) -> TrainedModel:
        """A model trained on the new regime, from new-regime data that is not among the scenario's windows."""
        ...

    def sabotage(self, kind: SabotageKind, index: int, out: Path) -> TrainedModel:
        """A bad candidate: ``random`` weights, or one trained on the ``wrong_regime`` (each index distinct)."""
        ...


class TierLifecycle(Protocol):
    """A tier's part in continual learning."""

    model: str
    tier: Tier

    def retrainer(self) -> Retrainer: ...

    def scenario(self, *, quick: bool, seed: int) -> RegimeScenario:
        """The bench's regime change; ``quick``: a small one for tests (seconds, not minutes)."""
        ...


class UnknownTierLifecycleError(LookupError):
    def __init__(self, model: str, known: Sequence[str]) -> None:
        super().__init__(f"no tier declares continual learning for model {model!r} (declared: "
                         f"{', '.join(known) or 'none'}); a tier names its factory in pyproject.toml's "
                         f"{ENTRY_POINT_GROUP!r} entry-point group")


def declared_lifecycles() -> dict[str, Callable[[], TierLifecycle]]:
    """The tiers' declared lifecycle factories, by model name (loaded only when called)."""
    return {ep.name: ep.load for ep in entry_points(group=ENTRY_POINT_GROUP)}


def lifecycle_for(model: str) -> TierLifecycle:
    loaders = declared_lifecycles()
    if model not in loaders:
        raise UnknownTierLifecycleError(model, sorted(loaders))
    return loaders[model]()()
