"""The routing checkpoint validator of the model registry (``gnn.registry_validator``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gnn.features import CLUSTER_FEATURES, FEATURE_VERSION
from gnn.policy import DEFAULT_CHECKPOINT, CheckpointError
from gnn.registry_validator import RoutingCheckpointValidator
from tests.model_registry_helpers import routing_checkpoint


def test_a_checkpoint_of_this_build_passes_with_its_layout(tmp_path: Path) -> None:
    summary = RoutingCheckpointValidator().validate(routing_checkpoint(tmp_path / "r.pt"))
    assert summary["feature_version"] == FEATURE_VERSION and summary["cluster_features"] == len(CLUSTER_FEATURES)
    assert len(summary["layout_sha256"]) == 64


def test_the_committed_checkpoint_passes() -> None:
    assert RoutingCheckpointValidator().validate(DEFAULT_CHECKPOINT)["feature_version"] == FEATURE_VERSION


def test_another_feature_version_is_refused(tmp_path: Path) -> None:
    path = routing_checkpoint(tmp_path / "r.pt", feature_version=FEATURE_VERSION - 1)
    with pytest.raises(CheckpointError, match=f"feature version {FEATURE_VERSION - 1} != {FEATURE_VERSION}"):
        RoutingCheckpointValidator().validate(path)


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "noise.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="not a routing checkpoint"):
        RoutingCheckpointValidator().validate(path)
