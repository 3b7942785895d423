"""The tiers' checkpoint validators, declared by each tier and found through an entry-point group.

The registry refuses a checkpoint its tier could not serve. Only the tier knows its feature layout and its
loader, and the core imports no tier, so each tier implements :class:`CheckpointValidator` next to its loader
and declares it in ``pyproject.toml``'s ``meridian.model_validators`` group under the model's name (as the
CLI's ``meridian.cli`` group does for commands). A validator loads the file through the tier's own loader
(``torch.load(..., weights_only=True)``) and returns a JSON-able summary of the feature layout it found; it
raises when the file is not a checkpoint of this build's layout, with a message that names the mismatch.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from meridian.model_registry.versions import MODEL_NAMES, ModelRegistryError, checked_model

ENTRY_POINT_GROUP = "meridian.model_validators"


class CheckpointRefusedError(ModelRegistryError):
    """The tier's validator refused the checkpoint (another feature layout, version or not a checkpoint)."""


@runtime_checkable
class CheckpointValidator(Protocol):
    def validate(self, path: Path) -> dict[str, Any]:
        """The feature layout summary of the checkpoint at ``path``; raises if this build cannot serve it."""
        ...


def declared_validators() -> dict[str, Callable[[], CheckpointValidator]]:
    """model name -> the validator factory its tier declared (only models Meridian knows)."""
    found: dict[str, Callable[[], CheckpointValidator]] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in MODEL_NAMES:
            found[ep.name] = ep.load
    return found


def validator_for(model: str, validators: Mapping[str, CheckpointValidator] | None = None) -> CheckpointValidator:
    """The validator of ``model``: from ``validators`` when given, otherwise the one its tier declared."""
    checked_model(model)
    if validators is not None and model in validators:
        return validators[model]
    loader = declared_validators().get(model)
    if loader is None:
        raise CheckpointRefusedError(f"no checkpoint validator is declared for model {model!r} (entry-point group "
                                     f"{ENTRY_POINT_GROUP}); reinstall Meridian (pip install -e .)")
    factory = loader()
    validator = factory()
    if not isinstance(validator, CheckpointValidator):
        raise CheckpointRefusedError(f"the {model} validator {factory!r} has no validate(path) method")
    return validator


def validated_layout(model: str, path: Path, validator: CheckpointValidator) -> dict[str, Any]:
    """The validator's summary, or :class:`CheckpointRefusedError` naming the model and the tier's reason."""
    try:
        layout = validator.validate(path)
    except Exception as exc:  # each tier raises its own error type; all mean "cannot serve this file"
        raise CheckpointRefusedError(f"{model} checkpoint refused: {exc}") from exc
    return dict(layout)
