"""The global scheduler dies (``kill -9``) under load, or between making an attempt durable and publishing it;
a new one starts on the same Redis. Real processes, a private Redis.

Invariants: every acknowledged submission exists after the restart and ends RUNNING on a cluster
within a bound; a key is never two workloads; no workload is dispatched twice (its place messages are
all of attempt 1, to the cluster it runs on: exactly one, or, where reconciliation published it, the
same place again) and each cluster applied each of its workloads once; no cluster was declared down.
"""

from __future__ import annotations

import pytest

from global_scheduler.store import bucket_keys
from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from tests.faults.conftest import Rig
from tests.faults.harness import (
    Load,
    assert_dispatched_once,
    assert_held_once,
    assert_no_cluster_declared_down,
    free_port,
    places,
    submit,
)
from tests.faults.inject import CRASH_EXIT_CODE

pytestmark = pytest.mark.faults


CLUSTERS = ("north-1", "central-1")
RUNNING = {api.WORKLOAD_STATE_RUNNING}
GRACE_S = 3.0  # reconciliation's, where it is the healer


def test_kill_9_under_load_loses_no_acknowledged_submission(rig: Rig) -> None:
    redis = rig.redis()
    for i, cluster in enumerate(CLUSTERS):
        rig.worker(cluster, redis.url, node_offset=4 * i)
    scheduler = rig.scheduler(redis)
    scheduler.wait_serving()
    scheduler.wait_clusters(CLUSTERS)

    keys = [f"order-{i:03d}" for i in range(240)]
    load = Load(scheduler, keys, threads=4, pace_s=0.02)  # about 200 submissions per second
    load.start()
    wait_for(lambda: len(load.snapshot()) >= 40,
             timeout=30, interval=0.01, message="40 acknowledged submissions")
    scheduler.kill()  # mid-load: submissions in flight fail, their clients retry with the same key
    before_kill = load.snapshot()
    assert len(before_kill) < len(keys), "the load ended before the kill; nothing was in flight"
    scheduler.start()
    scheduler.wait_serving()
    load.join(timeout_s=60)

    ids = load.snapshot()
    assert len(ids) == len(keys)
    for key, wid in before_kill.items():  # acknowledged before the kill: the same workload after it
        assert ids[key] == wid
    settled = scheduler.wait_all(ids.values(), RUNNING, timeout_s=30)
    assert all(w.cluster in CLUSTERS for w in settled.values())
    # One workload per key, even for the keys whose first submission died with the scheduler.
    assert len(scheduler.workloads()) == len(keys)
    assert {submit(scheduler, key).id for key in keys[:10]} == {ids[key] for key in keys[:10]}
    assert_dispatched_once(redis.client(), CLUSTERS, settled)
    assert_held_once(redis.client(), CLUSTERS, settled)
    assert_no_cluster_declared_down(scheduler)


def test_a_crash_between_the_durable_write_and_the_publish_is_reconciled(rig: Rig) -> None:
    redis = rig.redis()
    # The first scheduler dies at its first dispatch publish, after store.flush() (tests/faults/inject.py).
    doomed = rig.scheduler(redis, inject="crash-before-dispatch", reconcile__grace_s=GRACE_S)
    doomed.wait_serving()
    # Accepted while no cluster has reported: they wait, and are then routed together in one batch.
    ids = {key: submit(doomed, key).id for key in (f"job-{i}" for i in range(12))}
    for i, cluster in enumerate(CLUSTERS):
        rig.worker(cluster, redis.url, node_offset=4 * i)
    wait_for(lambda: doomed.exited() is not None,
             timeout=30, message="the scheduler to crash at its first dispatch")
    assert doomed.exited() == CRASH_EXIT_CODE, doomed.output()[-3000:]

    client = redis.client()
    records = {wid: api.Workload.FromString(raw) for wid, raw in
               ((k.decode(), v) for key in bucket_keys() for k, v in client.hgetall(key).items())}
    assert set(records) == set(ids.values())
    stranded = {wid for wid, w in records.items() if w.state == api.WORKLOAD_STATE_DISPATCHED}
    assert stranded, "the crash left nothing DISPATCHED"
    assert not places(client, CLUSTERS), "a place message was published before the crash"

    scheduler = rig.scheduler(redis, metrics_port=free_port(), reconcile__grace_s=GRACE_S)
    scheduler.wait_serving()
    # Bound: a summary made a grace (3 s) after the start, the next pass (0.5 s), then the cluster's events.
    settled = scheduler.wait_all(ids.values(), RUNNING, timeout_s=30)
    # The stranded attempt 1 was published by reconciliation, to the cluster it had been routed to; a
    # loaded machine may have it published once more (the same place: held once, checked below).
    assert_dispatched_once(client, CLUSTERS, settled, republished=True)
    assert all(settled[wid].cluster == records[wid].cluster for wid in stranded)
    assert_held_once(client, CLUSTERS, settled)
    assert scheduler.metric("meridian_reconciliations_total",
                            {"action": "republish", "reason": "place_lost"}) == len(stranded)
    assert "reconciliation published" in scheduler.output()
    assert_no_cluster_declared_down(scheduler)
