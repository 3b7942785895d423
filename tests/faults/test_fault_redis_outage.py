"""Redis dies (``kill -9``) for longer than the cluster timeout while the global scheduler and the regional
workers keep running, and comes back with its data (append-only file, fsync always). Real processes.

Invariants: no cluster is ever declared down (the silence was the bus's, not the clusters'), no
workload moves (each keeps its cluster and attempt 1), everything acknowledged before the outage is
still there, and submissions work again afterwards.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from tests.faults.conftest import Rig
from tests.faults.harness import (
    assert_dispatched_once,
    assert_held_once,
    assert_no_cluster_declared_down,
    submit,
)

pytestmark = pytest.mark.faults


CLUSTERS = ("north-1", "central-1")
RUNNING = {api.WORKLOAD_STATE_RUNNING}
CLUSTER_TIMEOUT_S = 4.0
OUTAGE_S = 8.0  # twice the cluster timeout


def test_a_redis_outage_longer_than_the_cluster_timeout_moves_nothing(rig: Rig) -> None:
    redis = rig.redis(appendonly=True)
    for i, cluster in enumerate(CLUSTERS):
        rig.worker(cluster, redis.url, node_offset=4 * i)
    scheduler = rig.scheduler(redis, registry__cluster_timeout_s=CLUSTER_TIMEOUT_S)
    scheduler.wait_serving()
    scheduler.wait_clusters(CLUSTERS)
    before = {submit(scheduler, f"before-{i}").id for i in range(12)}
    placed = scheduler.wait_all(before, RUNNING, timeout_s=20)

    not_ready: list[str] = []
    stop = threading.Event()

    def watch() -> None:  # the scheduler's own view of its clusters, sampled every 50 ms through the outage and after
        while not stop.wait(0.05):
            try:
                not_ready.extend(c.name for c in scheduler.clusters() if not c.ready)
            except grpc.RpcError as exc:
                not_ready.append(f"ListClusters failed: {exc.code()}")

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        redis.kill()
        time.sleep(OUTAGE_S)  # the fault itself lasts this long; nothing is asserted on a timer
        redis.start()
        back = time.time()
        # Every cluster is heard from again, and a whole cluster timeout passes after the bus came back:
        # the moment a registry that counted the outage as silence would declare them down.
        wait_for(lambda: all(c.last_seen_unix_s > back for c in scheduler.clusters()),
                 timeout=20, message="every cluster to report after the outage")
        wait_for(lambda: time.time() > back + CLUSTER_TIMEOUT_S + 1.0,
                 timeout=10, message="a cluster timeout after the outage")
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert not_ready == []

    after = {submit(scheduler, f"after-{i}").id for i in range(4)}
    settled = scheduler.wait_all(before | after, RUNNING, timeout_s=20)
    for wid in before:  # nothing moved
        assert (settled[wid].cluster, settled[wid].attempt) == (placed[wid].cluster, 1)
    assert len(scheduler.workloads()) == len(before) + len(after)  # the store survived the restart
    assert_dispatched_once(redis.client(), CLUSTERS, settled)
    assert_held_once(redis.client(), CLUSTERS, settled)
    out = scheduler.output()
    assert "bus unavailable" in out  # the outage was seen
    assert_no_cluster_declared_down(scheduler)
    assert "reconciliation" not in out
