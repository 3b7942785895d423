"""Checkpoint I/O: a version, the feature layout and action set, the network's constructor arguments
and weights; loaded with ``torch.load(weights_only=True)`` only, and refused if anything mismatches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from regional_scheduler.autoscaling.actions import BURST_HEADROOM_Z, HEADROOM_Z, N_ACTIONS
from regional_scheduler.autoscaling.dqn.policy import QNetwork
from regional_scheduler.autoscaling.features import FEATURE_LAYOUT

CHECKPOINT_FORMAT = "meridian-autoscaler-dqn"
CHECKPOINT_VERSION = 1
DEFAULT_CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "autoscaler_dqn.pt"


class CheckpointMismatchError(ValueError):
    """The checkpoint was written for another format, version, feature layout or action set."""


def save_checkpoint(path: Path, network: QNetwork, metadata: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "feature_layout": list(FEATURE_LAYOUT),
        "headroom_z": list(HEADROOM_Z),
        "burst_headroom_z": list(BURST_HEADROOM_Z),
        "network": network.constructor_kwargs(),
        "state_dict": network.state_dict(),
        "metadata": metadata,
    }, path)


def load_checkpoint(path: Path) -> tuple[QNetwork, dict[str, Any]]:
    """Rebuild the network; raises :class:`CheckpointMismatchError` on any mismatch."""
    payload = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointMismatchError(f"{path}: not a {CHECKPOINT_FORMAT} checkpoint")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise CheckpointMismatchError(
            f"{path}: checkpoint version {payload.get('version')} != supported {CHECKPOINT_VERSION}; retrain "
            "with `meridian train autoscale`")
    if list(payload.get("feature_layout", [])) != list(FEATURE_LAYOUT):
        raise CheckpointMismatchError(
            f"{path}: feature layout differs from this code's ({len(payload.get('feature_layout', []))} vs "
            f"{len(FEATURE_LAYOUT)} features); retrain with `meridian train autoscale`")
    if (list(payload.get("headroom_z", [])) != list(HEADROOM_Z)
            or list(payload.get("burst_headroom_z", [])) != list(BURST_HEADROOM_Z)):
        raise CheckpointMismatchError(f"{path}: action set differs from this code's "
                                      f"{list(HEADROOM_Z)} / {list(BURST_HEADROOM_Z)}")
    kwargs = payload["network"]
    if kwargs.get("n_actions") != N_ACTIONS or kwargs.get("n_features") != len(FEATURE_LAYOUT):
        raise CheckpointMismatchError(f"{path}: network shape does not match the layout")
    network = QNetwork(int(kwargs["n_features"]), int(kwargs["n_actions"]), tuple(kwargs["hidden"]))
    network.load_state_dict(payload["state_dict"])
    network.eval()
    return network, dict(payload.get("metadata", {}))
