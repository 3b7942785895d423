"""Two replicas of a member's regional scheduler (``meridian regional-scheduler`` processes) with leader
election on a Lease: only the leader dispatches; the leader is killed with ``kill -9`` while dispatch
entries stream in, the standby takes the Lease and what the dead leader read and never acknowledged, and
every workload ends with exactly one object, read back from the real API server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client

from meridian.bus import StreamBus, dispatch_stream
from meridian.envtest import ControlPlane, wait_for
from protos import dispatch_pb2 as dpb
from regional_scheduler.kube_dispatch import GROUP, MANAGED_BY, MANAGED_BY_LABEL, WORKLOAD_LABEL
from tests.kube_helpers import NodeSpec, ready_nodes

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]
CLUSTER = "member-ha"
LEASE = "meridian-regional-ha"


@pytest.fixture
def bus(redis_bus: StreamBus) -> StreamBus:
    return redis_bus


def replica(plane: ControlPlane, identity: str, ns: str, redis_url: str, key_prefix: str,
            log: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "MERIDIAN_TELEMETRY_KEY_PREFIX": key_prefix, "MERIDIAN_SUMMARY_INTERVAL_S": "1",
           "MERIDIAN_KUBE_DISPATCH_TERMINATION_GRACE_PERIOD_S": "0", "MERIDIAN_KUBE_DISPATCH_STATUS_INTERVAL_S": "0.5"}
    argv = [sys.executable, "-m", "regional_scheduler.kube_cli", "--kubeconfig", str(plane.admin_kubeconfig),
            "--cluster", CLUSTER, "--region", "eu-west", "--bus-url", redis_url, "--leader-elect",
            "--lease-namespace", ns, "--lease-name", LEASE, "--lease-duration", "4", "--renew-deadline", "3",
            "--retry-period", "0.5", "--identity", identity, "--workload-namespace", ns, "--metrics-port", "0",
            "--kube-api-qps", "0"]
    with open(log, "ab") as out:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env)


def holder(api: client.ApiClient, ns: str) -> str | None:
    try:
        return client.CoordinationV1Api(api).read_namespaced_lease(LEASE, ns).spec.holder_identity
    except client.ApiException:
        return None


def objects_by_workload(api: client.ApiClient, ns: str) -> dict[str, int]:
    reply = client.AppsV1Api(api).list_namespaced_deployment(ns, label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
                                                             _preload_content=False)
    counts: dict[str, int] = {}
    for obj in json.loads(reply.data)["items"]:
        if not obj["metadata"].get("deletionTimestamp"):
            wid = obj["metadata"]["labels"][WORKLOAD_LABEL]
            counts[wid] = counts.get(wid, 0) + 1
    return counts


def place(i: int) -> bytes:
    return dpb.DispatchMessage(cluster=CLUSTER, place=dpb.PlaceWorkload(
        workload_id=f"{i:032x}", attempt=1, name=f"svc-{i}", tenant="shop", replicas=1,
        requests=dpb.ReplicaRequests(milli_cpu=10, memory_bytes=2**20))).SerializeToString()


def test_killing_the_leader_mid_dispatch_creates_every_object_once(
        kube_control_plane: ControlPlane, kube_api: client.ApiClient, kube_namespace: str, redis_url: str,
        key_prefix: str, bus: StreamBus, tmp_path: Path) -> None:
    stream = dispatch_stream(CLUSTER)
    specs: list[NodeSpec] = [{"name": f"ha-{os.getpid()}-{i}", "capacity": {"cpu": "8", "memory": "16Gi"}}
                             for i in range(2)]
    procs = {name: replica(kube_control_plane, name, kube_namespace, redis_url, key_prefix, tmp_path / f"{name}.log")
             for name in ("replica-a", "replica-b")}
    try:
        with ready_nodes(kube_api, specs):
            first = wait_for(lambda: holder(kube_api, kube_namespace), timeout=60)
            assert first in procs
            for i in range(40):
                bus.publish(stream, place(i))
            wait_for(lambda: len(objects_by_workload(kube_api, kube_namespace)) >= 5, timeout=60)
            os.kill(procs[first].pid, signal.SIGKILL)
            procs[first].wait(timeout=10)
            killed_at = time.monotonic()
            for i in range(40, 60):
                bus.publish(stream, place(i))
            second = next(n for n in procs if n != first)
            wait_for(lambda: holder(kube_api, kube_namespace) == second, timeout=60)
            counts = wait_for(lambda: (c := objects_by_workload(kube_api, kube_namespace)) and len(c) == 60 and c,
                              timeout=90)
            took_over_s = time.monotonic() - killed_at
            assert set(counts.values()) == {1}, {w: n for w, n in counts.items() if n != 1}
            assert set(counts) == {f"{i:032x}" for i in range(60)}
            wait_for(lambda: bus.pending(stream, GROUP) == 0, timeout=30)
            assert procs[second].poll() is None, (tmp_path / f"{second}.log").read_text()[-3000:]
            assert took_over_s < 60
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        client.AppsV1Api(kube_api).delete_collection_namespaced_deployment(kube_namespace)
        core = client.CoreV1Api(kube_api)

        def gone() -> bool:  # before the next test: its scheduler would see these pods come and go
            core.delete_collection_namespaced_pod(kube_namespace, grace_period_seconds=0)
            return not core.list_namespaced_pod(kube_namespace).items

        wait_for(gone, timeout=60)
