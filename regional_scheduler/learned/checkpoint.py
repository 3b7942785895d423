"""Placement checkpoints: one file of several profiles of :class:`~regional_scheduler.learned.policy.PlacementNet`
(e.g. ``gpu`` for GPU clusters, ``cpu`` for CPU-only ones), each with its hyper-parameters, and the
feature layout and version they were trained for.

Checkpoints are a plain dict of tensors and JSON-able values, loaded with
``torch.load(..., weights_only=True)`` only; a file of another version or feature layout is refused
(:func:`upgrade_profiles` carries an older one over for training only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from regional_scheduler.learned.features import FEATURE_LAYOUT, N_NODE
from regional_scheduler.learned.policy import DEFAULT_RESIDUAL_BOUND, PlacementNet

# 2: residual over FGD (``residual_bound`` in the hyper-parameters). Version 1 files hold a full
# ranking network whose scores mean something else; they are refused, not reinterpreted.
CHECKPOINT_VERSION = 2
READABLE_FOR_CARRY_OVER = (1, 2)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used: missing, unreadable, another version or feature layout."""


def save_checkpoint(path: Path | str, profiles: dict[str, PlacementNet], *, extra: dict[str, Any] | None = None) -> None:
    """One file, several *profiles* (e.g. ``gpu`` for GPU clusters, ``cpu`` for CPU-only ones): the
    same architecture and feature layout, separately trained weights."""
    payload = {
        "version": CHECKPOINT_VERSION,
        "feature_layout": FEATURE_LAYOUT,
        "profiles": {
            name: {"hyper_parameters": net.hyper_parameters(),
                   "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}}
            for name, net in profiles.items()
        },
        "extra": extra or {},
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, path)


def load_checkpoint(path: Path | str) -> tuple[dict[str, PlacementNet], dict[str, Any]]:
    """Rebuild the networks from a checkpoint; refuse one of another version or feature layout."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"no checkpoint at {path}")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or unsafe files
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    if not isinstance(payload, dict) or "version" not in payload or "profiles" not in payload:
        raise CheckpointError(f"{path} is not a Meridian placement checkpoint")
    if payload["version"] != CHECKPOINT_VERSION:
        raise CheckpointError(f"checkpoint {path} has version {payload['version']}; "
                              f"this build reads version {CHECKPOINT_VERSION} (the residual policy over FGD; "
                              "version 1 held a full ranking network) — retrain it")
    layout = payload.get("feature_layout")
    if layout != FEATURE_LAYOUT:
        got = layout.get("version") if isinstance(layout, dict) else layout
        n_got = len(layout.get("node", [])) if isinstance(layout, dict) else "?"
        raise CheckpointError(
            f"checkpoint {path} was trained on another feature layout (version {got}, {n_got} node "
            f"features); this build has version {FEATURE_LAYOUT['version']} with {N_NODE} node "
            "features — retrain it")
    nets: dict[str, PlacementNet] = {}
    for name, entry in payload["profiles"].items():
        hp = dict(entry["hyper_parameters"])
        net = PlacementNet(n_node=int(hp["n_node"]), n_pod=int(hp["n_pod"]), hidden=int(hp["hidden"]),
                           residual_bound=float(hp["residual_bound"]), gate_unused=bool(hp.get("gate_unused", False)),
                           gate_constrained=bool(hp.get("gate_constrained", False)),
                           gate_gpu_pods=bool(hp.get("gate_gpu_pods", False)),
                           gate_share=None if hp.get("gate_share") is None else float(hp["gate_share"]))
        try:
            net.load_state_dict(entry["state_dict"])
        except RuntimeError as exc:
            raise CheckpointError(f"checkpoint {path} profile {name!r} does not match the network: {exc}") from exc
        net.eval()
        nets[name] = net
    return nets, payload.get("extra", {})


def upgrade_profiles(path: Path | str, *, residual_bound: float = DEFAULT_RESIDUAL_BOUND,
                     ) -> tuple[dict[str, PlacementNet], dict[str, Any], int]:
    """The profiles of a checkpoint written for an *older* feature layout or checkpoint version,
    carried over to this one: every node feature the old layout lacks gets zero weight (in the
    heuristic head and in the MLP's node and pooled-context inputs) and identity normalisation, so
    the upgraded network gives the old one's ``g`` wherever it is used. A version-1 network becomes
    the correction ``g`` of a residual policy with ``residual_bound``: on a CPU-only cluster (every
    FGD score equal) that policy ranks exactly as the old network did. Only for
    ``meridian train placement --merge``/``--init``; serving still refuses the old file. Requires the
    same pod features and the old node features as a subset of the new ones. Returns the networks,
    the checkpoint's ``extra`` and the old layout's version."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for corrupt or unsafe files
        raise CheckpointError(f"cannot read checkpoint {path}: {exc}") from exc
    layout = payload.get("feature_layout") if isinstance(payload, dict) else None
    if not isinstance(layout, dict) or payload.get("version") not in READABLE_FOR_CARRY_OVER:
        raise CheckpointError(f"{path} is not a Meridian placement checkpoint of version "
                              f"{' or '.join(map(str, READABLE_FOR_CARRY_OVER))}")
    old_node, new_node = list(layout.get("node", [])), list(FEATURE_LAYOUT["node"])  # type: ignore[call-overload]
    if list(layout.get("pod", [])) != list(FEATURE_LAYOUT["pod"]) or not set(old_node) <= set(new_node):  # type: ignore[call-overload]
        raise CheckpointError(f"checkpoint {path}'s feature layout cannot be carried over to version "
                              f"{FEATURE_LAYOUT['version']}")
    where = torch.tensor([new_node.index(f) for f in old_node])
    nets: dict[str, PlacementNet] = {}
    for name, entry in payload["profiles"].items():
        old = entry["state_dict"]
        hp = dict(entry["hyper_parameters"])
        n_old, n_pod = hp["n_node"], hp["n_pod"]
        net = PlacementNet(hidden=int(hp["hidden"]), residual_bound=float(hp.get("residual_bound", residual_bound)))
        sd = {k: v.clone() for k, v in net.state_dict().items()}
        sd["feature_mean"].zero_()
        sd["feature_std"].fill_(1.0)
        sd["feature_mean"][where] = old["feature_mean"]
        sd["feature_std"][where] = old["feature_std"]
        sd["heuristic_head.weight"].zero_()
        sd["heuristic_head.weight"][:, where] = old["heuristic_head.weight"]
        w0_old, w0 = old["mlp.0.weight"], sd["mlp.0.weight"]
        w0.zero_()
        n, p = net.n_node, net.n_pod
        w0[:, where] = w0_old[:, :n_old]
        w0[:, n:n + p] = w0_old[:, n_old:n_old + n_pod]
        w0[:, n + p + where] = w0_old[:, n_old + n_pod:2 * n_old + n_pod]
        w0[:, 2 * n + p + where] = w0_old[:, 2 * n_old + n_pod:]
        for key in ("mlp.0.bias", "mlp.2.weight", "mlp.2.bias", "mlp.4.weight", "mlp.4.bias", "mlp_scale"):
            sd[key] = old[key].clone()
        net.load_state_dict(sd)
        net.eval()
        nets[name] = net
    return nets, payload.get("extra", {}), int(layout.get("version", 0))
