"""The deploy/ tree as the cluster sees it: each overlay rendered by ``kubectl kustomize`` (the v1.36.2
kubectl of ``meridian.envtest.ensure_assets()``, not whatever kubectl is on PATH), parsed once per process.

Tests read rendered documents, never the files under ``deploy/base`` directly: what is applied is the
output of kustomize (generated Secrets and ConfigMaps with hashed names, the image set once, the
autoscaler's Role moved to its target's namespace), so that is what they check.
"""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from meridian import envtest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
#: The installable overlays, and the example that sets the autoscaler's target.
OVERLAYS = ("hub", "member", "all-in-one", "autoscaler-example")
#: Kustomizations applied on their own, outside every overlay (extender mode).
EXTRA_KUSTOMIZATIONS = ("base/extender",)
IMAGE = "meridian:latest"
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job", "CronJob"}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


@functools.cache
def kubectl() -> Path:
    """kubectl v1.36.2 (kustomize built in); a missing binary fails under CI and skips elsewhere."""
    try:
        return envtest.ensure_assets() / "kubectl"
    except envtest.AssetsNotFoundError as exc:
        if in_ci():
            pytest.fail(str(exc))
        pytest.skip(str(exc))


@functools.cache
def render_text(kustomization: str) -> str:
    """``kubectl kustomize deploy/<kustomization>`` (``overlays/<name>`` for an overlay name)."""
    path = DEPLOY / ("overlays/" + kustomization if kustomization in OVERLAYS else kustomization)
    done = subprocess.run([str(kubectl()), "kustomize", str(path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"kubectl kustomize {path}: {done.stderr}"
    return done.stdout


def render(kustomization: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render_text(kustomization)) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str, namespace: str | None = None) -> dict[str, Any]:
    """The one document of ``kind`` named ``name`` (a generated object by its name before the hash)."""
    def matches(d: dict[str, Any]) -> bool:
        meta = d["metadata"]
        if d["kind"] != kind or (namespace is not None and meta.get("namespace") != namespace):
            return False
        return meta["name"] == name or (kind in ("Secret", "ConfigMap") and meta["name"].rpartition("-")[0] == name)

    found = [d for d in docs if matches(d)]
    assert len(found) == 1, f"expected one {kind}/{name} in {namespace or 'any namespace'}, found {len(found)}"
    return found[0]


def workloads(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Meridian's own workloads (not the example's stand-in application)."""
    return [d for d in docs if d["kind"] in WORKLOAD_KINDS
            and d["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "meridian"]


def env_of(container: dict[str, Any], docs: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """A container's environment with literal values, and ConfigMap references resolved from ``docs``."""
    out = {}
    for e in container.get("env", []):
        if "value" in e:
            out[e["name"]] = e["value"]
        elif docs is not None and "configMapKeyRef" in e.get("valueFrom", {}):
            ref = e["valueFrom"]["configMapKeyRef"]
            (cm,) = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == ref["name"]]
            out[e["name"]] = cm["data"][ref["key"]]
    return out
