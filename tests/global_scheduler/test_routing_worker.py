"""Routing in a child process (``routing.worker_process``): the same decisions as in the API's process,
and a worker that dies costs no workload and no duplicate (the pass is routed in-process and a new
worker starts). Real worker processes, real gRPC server, real Redis."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from prometheus_client import REGISTRY

from global_scheduler import routing_pass
from global_scheduler.registry import ClusterRegistry
from global_scheduler.routing.base import DEFER, Router
from global_scheduler.routing.registry import get_policy
from global_scheduler.routing_pass import PassItem, RoutingWorker, decide_pass
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus import open_bus
from meridian.envtest import wait_for
from meridian.routing_domain import WorkloadFeatures
from protos import global_api_pb2 as api
from protos import telemetry_pb2 as tpb
from tests.global_api_helpers import AUTH, spec, wait_state

GIB = 2**30


def _snapshot():
    reg = ClusterRegistry()
    regions = ["eu-north", "eu-central", "eu-west", "us-west"]
    for i in range(8):
        free = 64_000 - 7_000 * i
        reg.apply(tpb.ClusterSummary(
            cluster=f"c{i}", region=regions[i % 4], sequence=1, nodes_total=8, nodes_schedulable=8,
            allocatable=tpb.ResourceVector(milli_cpu=64_000, memory_bytes=256 * GIB, gpu=4),
            free=tpb.ResourceVector(milli_cpu=free, memory_bytes=200 * GIB, gpu=2), gpu_devices_idle=2,
            max_node_free_milli_cpu=8_000, max_node_free_memory_bytes=32 * GIB,
            carbon_g_per_kwh=30.0 + 50 * i, pue=1.2))
    names, regions, feats = reg.features()
    feats.tightest_slo_utilisation = np.ones(len(names))  # the engine's view: no SLO running yet
    return names, regions, feats


def _items(n_regions: int) -> list[PassItem]:
    items = []
    rng = np.random.default_rng(3)
    for k in range(40):
        replicas = int(rng.integers(1, 6))
        cpu = float(rng.choice([500.0, 2000.0, 6000.0]))
        sensitive = k % 3 == 0
        wf = WorkloadFeatures(
            replicas=replicas, milli_cpu=cpu, memory_bytes=2.0 * GIB, gpu=float(k % 7 == 0),
            origin_region=k % n_regions if sensitive else -1, latency_slo_ms=60.0 if sensitive else 0.0,
            allowed_regions=None, deferrable=k % 5 == 1, deadline_hours=6.0 if k % 5 == 1 else 0.0,
            weights=(0.7, 0.05, 0.15, 0.1) if sensitive else (0.1, 0.1, 0.7, 0.1), expected_duration_h=4.0)
        items.append(PassItem(wf, frozenset({"c0"}) if k % 4 == 2 else frozenset(),
                              (replicas * cpu, replicas * 2.0 * GIB, replicas * float(k % 7 == 0))))
    return items


def test_worker_decides_like_the_api_process() -> None:
    names, regions, feats = _snapshot()
    items = _items(len(regions))
    local = decide_pass(Router(get_policy("gnn")), names, copy.deepcopy(feats), items)
    worker = RoutingWorker("gnn", nice=3)
    try:
        pid = worker.start()
        # Routing yields the cores to the API's process (routing.worker_nice).
        assert os.getpriority(os.PRIO_PROCESS, pid) == os.getpriority(os.PRIO_PROCESS, 0) + 3
        remote = worker.run(names, feats, items)
    finally:
        worker.close()
    assert remote.pid == pid != os.getpid() and local.pid == os.getpid()
    assert [d.cluster for d in remote.decisions] == [d.cluster for d in local.decisions]
    assert [(d.diagnosis, d.explain, d.slo_crit) for d in remote.decisions] == \
        [(d.diagnosis, d.explain, d.slo_crit) for d in local.decisions]
    # The pass really reserved as it went: the batch spread over several clusters, and c0 was never
    # given to a workload that had been rejected there.
    assert len({d.cluster for d in local.decisions if d.cluster >= 0}) > 1
    assert all(not (it.excluded and d.cluster == names.index("c0")) for it, d in zip(items, local.decisions,
                                                                                      strict=True))
    assert any(d.cluster == DEFER for d in local.decisions) or any(d.slo_crit for d in local.decisions)


def _fallbacks(policy: str) -> float:
    return REGISTRY.get_sample_value("meridian_policy_fallbacks_total", {
        "component": "global", "policy": policy, "reason": "routing worker failed"}) or 0.0


class _RoutingWorkerClock:
    """``routing_pass``'s view of the ``time`` module, with a monotonic clock the test moves forward by hand
    (the worker's back-off is measured on it), so no test waits the back-off out in real time."""

    def __init__(self) -> None:
        self.offset_s = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.offset_s

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_killed_worker_loses_nothing_and_is_replaced(federation, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = _RoutingWorkerClock()
    monkeypatch.setattr(routing_pass, "time", clock)
    fed = federation(routing_worker=True)
    engine = fed.engine
    stub = fed.stub()
    first_pid = engine.worker.pid
    assert first_pid and first_pid != os.getpid()

    def submit(keys: list[str]) -> list[str]:
        ids = [stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key=k),
                                   metadata=AUTH).id for k in keys]
        for wid in ids:
            wait_state(stub, wid, api.WORKLOAD_STATE_RUNNING)
        return ids

    before = submit([f"a{i}" for i in range(3)])
    assert engine.routed_by[first_pid] == 3 and engine.routed_by[os.getpid()] == 0

    failed_before = _fallbacks(engine.policy_name)
    # A back-off far longer than the test: the worker stays down however slowly the passes below run.
    engine.worker.retry_after_s = 3600.0
    os.kill(first_pid, signal.SIGKILL)
    during = submit([f"b{i}" for i in range(3)])  # routed in the API's process while the worker is down
    assert engine.routed_by[os.getpid()] >= 1
    assert _fallbacks(engine.policy_name) == failed_before + 1

    clock.offset_s += 3600.0  # the back-off is over: the next pass starts a new worker
    after = submit([f"c{i}" for i in range(3)])
    wait_for(lambda: engine.worker.pid not in (None, first_pid), message="a new routing worker")
    assert engine.worker.restarts == 1 and engine.routed_by[engine.worker.pid] >= 1
    # Every workload ran once, on its first attempt: nothing was lost or dispatched twice.
    ids = before + during + after
    assert len(set(ids)) == 9 and engine.dispatched_total == 9
    assert all(stub.GetWorkload(api.GetWorkloadRequest(id=w), metadata=AUTH).attempt == 1 for w in ids)


def test_a_policy_object_with_a_worker_process_is_refused(redis_url: str, key_prefix: str) -> None:
    settings = GlobalSchedulerSettings(bus={"url": redis_url, "key_prefix": key_prefix},
                                       routing={"policy": "karmada", "worker_process": True})
    with pytest.raises(ValueError, match="worker_process"):
        GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix),
                        policy=get_policy("karmada"))



def test_the_parent_watch_exits_once_reparented() -> None:
    """The worker's parent watch (``_exit_with_parent``): it waits while its parent lives and leaves when it
    has been re-parented (the parent was killed outright and never shut the pool down)."""
    code = ("from global_scheduler.routing_pass import _exit_with_parent\n"
            "_exit_with_parent({parent}, every_s=0.01)\nprint('returned')\n")
    orphaned = subprocess.run([sys.executable, "-c", code.format(parent=2**22 + 1)], capture_output=True,
                              text=True, timeout=60)
    assert orphaned.returncode == 0 and orphaned.stdout == ""  # left through os._exit, not by returning
    watching = subprocess.Popen([sys.executable, "-c", code.format(parent=os.getpid())], stdout=subprocess.PIPE)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            watching.wait(3)  # its parent (this process) is alive: it keeps watching
    finally:
        watching.kill()
        watching.wait(10)
