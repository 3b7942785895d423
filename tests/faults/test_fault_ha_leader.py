"""High availability: two global scheduler replicas (``meridian global-scheduler --ha``) on one private Redis,
two simulated regional clusters; load is submitted through both replicas' APIs, then the leader is killed
(``kill -9``) mid-load. Real processes, real gRPC on loopback.

Invariants: the follower takes over within the lease duration plus a bound; every submission that was
acknowledged (through either replica) is present in the surviving replica and ends RUNNING; a key is
never two workloads; no workload is dispatched twice (its place messages are one per attempt, all of
attempt 1 — nothing was rerouted — and all to the cluster it runs on) and each cluster applied each of
its workloads once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import grpc
import pytest

from global_scheduler.leadership import LeaderRecord
from global_scheduler.store import bucket_keys
from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from tests.faults.conftest import Rig
from tests.faults.harness import (
    RETRYABLE,
    Load,
    SchedulerProcess,
    assert_dispatched_once,
    assert_held_once,
    assert_no_cluster_declared_down,
    workload_spec,
)

pytestmark = pytest.mark.faults

CLUSTERS = ("north-1", "central-1")
RUNNING = {api.WORKLOAD_STATE_RUNNING}
LEASE_S, RENEW_DEADLINE_S, RETRY_S = 2.0, 1.4, 0.2
# Failover bound beyond the lease: a retry period, the new leader's restore and start, a loaded CI machine.
TAKEOVER_BOUND_S = LEASE_S + 8.0
HA = {"ha__enabled": "true", "ha__lease_duration_s": LEASE_S, "ha__renew_deadline_s": RENEW_DEADLINE_S,
      "ha__retry_period_s": RETRY_S, "ha__forward_timeout_s": 10.0}


def replica(rig: Rig, name: str, redis_url: str) -> SchedulerProcess:
    proc = SchedulerProcess(redis_url=redis_url, log=rig.tmp / f"global-scheduler-{name}.log", **HA)
    rig.components.append(proc)
    proc.start()
    return proc


def leader_record(rig_redis) -> LeaderRecord | None:
    return LeaderRecord.parse(rig_redis.client().get("meridian:global:leader"))


@dataclass
class TwoReplicaLoad(Load):
    """Client threads, half of them on each replica; a call that fails UNAVAILABLE (the replica died, or no
    leader yet) is retried with the same key, on the other replica after a failure (as a Service would)."""

    replicas: tuple[SchedulerProcess, ...] = ()
    threads: int = 6
    errors_seen: int = 0
    _on: dict[int, int] = field(default_factory=dict)  # client thread → the replica it sends to

    def submit_one(self, thread: int, key: str) -> api.Workload:
        which = self._on.setdefault(thread, thread % 2)
        end = time.monotonic() + 60
        while True:
            try:
                return self.replicas[which].stub().SubmitWorkload(
                    api.SubmitWorkloadRequest(spec=workload_spec(key), idempotency_key=key), timeout=5)
            except grpc.RpcError as exc:
                with self._lock:
                    self.errors_seen += 1
                if exc.code() not in RETRYABLE or time.monotonic() > end:
                    raise
                which = self._on[thread] = 1 - which
                time.sleep(0.05)  # a client's retry pacing (the behaviour imitated), not a wait for something


def test_kill_9_of_the_leader_under_load_fails_over_without_loss_or_double_dispatch(rig: Rig) -> None:
    redis = rig.redis()
    for i, cluster in enumerate(CLUSTERS):
        rig.worker(cluster, redis.url, node_offset=4 * i)
    first = replica(rig, "a", redis.url)
    first.wait_serving()
    second = replica(rig, "b", redis.url)
    second.wait_serving()
    by_address = {f"127.0.0.1:{p.port}": p for p in (first, second)}
    record = wait_for(lambda: leader_record(redis), timeout=30, message="a leader to be elected")
    leader = by_address[record.advertise]
    follower = second if leader is first else first
    follower.wait_clusters(CLUSTERS)  # through the follower: forwarded to the leader

    keys = [f"order-{i:03d}" for i in range(300)]
    load = TwoReplicaLoad(first, keys, replicas=(first, second))
    load.start()
    wait_for(lambda: len(load.snapshot()) >= 60,
             timeout=30, interval=0.01, message="60 acknowledged submissions")
    leader.kill()
    killed_at = time.monotonic()
    before_kill = load.snapshot()
    assert len(before_kill) < len(keys), "the load ended before the kill; nothing was in flight"

    def taken_over() -> bool:
        now = leader_record(redis)
        return now is not None and now.epoch > record.epoch and by_address.get(now.advertise) is follower

    wait_for(taken_over, timeout=TAKEOVER_BOUND_S, interval=0.05, message="the follower to take the lock")
    follower.stub().ListClusters(api.ListClustersRequest(), timeout=TAKEOVER_BOUND_S)  # served by the new leader
    takeover_s = time.monotonic() - killed_at
    assert takeover_s <= TAKEOVER_BOUND_S, takeover_s
    load.join(timeout_s=90)

    ids = load.snapshot()
    assert len(ids) == len(keys)
    for key, wid in before_kill.items():  # acknowledged before the kill: the same workload after it
        assert ids[key] == wid
    for wid in list(before_kill.values())[:20]:  # Get on the survivor
        assert follower.stub().GetWorkload(api.GetWorkloadRequest(id=wid), timeout=5).id == wid
    settled = follower.wait_all(ids.values(), RUNNING, timeout_s=60)
    assert all(w.cluster in CLUSTERS for w in settled.values())
    assert len(follower.workloads()) == len(keys)  # one workload per key
    client = redis.client()
    assert_dispatched_once(client, CLUSTERS, settled)
    assert_held_once(client, CLUSTERS, settled)
    assert_no_cluster_declared_down(follower)
    print(f"takeover {takeover_s:.2f} s after the kill (lease {LEASE_S} s); "
          f"{load.errors_seen} submit calls failed and were retried during the failover")


def test_a_leader_dying_between_the_durable_write_and_the_publish_is_healed_by_the_next_leader(rig: Rig) -> None:
    redis = rig.redis()
    grace = {"reconcile__grace_s": 3.0}
    # The first leader dies at its first dispatch publish, after store.flush() (tests/faults/inject.py).
    doomed = SchedulerProcess(redis_url=redis.url, log=rig.tmp / "global-scheduler-a.log",
                              inject="crash-before-dispatch", **HA, **grace)
    rig.components.append(doomed)
    doomed.start()
    doomed.wait_serving()
    wait_for(lambda: leader_record(redis), timeout=30, message="a leader to be elected")
    survivor = SchedulerProcess(redis_url=redis.url, log=rig.tmp / "global-scheduler-b.log", **HA, **grace)
    rig.components.append(survivor)
    survivor.start()
    survivor.wait_serving()
    # Accepted through the follower (forwarded) while no cluster has reported: routed together in one batch.
    ids = {}
    for i in range(12):
        key = f"job-{i}"
        ids[key] = survivor.stub().SubmitWorkload(api.SubmitWorkloadRequest(spec=workload_spec(key),
                                                                            idempotency_key=key), timeout=10).id
    for i, cluster in enumerate(CLUSTERS):
        rig.worker(cluster, redis.url, node_offset=4 * i)
    wait_for(lambda: doomed.exited() is not None,
             timeout=30, message="the leader to crash at its first dispatch")
    client = redis.client()
    stranded = {k.decode() for key in bucket_keys() for k, v in client.hgetall(key).items()
                if api.Workload.FromString(v).state == api.WORKLOAD_STATE_DISPATCHED}
    assert stranded, "the crash left nothing DISPATCHED"
    settled = survivor.wait_all(ids.values(), RUNNING, timeout_s=60)
    # The stranded attempt 1 was published by the new leader's reconciliation, to the cluster it had been
    # routed to (never a second attempt, never another cluster); each cluster holds each workload once.
    assert_dispatched_once(client, CLUSTERS, settled, republished=True)
    assert_held_once(client, CLUSTERS, settled)
    assert "reconciliation published" in survivor.output()
