"""Each tier declares its checkpoint validator in the ``meridian.model_validators`` entry-point group."""

from __future__ import annotations

import pytest

from meridian.model_registry.validators import CheckpointRefusedError, CheckpointValidator, validator_for
from meridian.model_registry.versions import MODEL_NAMES, UnknownModelError


@pytest.mark.parametrize(("model", "cls"), [
    pytest.param("placement", "PlacementCheckpointValidator", id="placement"),
    pytest.param("routing", "RoutingCheckpointValidator", id="routing"),
    pytest.param("autoscaling", "AutoscalingCheckpointValidator", id="autoscaling"),
])
def test_each_model_has_a_declared_validator(model: str, cls: str) -> None:
    validator = validator_for(model)
    assert isinstance(validator, CheckpointValidator) and type(validator).__name__ == cls
    assert model in MODEL_NAMES


def test_given_validators_come_first_and_unknown_models_are_refused() -> None:
    class Accepting:
        def validate(self, path: object) -> dict[str, object]:
            return {}

    given = Accepting()
    assert validator_for("routing", {"routing": given}) is given
    with pytest.raises(UnknownModelError):
        validator_for("ranking")
    assert issubclass(CheckpointRefusedError, Exception)
