"""What the registry knows about a model version, and which state changes are allowed.

A version is one checkpoint of one of Meridian's three learned models with its lineage (parent version,
training data window and its digest, training command), its validation metrics, the digest and size of its
artifact and the feature layout its tier's validator read from it. Its ``state`` moves along

    candidate → shadow → canary → active → retired

one step at a time (:data:`ALLOWED_TRANSITIONS`); any version that is not active may be retired. Promoting a
canary to active retires the version that was active, so a model has at most one active version, and
exactly one once any was activated. A rollback (:data:`ROLLBACK_TRANSITIONS`) retires the active version and
re-activates the one that was active before it, the only way back from ``retired``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ModelName = Literal["placement", "routing", "autoscaling"]
MODEL_NAMES: tuple[str, ...] = get_args(ModelName)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_VERSION_ID = re.compile(r"^(placement|routing|autoscaling)-v[1-9][0-9]*$")


class ModelState(StrEnum):
    CANDIDATE = "candidate"
    SHADOW = "shadow"
    CANARY = "canary"
    ACTIVE = "active"
    RETIRED = "retired"


S = ModelState
#: from state -> the states an operator may promote (or retire) a version to.
ALLOWED_TRANSITIONS: dict[ModelState, frozenset[ModelState]] = {
    S.CANDIDATE: frozenset({S.SHADOW, S.RETIRED}),
    S.SHADOW: frozenset({S.CANARY, S.RETIRED}),
    S.CANARY: frozenset({S.ACTIVE, S.RETIRED}),
    # The active version is retired only by its successor's activation or by a rollback, never alone:
    # a model that had an active version always keeps one.
    S.ACTIVE: frozenset(),
    S.RETIRED: frozenset(),
}
#: What a rollback does, and only a rollback: the active version is retired, the previous one re-activated.
ROLLBACK_TRANSITIONS: frozenset[tuple[ModelState, ModelState]] = frozenset({(S.ACTIVE, S.RETIRED),
                                                                            (S.RETIRED, S.ACTIVE)})
#: The ``from_state`` recorded for a version's registration (it had no state before).
REGISTERED_FROM = "none"


class ModelRegistryError(Exception):
    """A registry operation that cannot be done; the message says why and what to do."""


class UnknownModelError(ModelRegistryError, ValueError):
    def __init__(self, model: str) -> None:
        super().__init__(f"unknown model {model!r}; the models are {', '.join(MODEL_NAMES)}")


class UnknownVersionError(ModelRegistryError, LookupError):
    def __init__(self, version_id: str, known: list[str] | None = None) -> None:
        listed = f"; known: {', '.join(known)}" if known else ""
        super().__init__(f"unknown model version {version_id!r}{listed}")


class ForbiddenTransitionError(ModelRegistryError):
    """A state change the transition table does not allow."""

    def __init__(self, version_id: str, from_state: str, to_state: str, *, hint: str = "") -> None:
        known = {s.value: s for s in ModelState}
        allowed = sorted(ALLOWED_TRANSITIONS[known[from_state]]) if from_state in known else []
        options = ", ".join(allowed) if allowed else "none"
        extra = f"; {hint}" if hint else ""
        super().__init__(f"{version_id} cannot go from {from_state} to {to_state} (from {from_state}: "
                         f"{options}){extra}")
        self.version_id, self.from_state, self.to_state = version_id, from_state, to_state


def check_transition(version_id: str, from_state: ModelState, to_state: ModelState) -> None:
    """Raise :class:`ForbiddenTransitionError` unless an operator may move a version ``from_state → to_state``."""
    if to_state in ALLOWED_TRANSITIONS[from_state]:
        return
    hint = ""
    if from_state is S.ACTIVE and to_state is S.RETIRED:
        hint = "an active version is retired by activating another or by `meridian models rollback`"
    elif from_state is S.RETIRED and to_state is S.ACTIVE:
        hint = "a retired version comes back only by `meridian models rollback` of its successor"
    elif to_state is S.ACTIVE:
        hint = "a version becomes active from canary (candidate → shadow → canary → active)"
    raise ForbiddenTransitionError(version_id, from_state.value, to_state.value, hint=hint)


def checked_model(model: str) -> ModelName:
    if model not in MODEL_NAMES:
        raise UnknownModelError(model)
    return model  # type: ignore[return-value]


def model_of(version_id: str) -> ModelName:
    """The model a version id belongs to (``placement-v3`` → ``placement``)."""
    if not _VERSION_ID.match(version_id):
        raise UnknownVersionError(version_id)
    return version_id.rsplit("-v", 1)[0]  # type: ignore[return-value]


def version_id_for(model: str, number: int) -> str:
    return f"{checked_model(model)}-v{number}"


class DataWindow(BaseModel):
    """The training data: the time window it covers and a digest of what was read (``sha256`` hex)."""

    model_config = ConfigDict(frozen=True)

    start: datetime
    end: datetime
    digest: str = Field("", description="sha256 hex of the training data; empty when not recorded")

    @field_validator("digest")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if value and not _SHA256.match(value):
            raise ValueError("the data digest is 64 lower-case hex digits (sha256)")
        return value

    @model_validator(mode="after")
    def _ordered(self) -> DataWindow:
        if self.end < self.start:
            raise ValueError(f"the data window ends ({self.end.isoformat()}) before it starts "
                             f"({self.start.isoformat()})")
        return self

    @classmethod
    def parse(cls, text: str, digest: str = "") -> DataWindow:
        """``START/END`` in ISO 8601 (``2026-11-01/2026-11-29T12:00Z``); a date alone means midnight UTC."""
        start, sep, end = text.partition("/")
        if not sep or not start or not end:
            raise ValueError(f"data window {text!r} is not START/END (ISO 8601, e.g. 2026-11-01/2026-11-29)")
        return cls(start=_utc(start), end=_utc(end), digest=digest)


def _utc(text: str) -> datetime:
    moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


class ModelVersion(BaseModel):
    """One registered checkpoint of one model (stored as JSON in the model's ``versions`` hash)."""

    model_config = ConfigDict(frozen=True)

    model: ModelName
    version_id: str
    parent: str | None = Field(None, description="the version this one was trained from (lineage); None for a root")
    data_window: DataWindow
    train_command: str = Field(description="the command that produced the checkpoint, as run")
    metrics: dict[str, float] = Field(default_factory=dict, description="validation metrics, by name")
    created_at: datetime
    state: ModelState = ModelState.CANDIDATE
    artifact_digest: str = Field(description="sha256 hex of the checkpoint file (its address in the artifact store)")
    artifact_size_bytes: int = Field(ge=0)
    feature_layout: dict[str, Any] = Field(default_factory=dict,
                                           description="the layout summary the tier's validator read from the file")
    registered_by: str = ""

    @field_validator("artifact_digest")
    @classmethod
    def _hex(cls, value: str) -> str:
        if not _SHA256.match(value):
            raise ValueError("the artifact digest is 64 lower-case hex digits (sha256)")
        return value

    @model_validator(mode="after")
    def _id_names_model(self) -> ModelVersion:
        if not _VERSION_ID.match(self.version_id) or model_of(self.version_id) != self.model:
            raise ValueError(f"version id {self.version_id!r} is not <model>-v<n> of model {self.model}")
        return self

    @property
    def number(self) -> int:
        return int(self.version_id.rsplit("-v", 1)[1])


class TransitionRecord(BaseModel):
    """One audited state change: what the ``…:audit`` stream holds and the bus event carries."""

    model_config = ConfigDict(frozen=True)

    model: ModelName
    version_id: str
    from_state: str
    to_state: str
    who: str
    why: str
    at: datetime
    evidence: dict[str, Any] = Field(default_factory=dict)
