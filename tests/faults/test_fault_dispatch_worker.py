"""The regional dispatch worker dies (``kill -9``) with dispatches read and not acknowledged, or cannot publish
its events for a while. Real processes, a private Redis.

Here the heal must come from the stream's own redelivery (``XAUTOCLAIM`` of pending entries), so the
global reconciliation is given a grace (60 s) far beyond each test: every workload is placed by one
place message, applied once on its cluster, and ends RUNNING there.
"""

from __future__ import annotations

import pytest

from meridian.bus import dispatch_stream, events_stream
from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from tests.faults.conftest import Rig
from tests.faults.harness import (
    REDIS_PASSWORD,
    REPLICA_MILLI_CPU,
    assert_dispatched_once,
    assert_no_cluster_declared_down,
    dispatch_pending,
    latest_summary,
    submit,
)

pytestmark = pytest.mark.faults


CLUSTER = "north-1"
RUNNING = {api.WORKLOAD_STATE_RUNNING}
# The worker is silent from its hang until its successor's first summary: seconds on a loaded machine.
NO_RECONCILIATION = {"reconcile__grace_s": 60.0, "registry__cluster_timeout_s": 15.0}


def _applied_once(client, ids: set[str]) -> None:
    """The cluster holds each workload once: its summary lists them and its requested CPU is their sum."""
    def holds_them():
        s = latest_summary(client, CLUSTER)
        return s is not None and {h.workload for h in s.holdings} == ids and s

    s = wait_for(holds_them, timeout=20, message="a summary holding every workload")
    assert s.requested.milli_cpu == len(ids) * REPLICA_MILLI_CPU


def test_kill_9_of_a_worker_with_pending_dispatches(rig: Rig, tmp_path) -> None:
    redis = rig.redis()
    marker = tmp_path / "held-back"
    # It applies its first batch, then stops at the publish of its events (tests/faults/inject.py).
    doomed = rig.worker(CLUSTER, redis.url, node_offset=0, inject="hang-before-events", start=False)
    doomed.env["MERIDIAN_FAULT_MARKER"] = str(marker)
    doomed.start()
    scheduler = rig.scheduler(redis, **NO_RECONCILIATION)
    scheduler.wait_serving()
    scheduler.wait_clusters([CLUSTER])
    ids = {submit(scheduler, f"batch-{i}").id for i in range(10)}
    wait_for(marker.exists,
             timeout=20, message="the worker to read dispatches and stop before publishing their events")
    client = redis.client()
    assert dispatch_pending(client, CLUSTER) >= 1  # read, applied in its memory, not acknowledged
    doomed.kill()

    rig.worker(CLUSTER, redis.url, node_offset=0)  # a new consumer: claims what the dead one left pending
    settled = scheduler.wait_all(ids, RUNNING, timeout_s=20)
    assert all(w.cluster == CLUSTER for w in settled.values())
    wait_for(lambda: dispatch_pending(client, CLUSTER) == 0,
             timeout=10, message="every dispatch entry acknowledged")
    _applied_once(client, ids)
    assert_dispatched_once(client, [CLUSTER], settled)
    assert "reconciliation" not in scheduler.output()
    assert_no_cluster_declared_down(scheduler)


def test_events_whose_publish_fails_are_sent_on_redelivery(rig: Rig) -> None:
    """The worker's Redis user loses write access to its events stream (an ACL change: every XADD there
    answers NOPERM) while dispatches arrive, then gets it back."""
    redis = rig.redis()
    admin = redis.client()
    admin.execute_command("ACL", "SETUSER", "regional", "on", f">{REDIS_PASSWORD}", "~*", "&*", "+@all")
    worker_url = f"redis://regional:{REDIS_PASSWORD}@127.0.0.1:{redis.port}/0"
    worker = rig.worker(CLUSTER, worker_url, node_offset=0)
    scheduler = rig.scheduler(redis, **NO_RECONCILIATION)
    scheduler.wait_serving()
    scheduler.wait_clusters([CLUSTER])
    # Its dispatch stream and the summaries stay writable; meridian:{north-1}:events does not.
    admin.execute_command("ACL", "SETUSER", "regional", "resetkeys", f"~{dispatch_stream(CLUSTER)}*",
                          "~meridian:summary")
    ids = {submit(scheduler, f"job-{i}").id for i in range(8)}
    _applied_once(admin, ids)  # placed on the cluster…
    assert admin.xlen(events_stream(CLUSTER)) == 0  # …but no word of it reached the global tier
    assert dispatch_pending(admin, CLUSTER) >= 1
    assert {w.state for w in scheduler.workloads()} == {api.WORKLOAD_STATE_DISPATCHED}
    assert "NOPERM" in worker.output()

    admin.execute_command("ACL", "SETUSER", "regional", "allkeys")
    settled = scheduler.wait_all(ids, RUNNING, timeout_s=20)
    wait_for(lambda: dispatch_pending(admin, CLUSTER) == 0,
             timeout=10, message="every dispatch entry acknowledged")
    _applied_once(admin, ids)
    assert_dispatched_once(admin, [CLUSTER], settled)
    assert "reconciliation" not in scheduler.output()
    assert_no_cluster_declared_down(scheduler)
