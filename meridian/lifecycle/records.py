"""What a tier publishes for learning, one record per decision window, on ``meridian:learn:{<model>}:records``.

A **learning record** is one window of one source (a cluster, a deployment, the federation): the inputs the
drift detectors watch (``features``), the tier's outcome metrics of the model that served the window
(``outcomes``, named as in :data:`meridian.model_registry.gates.TIER_METRICS`) and the training inputs the
tier's retrainer reads (``data``: the pods requested, the request rate per minute, each region's carbon
intensity — whatever that tier's model is trained on, in the shape the tier declares). The learner keeps a
window of these and retrains from them alone, so the bench and a live deployment train the same way.

An **evaluation record** is one window's paired outcome of a candidate and the active model on the same
decisions (shadow: the candidate's counterfactual; canary: each arm's matched window), published by
whoever can compute it (the tier running the candidate in shadow, or the bench's simulator), and fed to the
candidate's online evaluator.

Both travel as JSON (pydantic models): they are read by the learner in Python only, a few per minute per
source, and an operator can read them with ``redis-cli XRANGE``.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from meridian.model_registry.versions import ModelName

DataValue = list[float] | list[list[float]] | list[str]


def records_stream(model: str) -> str:
    """The stream of a model's learning records (the model as hash tag: one slot per model in a cluster)."""
    return f"meridian:learn:{{{model}}}:records"


def evaluations_stream(model: str) -> str:
    """The stream of a model's evaluation records."""
    return f"meridian:learn:{{{model}}}:evaluations"


class LearningRecord(BaseModel):
    """One decision window of one source, as the learner consumes it."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName
    window: int = Field(ge=0, description="The window's sequence number at its source: increasing, gap-free "
                        "when nothing is lost; the learner's training and evaluation windows are ranges of it.")
    start: datetime = Field(description="When the window began (UTC).")
    end: datetime = Field(description="When the window ended (UTC).")
    source: str = Field(min_length=1, max_length=253, description="The cluster, deployment or federation.")
    decisions: int = Field(ge=0, description="Decisions in the window (placements, routed workloads, scaling "
                           "steps): the unit of the rollback bound.")
    served_by: str = Field("", description="The version that served the window; empty when unknown.")
    features: dict[str, list[float]] = Field(default_factory=dict, description="Drift inputs observed in the "
                                             "window, feature → samples in time order.")
    outcomes: dict[str, float] = Field(default_factory=dict, description="The served model's tier metrics "
                                       "in the window (lower is better).")
    data: dict[str, DataValue] = Field(default_factory=dict, description="Training inputs of the tier's "
                                       "retrainer, in the shape the tier declares.")


class EvaluationRecord(BaseModel):
    """One window's paired outcome of a candidate and the active model, per metric."""

    model_config = ConfigDict(extra="forbid")

    model: ModelName
    window: int = Field(ge=0)
    candidate: str = Field(description="The candidate version judged.")
    active: str = Field(description="The version it is compared with (the active one, or the one it replaced).")
    candidate_outcomes: dict[str, float]
    active_outcomes: dict[str, float]
    decisions: int = Field(1, ge=0)
    agreed: float | None = Field(None, ge=0, le=1, description="Share of the window's decisions on which the "
                                 "two models decided alike, when known.")


def drift_stream(model: str) -> str:
    """The stream of a model's drift alerts (an event per alert, beside its metric and log line)."""
    return f"meridian:learn:{{{model}}}:drift"


class DriftEvent(BaseModel):
    """A drift alert as a bus event: which feature drifted, by which detector, at which sample and window."""

    model_config = ConfigDict(extra="forbid")

    model: str
    feature: str
    detector: str
    sample_index: int
    window: int | None = None
    value: float
    at: datetime
