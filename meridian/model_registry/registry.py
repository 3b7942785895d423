"""The model registry: versions of the three learned models, their states and every change to them.

Design
------
* Metadata lives in the bus's Redis under ``meridian:models:{<model>}:…`` (:mod:`.keys`); artifacts in an
  :class:`~meridian.model_registry.artifacts.ArtifactStore`, addressed by their sha256.
* ``register`` stores the file, reads it back through the store (which checks the digest), has the tier's
  validator load it (:mod:`.validators`) and only then writes the version, as a ``candidate``.
* Every change of state is one optimistic transaction: ``WATCH`` the model's keys, read, check the
  transition table (:mod:`.versions`), then ``MULTI`` … ``EXEC`` the new states, the active pointer, the
  activation history and the audit entries together. Two operators promoting at once: one ``EXEC`` wins, the
  other sees its ``WATCH`` broken, reads again and is judged against the new state, so a model never has two
  active versions and no transition is judged on stale data.
* After the transaction each transition is published on the bus (``meridian:models:events``, a
  ``ModelTransition`` protobuf) and counted in ``meridian_model_transitions_total``.

Hazards
-------
* The audit stream is written in the transaction; the bus event after it. A bus that is down loses the
  event (logged), never the audit entry.
* A registration that fails after its artifact was stored leaves the file in the store: harmless, as files
  are addressed by content and a later registration of the same bytes reuses it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from prometheus_client import Counter

from meridian.bus.base import BusError, StreamBus
from meridian.model_registry.artifacts import ArtifactStore
from meridian.model_registry.keys import ACTIVATION_HISTORY_KEPT, EVENTS_STREAM, ModelKeys
from meridian.model_registry.validators import CheckpointValidator, validated_layout, validator_for
from meridian.model_registry.versions import (
    MODEL_NAMES,
    REGISTERED_FROM,
    ROLLBACK_TRANSITIONS,
    DataWindow,
    ModelRegistryError,
    ModelState,
    ModelVersion,
    TransitionRecord,
    UnknownVersionError,
    check_transition,
    checked_model,
    model_of,
    version_id_for,
)

log = logging.getLogger(__name__)

TRANSITIONS = Counter("meridian_model_transitions_total",
                      "State changes of model versions in the registry (from_state 'none': a registration).",
                      ["model", "from_state", "to_state"])
#: Bus events of transitions kept (the audit stream keeps every one).
EVENTS_MAXLEN = 10_000
_REDIS_DOWN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError)


class RegistryUnavailableError(ModelRegistryError):
    """The registry's Redis cannot be reached."""


class NothingToRollBackError(ModelRegistryError):
    """The model has no active version, or none was active before it."""


class ActiveVersionChangedError(ModelRegistryError):
    """A rollback meant for one active version found another active (someone activated or rolled back since)."""


@dataclass
class _Plan:
    """What one transaction writes: new version records, the active pointer and history, audit records."""

    versions: dict[str, ModelVersion] = field(default_factory=dict)
    records: list[TransitionRecord] = field(default_factory=list)
    active: str | None = None
    push_history: str | None = None
    pop_history: bool = False
    sequence: int | None = None

    def move(self, version: ModelVersion, to_state: ModelState, *, who: str, why: str,
             evidence: Mapping[str, Any], from_state: str | None = None) -> ModelVersion:
        moved = version.model_copy(update={"state": to_state})
        self.versions[moved.version_id] = moved
        self.records.append(TransitionRecord(
            model=version.model, version_id=version.version_id, from_state=from_state or version.state.value,
            to_state=to_state.value, who=who, why=why, at=datetime.now(UTC), evidence=dict(evidence)))
        return moved


@dataclass(frozen=True)
class _Snapshot:
    """A model's keys as read under ``WATCH``."""

    versions: dict[str, ModelVersion]
    active: str | None
    history: list[str]
    sequence: int

    def version(self, version_id: str) -> ModelVersion:
        found = self.versions.get(version_id)
        if found is None:
            raise UnknownVersionError(version_id, sorted(self.versions, key=_number))
        return found


@dataclass(frozen=True)
class TransitionResult:
    version: ModelVersion
    transitions: list[TransitionRecord]
    retired: ModelVersion | None = None


def _number(version_id: str) -> int:
    return int(version_id.rsplit("-v", 1)[1])


class ModelRegistry:
    """Versions, states and audit of the learned models (see the module docstring)."""

    def __init__(self, client: redis.Redis, artifacts: ArtifactStore, *, bus: StreamBus | None = None,
                 key_prefix: str = "", validators: Mapping[str, CheckpointValidator] | None = None,
                 url: str = "") -> None:
        """``client`` must decode responses; ``validators`` None: each tier's declared validator."""
        self.client = client
        self.artifacts = artifacts
        self.bus = bus
        self.key_prefix = key_prefix
        self.validators = validators
        self.url = url or "the registry's Redis"

    def keys(self, model: str) -> ModelKeys:
        return ModelKeys(model, self.key_prefix)

    def close(self) -> None:
        self.client.close()
        if self.bus is not None:
            self.bus.close()

    @contextmanager
    def _reachable(self) -> Iterator[None]:
        try:
            yield
        except _REDIS_DOWN as exc:
            raise RegistryUnavailableError(f"Redis at {self.url} is unreachable ({exc})") from exc

    # ------------------------------------------------------------------ reads
    def _read(self, reader: Any, keys: ModelKeys) -> _Snapshot:
        raw = reader.hgetall(keys.versions)
        versions = {vid: ModelVersion.model_validate_json(body) for vid, body in raw.items()}
        return _Snapshot(versions, reader.get(keys.active), list(reader.lrange(keys.history, 0, -1)),
                         int(reader.get(keys.sequence) or 0))

    def versions(self, model: str | None = None) -> list[ModelVersion]:
        """Every version of ``model`` (None: of every model), oldest first."""
        models = [checked_model(model)] if model else list(MODEL_NAMES)
        out: list[ModelVersion] = []
        with self._reachable():
            for name in models:
                out.extend(sorted(self._read(self.client, self.keys(name)).versions.values(),
                                  key=lambda v: v.number))
        return out

    def get(self, version_id: str) -> ModelVersion:
        model = model_of(version_id)
        with self._reachable():
            body = self.client.hget(self.keys(model).versions, version_id)
        if body is None:
            raise UnknownVersionError(version_id)
        return ModelVersion.model_validate_json(body)

    def active(self, model: str) -> ModelVersion | None:
        with self._reachable():
            version_id = self.client.get(self.keys(checked_model(model)).active)
        return self.get(version_id) if version_id else None

    def active_checkpoint(self, model: str) -> tuple[ModelVersion, Path] | None:
        """The active version of ``model`` and a local path to its checkpoint (digest checked), or None when no
        version was ever activated: what a tier loads to serve the registry's choice."""
        version = self.active(model)
        return None if version is None else (version, self.artifacts.get(version.artifact_digest))

    def judged(self, model: str) -> ModelVersion | None:
        """The newest version in shadow or canary: the candidate a tier runs beside its active model (the
        continual learner evaluates one at a time), or None."""
        judged = [v for v in self.versions(model) if v.state in (ModelState.SHADOW, ModelState.CANARY)]
        return judged[-1] if judged else None

    def lineage(self, version_id: str) -> list[ModelVersion]:
        """The version and its ancestors, newest first (a parent that is missing ends the chain)."""
        chain = [self.get(version_id)]
        seen = {version_id}
        while chain[-1].parent and chain[-1].parent not in seen:
            seen.add(chain[-1].parent)
            try:
                chain.append(self.get(chain[-1].parent))
            except UnknownVersionError:
                break
        return chain

    def audit(self, model: str, *, count: int | None = None) -> list[TransitionRecord]:
        """The model's audit records, oldest first (the last ``count`` when given)."""
        key = self.keys(checked_model(model)).audit
        with self._reachable():
            entries = self.client.xrevrange(key, count=count) if count else self.client.xrange(key)
        if count:
            entries = list(reversed(entries))
        return [_record_from_fields(fields) for _, fields in entries]

    def artifact_path(self, version_id: str) -> Path:
        """A local path to the version's checkpoint, its digest checked (``ArtifactDigestError`` if corrupt)."""
        return self.artifacts.get(self.get(version_id).artifact_digest)

    # ------------------------------------------------------------------ changes
    def register(self, model: str, checkpoint: Path, *, data_window: DataWindow, train_command: str,
                 metrics: Mapping[str, float] | None = None, parent: str | None = None, who: str,
                 why: str = "", evidence: Mapping[str, Any] | None = None) -> ModelVersion:
        """Store, verify and validate ``checkpoint``, then record it as a new ``candidate`` version."""
        model = checked_model(model)
        validator = validator_for(model, self.validators)
        stored = self.artifacts.put(Path(checkpoint))
        layout = validated_layout(model, self.artifacts.get(stored.digest), validator)

        def plan(snapshot: _Snapshot) -> _Plan:
            if parent is not None and model_of(parent) != model:
                raise ModelRegistryError(f"parent {parent} is a version of another model than {model}")
            if parent is not None:
                snapshot.version(parent)
            twin = next((v for v in snapshot.versions.values() if v.artifact_digest == stored.digest), None)
            if twin is not None:
                raise ModelRegistryError(f"this checkpoint (sha256:{stored.digest[:12]}…) is already registered "
                                         f"as {twin.version_id}")
            number = snapshot.sequence + 1
            version = ModelVersion(
                model=model, version_id=version_id_for(model, number), parent=parent, data_window=data_window,
                train_command=train_command, metrics=dict(metrics or {}), created_at=datetime.now(UTC),
                artifact_digest=stored.digest, artifact_size_bytes=stored.size_bytes, feature_layout=layout,
                registered_by=who)
            out = _Plan(sequence=number)
            out.move(version, ModelState.CANDIDATE, who=who, why=why or "registered",
                     evidence={"artifact_sha256": stored.digest, **(evidence or {})}, from_state=REGISTERED_FROM)
            return out

        return self._transact(model, plan).version

    def promote(self, version_id: str, to_state: ModelState | str, *, who: str, why: str,
                evidence: Mapping[str, Any] | None = None) -> TransitionResult:
        """Move a version one step along the lifecycle (or retire one that is not active). Activating a
        canary retires the active version in the same transaction."""
        target = ModelState(to_state)
        model = model_of(version_id)
        facts = dict(evidence or {})

        def plan(snapshot: _Snapshot) -> _Plan:
            version = snapshot.version(version_id)
            check_transition(version_id, version.state, target)
            out = _Plan()
            if target is ModelState.ACTIVE:
                if snapshot.active:
                    out.move(snapshot.version(snapshot.active), ModelState.RETIRED, who=who,
                             why=f"replaced by {version_id}: {why}", evidence=facts)
                out.active = version_id
                out.push_history = version_id
            out.move(version, target, who=who, why=why, evidence=facts)
            return out

        return self._transact(model, plan)

    def rollback(self, model: str, *, who: str, why: str, evidence: Mapping[str, Any] | None = None,
                 expected_active: str | None = None) -> TransitionResult:
        """Retire the active version and re-activate the one that was active before it. With
        ``expected_active`` (an automatic rollback of the version it watched) the active version is checked in
        the same transaction, so a version activated meanwhile is never rolled back by mistake."""
        model = checked_model(model)
        facts = dict(evidence or {})

        def plan(snapshot: _Snapshot) -> _Plan:
            if not snapshot.active:
                raise NothingToRollBackError(f"{model} has no active version to roll back")
            if expected_active is not None and snapshot.active != expected_active:
                raise ActiveVersionChangedError(f"{model}: {expected_active} is no longer active ({snapshot.active} "
                                                "is); not rolled back")
            previous = [v for v in snapshot.history[:-1] if v != snapshot.active]
            if not previous:
                raise NothingToRollBackError(f"{model} has no earlier active version than {snapshot.active} "
                                             "to roll back to")
            current, restored = snapshot.version(snapshot.active), snapshot.version(previous[-1])
            for version, to_state in ((current, ModelState.RETIRED), (restored, ModelState.ACTIVE)):
                if (version.state, to_state) not in ROLLBACK_TRANSITIONS:
                    raise ModelRegistryError(f"cannot roll back: {version.version_id} is {version.state.value}")
            out = _Plan(active=restored.version_id, pop_history=True)
            out.move(current, ModelState.RETIRED, who=who, why=f"rolled back: {why}", evidence=facts)
            out.move(restored, ModelState.ACTIVE, who=who, why=f"restored by rollback of {current.version_id}: "
                     f"{why}", evidence=facts)
            return out

        return self._transact(model, plan)

    def attest(self, version_id: str, *, who: str, why: str,
               evidence: Mapping[str, Any] | None = None) -> TransitionRecord:
        """An audit record of a decision that changes no state (e.g. an online evaluator keeping a newly active
        model): ``from_state`` and ``to_state`` are the version's state now. Audited only: no bus event, no
        transition counted."""
        version = self.get(version_id)
        record = TransitionRecord(model=version.model, version_id=version_id, from_state=version.state.value,
                                  to_state=version.state.value, who=who, why=why, at=datetime.now(UTC),
                                  evidence=dict(evidence or {}))
        with self._reachable():
            self.client.xadd(self.keys(version.model).audit, _record_fields(record))
        log.info("model %s: %s (no change) by %s: %s", version_id, version.state.value, who, why)
        return record

    def _transact(self, model: str, plan_for: Callable[[_Snapshot], _Plan]) -> TransitionResult:
        keys = self.keys(model)
        with self._reachable(), self.client.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(*keys.watched())
                    plan = plan_for(self._read(pipe, keys))
                    pipe.multi()
                    _write(pipe, keys, plan)
                    pipe.execute()
                    break
                except redis.exceptions.WatchError:
                    continue  # another operator changed this model: judge the request again on what is there now
                finally:
                    pipe.reset()
        for record in plan.records:
            self._announce(record)
        moved = [plan.versions[r.version_id] for r in plan.records]
        retired = next((v for v in moved[:-1] if v.state is ModelState.RETIRED), None)
        return TransitionResult(version=moved[-1], transitions=plan.records, retired=retired)

    def _announce(self, record: TransitionRecord) -> None:
        TRANSITIONS.labels(record.model, record.from_state, record.to_state).inc()
        log.info("model %s: %s → %s by %s: %s", record.version_id, record.from_state, record.to_state,
                 record.who, record.why)
        if self.bus is None:
            return
        from meridian.model_registry.wire import transition_to_proto

        try:
            self.bus.publish(EVENTS_STREAM, transition_to_proto(record).SerializeToString(), maxlen=EVENTS_MAXLEN)
        except BusError as exc:
            log.warning("model %s: the transition is audited but its bus event was lost: %s", record.version_id, exc)


def _write(pipe: Any, keys: ModelKeys, plan: _Plan) -> None:
    if plan.versions:
        pipe.hset(keys.versions, mapping={vid: v.model_dump_json() for vid, v in plan.versions.items()})
    if plan.sequence is not None:
        pipe.set(keys.sequence, plan.sequence)
    if plan.pop_history:
        pipe.rpop(keys.history)
    if plan.push_history:
        pipe.rpush(keys.history, plan.push_history)
        pipe.ltrim(keys.history, -ACTIVATION_HISTORY_KEPT, -1)
    if plan.active:
        pipe.set(keys.active, plan.active)
    for record in plan.records:
        pipe.xadd(keys.audit, _record_fields(record))


def _record_fields(record: TransitionRecord) -> dict[str, str]:
    return {"model": record.model, "version_id": record.version_id, "from_state": record.from_state,
            "to_state": record.to_state, "who": record.who, "why": record.why, "at": record.at.isoformat(),
            "evidence": json.dumps(record.evidence, sort_keys=True, default=str)}


def _record_from_fields(fields: Mapping[str, str]) -> TransitionRecord:
    return TransitionRecord(model=fields["model"], version_id=fields["version_id"], from_state=fields["from_state"],
                            to_state=fields["to_state"], who=fields["who"], why=fields["why"],
                            at=datetime.fromisoformat(fields["at"]), evidence=json.loads(fields["evidence"]))


def open_registry(url: str, *, artifacts_dir: Path | str, key_prefix: str = "", with_bus: bool = True,
                  validators: Mapping[str, CheckpointValidator] | None = None,
                  timeout_s: float = 3.0) -> ModelRegistry:
    """A registry on the Redis at ``url`` (this process's ``MERIDIAN_REDIS_*`` credentials) with artifacts
    under ``artifacts_dir``; transitions are published on the bus of the same Redis when ``with_bus``."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from meridian.bus import open_bus, redact_url, redis_client
    from meridian.model_registry.artifacts import FilesystemArtifactStore

    client = redis_client(url, decode_responses=True, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                          retry=Retry(NoBackoff(), 0))
    bus = open_bus(url, key_prefix=key_prefix) if with_bus else None
    return ModelRegistry(client, FilesystemArtifactStore(artifacts_dir), bus=bus, key_prefix=key_prefix,
                         validators=validators, url=redact_url(url))
