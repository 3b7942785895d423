"""The autoscaling tier's checkpoint validator for the model registry (``meridian.model_validators``:
``autoscaling``): a checkpoint is registered only if
:func:`~regional_scheduler.autoscaling.dqn.checkpoint.load_checkpoint` (``torch.load(..., weights_only=True)``)
rebuilds the Q-network for this build's feature layout and action set."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


class AutoscalingCheckpointValidator:
    """Loads an autoscaler DQN checkpoint as serving would; refuses one of another layout or action set."""

    def validate(self, path: Path) -> dict[str, Any]:
        from regional_scheduler.autoscaling.actions import N_ACTIONS
        from regional_scheduler.autoscaling.dqn.checkpoint import (
            CHECKPOINT_VERSION,
            CheckpointMismatchError,
            load_checkpoint,
        )
        from regional_scheduler.autoscaling.features import FEATURE_LAYOUT

        try:
            load_checkpoint(Path(path))
        except CheckpointMismatchError:
            raise
        except Exception as exc:  # torch raises several types for corrupt or unsafe files
            raise CheckpointMismatchError(f"{path}: cannot read an autoscaler checkpoint: {exc}") from exc
        return {"features": len(FEATURE_LAYOUT), "actions": N_ACTIONS, "checkpoint_version": CHECKPOINT_VERSION,
                "layout_sha256": hashlib.sha256(json.dumps(list(FEATURE_LAYOUT)).encode()).hexdigest()}
