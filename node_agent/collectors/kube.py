"""The node's own Kubernetes object: capacity, allocatable, labels, taints, cordon, requests.

Through the official client (``kubernetes``): in a pod it uses the service account
(``load_incluster_config``); elsewhere the local kubeconfig (``KUBECONFIG`` or ``~/.kube/config``). A
``kubeconfig`` file given explicitly (``MERIDIAN_AGENT_KUBE__KUBECONFIG``) is used instead of both,
through a client of its own (the process-wide default configuration is left alone): an agent run
outside the cluster under the DaemonSet's identity (a ServiceAccount token kubeconfig), as the tests
do. The node name comes from the downward API (``spec.nodeName`` → ``NODE_NAME``). Requested
resources are the sum of the requests of the node's non-terminated pods
(``field_selector=spec.nodeName=<node>``), as kube-scheduler counts them (init containers: the maximum
of any one, against the sum of the app containers).

The API is read every ``refresh_s`` (default 30 s), not every report: node objects change rarely
and a DaemonSet of thousands of agents must not hammer the API server.

Without a cluster (``meridian agent`` on a laptop, tests) :func:`local_node_info` describes this
machine from psutil.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from meridian import quantity

log = logging.getLogger(__name__)
GPU_RESOURCE = "nvidia.com/gpu"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass
class NodeInfo:
    name: str
    capacity_milli_cpu: int
    capacity_memory_bytes: int
    capacity_gpu: int = 0
    allocatable_milli_cpu: int = 0
    allocatable_memory_bytes: int = 0
    allocatable_gpu: int = 0
    requested_milli_cpu: int = 0
    requested_memory_bytes: int = 0
    requested_gpu: int = 0
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[tuple[str, str, str]] = field(default_factory=list)
    unschedulable: bool = False
    gpu_model: str = ""


def local_node_info(name: str | None = None) -> NodeInfo:
    """This machine as a node: all CPUs and memory allocatable, no labels."""
    cpus = (psutil.cpu_count() or 1) * 1000
    memory = int(psutil.virtual_memory().total)
    return NodeInfo(name or os.environ.get("NODE_NAME") or socket.gethostname(), cpus, memory, 0, cpus, memory)


def _resources(values: dict[str, Any] | None) -> tuple[int, int, int]:
    values = values or {}
    cpu = quantity.to_milli(values["cpu"], field="cpu") if "cpu" in values else 0
    memory = quantity.to_int(values["memory"], field="memory") if "memory" in values else 0
    gpu = quantity.to_int(values[GPU_RESOURCE], field=GPU_RESOURCE) if GPU_RESOURCE in values else 0
    return cpu, memory, gpu


def pod_requests(pod: Any) -> tuple[int, int, int]:
    """(milli-CPU, bytes, GPUs) a pod reserves: max(sum of app containers, largest init container)."""
    spec = pod.spec
    app = [_resources(c.resources.requests if c.resources else None) for c in spec.containers or []]
    init = [_resources(c.resources.requests if c.resources else None) for c in spec.init_containers or []]
    total = tuple(sum(r[i] for r in app) for i in range(3))
    peak = tuple(max((r[i] for r in init), default=0) for i in range(3))
    return tuple(max(a, b) for a, b in zip(total, peak, strict=True))  # type: ignore[return-value]


class KubeNodeCollector:
    def __init__(self, node_name: str, *, api: Any | None = None, refresh_s: float = 30.0,
                 kubeconfig: Path | str | None = None) -> None:
        self.node_name = node_name
        self.refresh_s = refresh_s
        if api is None and kubeconfig is not None:
            from kubernetes import client, config

            api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        elif api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api = client.CoreV1Api()
        self.api = api
        self._cached: NodeInfo | None = None
        self._fetched_s = float("-inf")
        self.errors_total = 0

    def fetch(self) -> NodeInfo:
        node = self.api.read_node(self.node_name)
        cap = _resources(node.status.capacity)
        alloc = _resources(node.status.allocatable)
        pods = self.api.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={self.node_name},status.phase!=Succeeded,status.phase!=Failed")
        req = [pod_requests(p) for p in pods.items]
        labels = dict(node.metadata.labels or {})
        taints = [(t.key, t.value or "", t.effect) for t in (node.spec.taints or [])]
        return NodeInfo(
            name=self.node_name, capacity_milli_cpu=cap[0], capacity_memory_bytes=cap[1], capacity_gpu=cap[2],
            allocatable_milli_cpu=alloc[0], allocatable_memory_bytes=alloc[1], allocatable_gpu=alloc[2],
            requested_milli_cpu=sum(r[0] for r in req), requested_memory_bytes=sum(r[1] for r in req),
            requested_gpu=sum(r[2] for r in req), labels=labels, taints=taints,
            unschedulable=bool(node.spec.unschedulable), gpu_model=labels.get(GPU_PRODUCT_LABEL, ""),
        )

    def read(self, now_s: float) -> NodeInfo | None:
        """The cached node, refreshed every ``refresh_s``; the last good one if the API fails."""
        if now_s - self._fetched_s >= self.refresh_s:
            try:
                self._cached = self.fetch()
                self._fetched_s = now_s
            except Exception as exc:  # the API server is remote and fallible; keep reporting
                self.errors_total += 1
                self._fetched_s = now_s - self.refresh_s / 2  # retry sooner than a full refresh
                log.warning("node %s: reading the Kubernetes object failed: %s", self.node_name, exc)
        return self._cached
