"""Checkpoints load with ``torch.load(weights_only=True)`` and a mismatched one is refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from regional_scheduler.autoscaling.actions import N_ACTIONS
from regional_scheduler.autoscaling.dqn import checkpoint as ckpt
from regional_scheduler.autoscaling.dqn.policy import QNetwork
from regional_scheduler.autoscaling.features import FEATURE_LAYOUT
from regional_scheduler.autoscaling.policies.learned_policy import build


def _saved(tmp_path: Path) -> Path:
    path = tmp_path / "dqn.pt"
    ckpt.save_checkpoint(path, QNetwork(len(FEATURE_LAYOUT), N_ACTIONS, (8,)), {"seed": 0})
    return path


def test_committed_checkpoint_loads_with_weights_only(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[dict[str, Any]] = []
    real_load = torch.load

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    network, metadata = ckpt.load_checkpoint(ckpt.DEFAULT_CHECKPOINT)
    assert calls and all(c.get("weights_only") is True for c in calls)
    assert network.n_features == len(FEATURE_LAYOUT) and network.n_actions == N_ACTIONS
    # The checkpoint says which days trained it; held-back days come after every training range.
    for series in metadata["series"]:
        assert series["train_minutes"][1] == series["held_back_minutes"][0]


def test_round_trip_preserves_weights(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    network, metadata = ckpt.load_checkpoint(path)
    state = torch.zeros(1, len(FEATURE_LAYOUT))
    again, _ = ckpt.load_checkpoint(path)
    assert torch.equal(network(state), again(state)) and metadata == {"seed": 0}


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        pytest.param("version", 99, "version", id="version"),
        pytest.param("feature_layout", ["replicas", "utilisation"], "feature layout", id="feature-layout"),
        pytest.param("headroom_z", [0.0, 9.0], "action set", id="action-set"),
        pytest.param("format", "something-else", "not a", id="format"),
    ],
)
def test_mismatched_checkpoint_is_refused(tmp_path: Path, key: str, value: Any, message: str) -> None:
    path = _saved(tmp_path)
    payload = torch.load(path, weights_only=True)
    payload[key] = value
    torch.save(payload, path)
    with pytest.raises(ckpt.CheckpointMismatchError, match=message):
        ckpt.load_checkpoint(path)


def test_pickled_object_is_rejected_by_weights_only(tmp_path: Path) -> None:
    path = tmp_path / "evil.pt"
    torch.save({"format": ckpt.CHECKPOINT_FORMAT, "obj": Path("/")}, path)
    with pytest.raises(Exception, match=r"[Ww]eights only|Unsupported global"):
        ckpt.load_checkpoint(path)


def test_learned_policy_falls_back_when_checkpoint_is_refused(tmp_path: Path) -> None:
    path = _saved(tmp_path)
    payload = torch.load(path, weights_only=True)
    payload["version"] = 0
    torch.save(payload, path)
    assert build(path).network is None
    assert build(tmp_path / "missing.pt").network is None
