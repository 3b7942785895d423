"""Redis key names of the model registry, in one place.

Every key of one model carries the model's name as a hash tag (``{placement}``), so a model's versions,
its active pointer, its activation history and its audit stream live in one slot of a Redis Cluster and one
``WATCH``/``MULTI`` transaction can change them together. The bus stream of transition events is shared by
all models (one stream per purpose, ARCHITECTURE.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from meridian.model_registry.versions import checked_model

PREFIX = "meridian:models"
#: The bus stream every transition is published on (``ModelTransition`` protobuf payloads).
EVENTS_STREAM = f"{PREFIX}:events"
#: The most activations remembered for rollbacks, per model.
ACTIVATION_HISTORY_KEPT = 100


@dataclass(frozen=True)
class ModelKeys:
    model: str
    key_prefix: str = ""

    def __post_init__(self) -> None:
        checked_model(self.model)

    def _key(self, suffix: str) -> str:
        return f"{self.key_prefix}{PREFIX}:{{{self.model}}}:{suffix}"

    @property
    def versions(self) -> str:
        """Hash: version id -> the version's JSON (:class:`~meridian.model_registry.versions.ModelVersion`)."""
        return self._key("versions")

    @property
    def active(self) -> str:
        """String: the id of the active version (absent until a version is first activated)."""
        return self._key("active")

    @property
    def history(self) -> str:
        """List: the ids activated in turn, the active one last; a rollback pops it and re-activates the next."""
        return self._key("history")

    @property
    def sequence(self) -> str:
        """String: the number of the last version registered (version ids are ``<model>-v<n>``)."""
        return self._key("seq")

    @property
    def audit(self) -> str:
        """Stream: one entry per transition (who, when, from, to, why, evidence JSON); never trimmed."""
        return self._key("audit")

    def watched(self) -> tuple[str, ...]:
        return (self.versions, self.active, self.history, self.sequence)
