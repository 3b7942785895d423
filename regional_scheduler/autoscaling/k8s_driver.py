"""Drive a Deployment through its ``scale`` subresource with the official Kubernetes client.

Only ``spec.replicas`` of ``apps/v1 deployments/<name>/scale`` is read and replaced (RBAC: ``get`` and
``update`` on ``deployments/scale`` in the target's namespace, the Role of
``deploy/base/autoscaler/autoscaler.yaml``; it never patches), so the autoscaler never touches the pod
template.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

from kubernetes import client

log = logging.getLogger(__name__)


class ScaleApi(Protocol):
    """The two ``AppsV1Api`` methods the driver uses."""

    def read_namespaced_deployment_scale(self, name: str, namespace: str, **kwargs: Any) -> client.V1Scale: ...

    def replace_namespaced_deployment_scale(self, name: str, namespace: str, body: client.V1Scale,
                                            **kwargs: Any) -> client.V1Scale: ...


def build_scale(*, name: str, namespace: str, replicas: int, resource_version: str | None = None) -> client.V1Scale:
    """The ``autoscaling/v1`` Scale object that sets ``replicas``."""
    if replicas < 0:
        raise ValueError(f"replicas must be ≥ 0, got {replicas}")
    return client.V1Scale(
        api_version="autoscaling/v1", kind="Scale",
        metadata=client.V1ObjectMeta(name=name, namespace=namespace, resource_version=resource_version),
        spec=client.V1ScaleSpec(replicas=int(replicas)))


class ScaleSubresourceDriver:
    def __init__(self, api: ScaleApi, *, name: str, namespace: str, dry_run: bool = False) -> None:
        self.api = api
        self.name = name
        self.namespace = namespace
        self.dry_run = dry_run

    @classmethod
    def from_cluster(cls, *, name: str, namespace: str, dry_run: bool = False) -> ScaleSubresourceDriver:
        """In a pod: the service-account config; elsewhere: the kubeconfig."""
        from kubernetes import config

        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
        return cls(client.AppsV1Api(), name=name, namespace=namespace, dry_run=dry_run)

    def current(self) -> tuple[int, int]:
        """``(spec.replicas, status.replicas)`` from the scale subresource."""
        scale = self.api.read_namespaced_deployment_scale(self.name, self.namespace)
        return int(scale.spec.replicas or 0), int(scale.status.replicas or 0) if scale.status else 0

    def set_replicas(self, replicas: int, *, resource_version: str | None = None) -> client.V1Scale:
        """Write ``spec.replicas`` (server-side dry run with ``dry_run``, which the API validates but
        does not persist)."""
        body = build_scale(name=self.name, namespace=self.namespace, replicas=replicas,
                           resource_version=resource_version)
        kwargs: dict[str, Any] = {"dry_run": "All"} if self.dry_run else {}
        log.info("scale %s/%s to %d replicas%s", self.namespace, self.name, replicas,
                 " (dry run)" if self.dry_run else "")
        return self.api.replace_namespaced_deployment_scale(self.name, self.namespace, body, **kwargs)
