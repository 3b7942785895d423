"""The node's Kubernetes object read through the official client's models.

No API server runs in the tests, so the API is a small stand-in returning the client's own model
objects (``V1Node``, ``V1PodList``) — the parsing under test is the real code path.
"""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from node_agent.collectors.kube import KubeNodeCollector, pod_requests


def _container(name: str, cpu: str | None = None, memory: str | None = None, gpu: str | None = None
               ) -> client.V1Container:
    requests = {k: v for k, v in {"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpu}.items() if v is not None}
    return client.V1Container(name=name, resources=client.V1ResourceRequirements(requests=requests or None))


def _pod(containers: list[client.V1Container], init: list[client.V1Container] | None = None) -> client.V1Pod:
    return client.V1Pod(spec=client.V1PodSpec(containers=containers, init_containers=init))


@pytest.mark.parametrize(
    ("pod", "expected"),
    [
        pytest.param(_pod([_container("a", "500m", "1Gi"), _container("b", "250m", "512Mi")]),
                     (750, 1536 * 2**20, 0), id="sum-of-app-containers"),
        pytest.param(_pod([_container("a", "500m", "1Gi")], init=[_container("i", "2", "256Mi")]),
                     (2000, 2**30, 0), id="init-container-peak"),
        pytest.param(_pod([_container("a", gpu="2"), _container("b")]), (0, 0, 2), id="gpus-no-cpu"),
    ],
)
def test_pod_requests(pod: client.V1Pod, expected: tuple[int, int, int]) -> None:
    assert pod_requests(pod) == expected


class _Api:
    """Answers ``read_node`` and ``list_pod_for_all_namespaces`` like CoreV1Api, or fails on demand."""

    def __init__(self, node: client.V1Node, pods: list[client.V1Pod]) -> None:
        self.node, self.pods, self.fail, self.calls = node, pods, False, 0
        self.selectors: list[str] = []

    def read_node(self, name: str) -> client.V1Node:
        self.calls += 1
        if self.fail:
            raise client.ApiException(status=503, reason="unavailable")
        assert name == self.node.metadata.name
        return self.node

    def list_pod_for_all_namespaces(self, *, field_selector: str, **_: Any) -> client.V1PodList:
        self.selectors.append(field_selector)
        return client.V1PodList(items=self.pods)


def _node() -> client.V1Node:
    return client.V1Node(
        metadata=client.V1ObjectMeta(name="gpu-7", labels={"nvidia.com/gpu.product": "A100", "zone": "a"}),
        spec=client.V1NodeSpec(unschedulable=True, taints=[client.V1Taint(key="gpu", effect="NoSchedule")]),
        status=client.V1NodeStatus(capacity={"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"},
                                   allocatable={"cpu": "63500m", "memory": "250Gi", "nvidia.com/gpu": "8"}),
    )


def test_node_object_and_requests() -> None:
    api = _Api(_node(), [_pod([_container("a", "1", "1Gi", gpu="1")]), _pod([_container("b", "500m")])])
    info = KubeNodeCollector("gpu-7", api=api).read(0.0)
    assert info is not None
    assert (info.capacity_milli_cpu, info.capacity_memory_bytes, info.capacity_gpu) == (64_000, 256 * 2**30, 8)
    assert (info.allocatable_milli_cpu, info.allocatable_memory_bytes) == (63_500, 250 * 2**30)
    assert (info.requested_milli_cpu, info.requested_memory_bytes, info.requested_gpu) == (1500, 2**30, 1)
    assert info.unschedulable and info.gpu_model == "A100"
    assert info.taints == [("gpu", "", "NoSchedule")]
    assert api.selectors == ["spec.nodeName=gpu-7,status.phase!=Succeeded,status.phase!=Failed"]


def test_refresh_interval_and_api_failure_keep_last_good() -> None:
    api = _Api(_node(), [])
    kube = KubeNodeCollector("gpu-7", api=api, refresh_s=30.0)
    first = kube.read(0.0)
    assert kube.read(10.0) is first and api.calls == 1  # cached within the refresh interval
    api.fail = True
    assert kube.read(31.0) is first  # API down: keep reporting the last good object
    assert kube.errors_total == 1
