"""The placement tier's checkpoint validator for the model registry (``meridian.model_validators``:
``placement``): a checkpoint is registered only if :func:`~regional_scheduler.learned.checkpoint.load_checkpoint`
(``torch.load(..., weights_only=True)``) rebuilds its networks for this build's feature layout."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def layout_digest(layout: object) -> str:
    """sha256 of a feature layout's canonical JSON: equal layouts, equal digests."""
    return hashlib.sha256(json.dumps(layout, sort_keys=True).encode()).hexdigest()


def layout_mismatch(found: object, expected: dict[str, object]) -> str:
    """What differs between a checkpoint's feature layout and this build's, feature by feature."""
    if not isinstance(found, dict):
        return f"the checkpoint's feature layout is {type(found).__name__}, not a layout"
    parts = []
    if found.get("version") != expected["version"]:
        parts.append(f"layout version {found.get('version')} (this build: {expected['version']})")
    for group in ("node", "pod"):
        have, want = list(found.get(group, [])), list(expected[group])  # type: ignore[call-overload]
        missing, extra = [f for f in want if f not in have], [f for f in have if f not in want]
        if missing:
            parts.append(f"{group} features missing: {', '.join(missing)}")
        if extra:
            parts.append(f"{group} features this build does not have: {', '.join(extra)}")
        if not missing and not extra and have != want:
            parts.append(f"{group} features in another order")
    return "; ".join(parts) or "the layouts differ"


class PlacementCheckpointValidator:
    """Loads a placement checkpoint as serving would; refuses one of another feature layout, naming the
    features that differ."""

    def validate(self, path: Path) -> dict[str, Any]:
        import torch

        from regional_scheduler.learned.checkpoint import CHECKPOINT_VERSION, CheckpointError, load_checkpoint
        from regional_scheduler.learned.features import FEATURE_LAYOUT, N_NODE, N_POD

        try:
            nets, _ = load_checkpoint(path)
        except CheckpointError as exc:
            try:
                payload = torch.load(path, map_location="cpu", weights_only=True)
            except Exception:  # unreadable: load_checkpoint's message already says so
                raise exc from None
            layout = payload.get("feature_layout") if isinstance(payload, dict) else None
            if layout is not None and layout != FEATURE_LAYOUT:
                raise CheckpointError(f"{exc} ({layout_mismatch(layout, FEATURE_LAYOUT)})") from None
            raise
        return {"feature_version": FEATURE_LAYOUT["version"], "node_features": N_NODE, "pod_features": N_POD,
                "layout_sha256": layout_digest(FEATURE_LAYOUT), "checkpoint_version": CHECKPOINT_VERSION,
                "profiles": sorted(nets)}
