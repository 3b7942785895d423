"""Helpers for tests marked ``kubernetes``: Ready Nodes (from ``meridian.envtest``), pods, bindings."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kubernetes.client import ApiClient, CoreV1Api
from kubernetes.client.exceptions import ApiException

from meridian.envtest import NodeSpec, create_ready_nodes, delete_nodes

__all__ = ["NodeSpec", "bind_pod", "create_ready_nodes", "delete_nodes", "fresh_namespace", "pending_pod", "ready_nodes"]


@contextmanager
def fresh_namespace(api: ApiClient) -> Iterator[str]:
    """A new namespace, deleted afterwards (its pods first, with grace period 0: without a kubelet nothing
    confirms a graceful deletion, so they would stay Terminating)."""
    core = CoreV1Api(api)
    name = f"meridian-test-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name}})
    # Pods need the namespace's "default" ServiceAccount, which kube-controller-manager creates a
    # moment later; creating it here removes that race (a conflict means the controller was first).
    with contextlib.suppress(ApiException):
        core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    try:
        yield name
    finally:
        with contextlib.suppress(ApiException):
            core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        with contextlib.suppress(ApiException):
            core.delete_namespace(name)


@contextmanager
def ready_nodes(api: ApiClient, specs: Iterable[NodeSpec]) -> Iterator[tuple[list[str], str]]:
    """Create Ready Nodes labelled with a fresh run id; yields (names, label selector) and deletes
    them afterwards. Nodes are cluster-scoped, so the label keeps tests from touching each other's."""
    run = uuid.uuid4().hex[:10]
    names = create_ready_nodes(api, specs, labels={"meridian.test/run": run})
    try:
        yield names, f"meridian.test/run={run}"
    finally:
        delete_nodes(api, f"meridian.test/run={run}")


def pending_pod(name: str, *, cpu: str = "100m", memory: str = "64Mi", scheduler_name: str | None = None,
                node_selector: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None
                ) -> dict[str, Any]:
    """A pod body with one container requesting ``cpu``/``memory`` (it never runs: no kubelet)."""
    spec: dict[str, Any] = {
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        "terminationGracePeriodSeconds": 0,
    }
    if scheduler_name:
        spec["schedulerName"] = scheduler_name
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": dict(labels or {})},
            "spec": spec}


def bind_pod(api: ApiClient, namespace: str, pod: str, node: str) -> int:
    """POST a Binding; returns the HTTP status. The reply is not decoded: the official client applies
    the binding and then fails to decode the server's ``Status`` reply as a ``V1Binding``."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    reply = CoreV1Api(api).create_namespaced_pod_binding(pod, namespace, body, _preload_content=False)
    reply.drain_conn()
    reply.release_conn()
    return int(reply.status)
