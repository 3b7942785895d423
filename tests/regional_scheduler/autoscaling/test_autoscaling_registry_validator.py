"""The autoscaling checkpoint validator of the model registry (``regional_scheduler.autoscaling.registry_validator``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from regional_scheduler.autoscaling.dqn.checkpoint import DEFAULT_CHECKPOINT, CheckpointMismatchError
from regional_scheduler.autoscaling.features import FEATURE_LAYOUT
from regional_scheduler.autoscaling.registry_validator import AutoscalingCheckpointValidator
from tests.model_registry_helpers import autoscaling_checkpoint


def test_a_checkpoint_of_this_build_passes_with_its_layout(tmp_path: Path) -> None:
    summary = AutoscalingCheckpointValidator().validate(autoscaling_checkpoint(tmp_path / "a.pt"))
    assert summary["features"] == len(FEATURE_LAYOUT) and summary["checkpoint_version"] == 1


def test_the_committed_checkpoint_passes() -> None:
    assert AutoscalingCheckpointValidator().validate(DEFAULT_CHECKPOINT)["features"] == len(FEATURE_LAYOUT)


def test_another_feature_layout_is_refused(tmp_path: Path) -> None:
    path = autoscaling_checkpoint(tmp_path / "a.pt", feature_layout=[*FEATURE_LAYOUT[:-1], "minute_of_day"])
    with pytest.raises(CheckpointMismatchError, match="feature layout differs"):
        AutoscalingCheckpointValidator().validate(path)


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "noise.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointMismatchError, match="cannot read an autoscaler checkpoint"):
        AutoscalingCheckpointValidator().validate(path)
