"""What separates two versions of a model: their lineage (the nearest common ancestor and the versions on
each side of it), their validation metrics and the recorded facts that differ."""

from __future__ import annotations

from typing import Any

from meridian.model_registry.versions import ModelVersion

#: Recorded facts compared field by field (the metrics are compared on their own).
COMPARED_FIELDS = ("state", "parent", "train_command", "artifact_digest", "artifact_size_bytes", "registered_by")


def common_ancestor(a_lineage: list[ModelVersion], b_lineage: list[ModelVersion]) -> str | None:
    """The newest version both lineages (each newest first, the version itself included) contain."""
    b_ids = {v.version_id for v in b_lineage}
    return next((v.version_id for v in a_lineage if v.version_id in b_ids), None)


def _until(lineage: list[ModelVersion], ancestor: str | None) -> list[str]:
    ids = [v.version_id for v in lineage]
    return ids[: ids.index(ancestor)] if ancestor in ids else ids


def metric_differences(a: ModelVersion, b: ModelVersion) -> dict[str, dict[str, float | None]]:
    """metric -> {a, b, delta (b − a, None when one side lacks it)}, every metric of either version."""
    out: dict[str, dict[str, float | None]] = {}
    for name in sorted(set(a.metrics) | set(b.metrics)):
        left, right = a.metrics.get(name), b.metrics.get(name)
        delta = right - left if left is not None and right is not None else None
        out[name] = {"a": left, "b": right, "delta": delta}
    return out


def version_diff(a_lineage: list[ModelVersion], b_lineage: list[ModelVersion]) -> dict[str, Any]:
    """The difference of ``a_lineage[0]`` and ``b_lineage[0]`` as a JSON-able dict (``meridian models diff``)."""
    a, b = a_lineage[0], b_lineage[0]
    ancestor = common_ancestor(a_lineage, b_lineage)
    fields = {name: {"a": _plain(getattr(a, name)), "b": _plain(getattr(b, name))}
              for name in COMPARED_FIELDS if getattr(a, name) != getattr(b, name)}
    if a.data_window != b.data_window:
        fields["data_window"] = {"a": a.data_window.model_dump(mode="json"), "b": b.data_window.model_dump(mode="json")}
    if a.feature_layout != b.feature_layout:
        fields["feature_layout"] = {"a": a.feature_layout, "b": b.feature_layout}
    return {
        "a": a.version_id, "b": b.version_id,
        "lineage": {"common_ancestor": ancestor, "a_since_ancestor": _until(a_lineage, ancestor),
                    "b_since_ancestor": _until(b_lineage, ancestor),
                    "a_chain": [v.version_id for v in a_lineage], "b_chain": [v.version_id for v in b_lineage]},
        "metrics": metric_differences(a, b),
        "fields": fields,
    }


def _plain(value: object) -> object:
    return getattr(value, "value", value)
