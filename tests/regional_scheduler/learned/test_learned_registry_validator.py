"""The placement checkpoint validator of the model registry: this build's checkpoints pass with their layout
summary; one with a tampered feature layout is refused, by the validator and by the registry, naming what differs."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from meridian.model_registry.artifacts import FilesystemArtifactStore
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.validators import CheckpointRefusedError
from meridian.model_registry.versions import DataWindow
from regional_scheduler.learned.checkpoint import CheckpointError
from regional_scheduler.learned.features import FEATURE_LAYOUT, N_NODE, N_POD
from regional_scheduler.learned.registry_validator import PlacementCheckpointValidator, layout_digest
from tests.model_registry_helpers import placement_checkpoint

COMMITTED = Path(__file__).resolve().parents[3] / "regional_scheduler" / "learned" / "checkpoints" / "placement.pt"
NODE = list(FEATURE_LAYOUT["node"])  # type: ignore[call-overload]
TAMPERED = [("carbon_forecast" if f == "carbon_present" else f) for f in NODE if f != "model_pressure"]


def test_a_checkpoint_of_this_build_passes_with_its_layout(tmp_path: Path) -> None:
    summary = PlacementCheckpointValidator().validate(placement_checkpoint(tmp_path / "p.pt"))
    assert summary == {"feature_version": FEATURE_LAYOUT["version"], "node_features": N_NODE, "pod_features": N_POD,
                       "layout_sha256": layout_digest(FEATURE_LAYOUT), "checkpoint_version": 2, "profiles": ["gpu"]}


def test_the_committed_checkpoint_passes() -> None:
    assert PlacementCheckpointValidator().validate(COMMITTED)["node_features"] == N_NODE


def test_a_tampered_feature_layout_is_refused_naming_the_features(tmp_path: Path) -> None:
    path = placement_checkpoint(tmp_path / "p.pt", node_features=TAMPERED)
    with pytest.raises(CheckpointError) as caught:
        PlacementCheckpointValidator().validate(path)
    message = str(caught.value)
    assert "another feature layout" in message
    assert "node features missing: carbon_present, model_pressure" in message
    assert "node features this build does not have: carbon_forecast" in message


def test_the_registry_refuses_it_through_the_declared_validator(tmp_path: Path, redis_url: str,
                                                                key_prefix: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    registry = ModelRegistry(client, FilesystemArtifactStore(tmp_path / "store"), key_prefix=key_prefix)
    window = DataWindow(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 8, tzinfo=UTC))
    try:
        with pytest.raises(CheckpointRefusedError, match=r"placement checkpoint refused: .*carbon_present"):
            registry.register("placement", placement_checkpoint(tmp_path / "bad.pt", node_features=TAMPERED),
                              data_window=window, train_command="meridian train placement", who="alice")
        assert registry.versions("placement") == []
        good = registry.register("placement", placement_checkpoint(tmp_path / "good.pt"), data_window=window,
                                 train_command="meridian train placement", who="alice")
        assert good.feature_layout["layout_sha256"] == layout_digest(FEATURE_LAYOUT)
    finally:
        client.close()


def test_a_file_that_is_no_checkpoint_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "noise.pt"
    path.write_bytes(b"not a torch file")
    with pytest.raises(CheckpointError, match="cannot read checkpoint"):
        PlacementCheckpointValidator().validate(path)
