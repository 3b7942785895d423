"""Fresh checkpoints of the three learned models, written by each tier's own save function (and optionally
tampered with afterwards), for the model registry's tests: the committed files may change under other work,
these are made from this build's code."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def placement_checkpoint(path: Path, *, node_features: list[str] | None = None) -> Path:
    """A placement checkpoint of this build; ``node_features`` replaces the node feature names it records."""
    from regional_scheduler.learned.checkpoint import save_checkpoint
    from regional_scheduler.learned.policy import PlacementNet

    save_checkpoint(path, {"gpu": PlacementNet()})
    if node_features is not None:
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        payload["feature_layout"] = {**payload["feature_layout"], "node": list(node_features)}
        torch.save(payload, path)
    return path


def routing_checkpoint(path: Path, *, feature_version: int | None = None) -> Path:
    """A GNN router checkpoint of this build; ``feature_version`` replaces the version it records."""
    from gnn.policy import GnnRoutingNet

    GnnRoutingNet().save(path, meta={"trained_on": "test"})
    if feature_version is not None:
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        payload["feature_version"] = feature_version
        torch.save(payload, path)
    return path


def autoscaling_checkpoint(path: Path, *, feature_layout: list[str] | None = None) -> Path:
    """An autoscaler DQN checkpoint of this build; ``feature_layout`` replaces the layout it records."""
    from regional_scheduler.autoscaling.actions import N_ACTIONS
    from regional_scheduler.autoscaling.dqn.checkpoint import save_checkpoint
    from regional_scheduler.autoscaling.dqn.policy import QNetwork
    from regional_scheduler.autoscaling.features import FEATURE_LAYOUT

    save_checkpoint(path, QNetwork(len(FEATURE_LAYOUT), N_ACTIONS), {"trained_on": "test"})
    if feature_layout is not None:
        payload: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=True)
        payload["feature_layout"] = list(feature_layout)
        torch.save(payload, path)
    return path


def register_version(registry: Any, model: str, checkpoint: Path, *states: str) -> str:
    """Register ``checkpoint`` (already written) as a version of ``model`` and walk it through ``states``; its id."""
    from datetime import UTC, datetime

    from meridian.model_registry.versions import DataWindow

    window = DataWindow(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 2, tzinfo=UTC))
    version = registry.register(model, checkpoint, data_window=window, who="test", train_command="test")
    for state in states:
        registry.promote(version.version_id, state, who="test", why="test")
    return str(version.version_id)
