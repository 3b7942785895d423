"""A Redis Cluster primary killed (``SIGKILL``) while agents publish telemetry, a consumer group reads it and
operators submit workloads: Redis Cluster's own failover promotes the replica, the redis-py bus follows the new
topology, and nothing acknowledged is lost beyond what asynchronous replication allows.

* Telemetry (plain ``XADD``): producers and the consumer carry on after the failover. Reports the old primary
  acknowledged but had not yet sent to its replica are lost; the test measures how many and checks they are
  at most what was acknowledged in the moments before the kill (the replication lag window), never entries
  acknowledged after the failover.
* Workloads (store writes confirmed by ``WAIT 1``): every submission that was answered is in the store after
  the failover, exactly once per idempotency key, so none is lost and none routed twice. Until the killed node
  is back as a replica, writes to the buckets of its shard are refused (a primary without a replica cannot
  confirm one) and the clients retry with their keys.

Run with ``-s`` to see the measured figures (docs/redis-cluster.md quotes them).
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

import pytest

from global_scheduler.store import WorkloadStore, bucket_keys
from global_scheduler.validation import parse_requests
from meridian.bus import BusError, StreamBus, open_bus, telemetry_stream
from meridian.envtest import wait_for
from tests.global_api_helpers import spec
from tests.redis_cluster import start_cluster

pytestmark = pytest.mark.faults

STREAM = telemetry_stream("failover")
PREFIX = "fo:"


@dataclass
class Published:
    """What producers were told was written: (payload, time acknowledged)."""

    acked: list[tuple[bytes, float]] = field(default_factory=list)
    failures: int = 0


def _produce(bus: StreamBus, out: Published, stop: threading.Event, worker: int) -> None:
    seq = 0
    while not stop.is_set():
        batch = [b"w%d-%08d" % (worker, seq + i) for i in range(50)]
        try:
            bus.publish_many(STREAM, batch, maxlen=None)
        except BusError:
            out.failures += 1  # not acknowledged: the agent keeps them buffered and resends (new payloads here)
            time.sleep(0.05)
        else:
            now = time.monotonic()
            out.acked.extend((p, now) for p in batch)
        seq += len(batch)
        time.sleep(0.005)


def _consume(bus: StreamBus, seen: set[bytes], stop: threading.Event, errors: list[str]) -> None:
    bus.ensure_group(STREAM, "regional")
    while not stop.is_set():
        try:
            entries = bus.read_group(STREAM, "regional", "c1", count=500, block_ms=100)
            seen.update(e.payload for e in entries)
            bus.ack(STREAM, "regional", [e.entry_id for e in entries])
        except BusError as exc:
            errors.append(str(exc))
            time.sleep(0.05)


def _submit(store: WorkloadStore, acked: dict[str, str], stop: threading.Event, worker: int,
            retries: list[int]) -> None:
    """An operator's client: each idempotency key is retried until it is answered."""
    requests = parse_requests(spec().requests)
    n = 0
    while not stop.is_set():
        key = f"op{worker}-{n}"
        while not stop.is_set():
            try:
                w, _ = store.create(spec(name=key), requests, key)
            except BusError:
                retries.append(1)
                time.sleep(0.05)
                continue
            acked[key] = w.id
            break
        n += 1
        time.sleep(0.01)


def test_a_killed_primary_fails_over_without_losing_acknowledged_workloads() -> None:
    cluster = start_cluster(node_timeout_ms=1000)
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        buses = [open_bus(cluster.url, key_prefix=PREFIX) for _ in range(5)]
        published = [Published(), Published()]
        seen: set[bytes] = set()
        consumer_errors: list[str] = []
        acked_workloads: dict[str, str] = {}
        submit_retries: list[int] = []
        stores = [WorkloadStore(buses[3], replicas=1), WorkloadStore(buses[4], replicas=1)]
        threads = [threading.Thread(target=_produce, args=(buses[i], published[i], stop, i)) for i in range(2)]
        threads.append(threading.Thread(target=_consume, args=(buses[2], seen, stop, consumer_errors)))
        threads += [threading.Thread(target=_submit, args=(stores[i], acked_workloads, stop, i, submit_retries))
                    for i in range(2)]
        for t in threads:
            t.start()
        wait_for(lambda: len(seen) > 2000 and len(acked_workloads) > 50, timeout=30,
                 message="steady load before the kill")

        victim = cluster.owner_of(PREFIX + STREAM)
        buckets_on_victim = sum(cluster.owner_of(PREFIX + key) == victim for key in bucket_keys())
        assert buckets_on_victim, "no workload bucket on the killed primary: the store's failover is not exercised"
        acked_before = sum(len(p.acked) for p in published)
        killed_at = time.monotonic()
        cluster.kill(victim)

        def recovered() -> bool:
            return all(any(t > killed_at for _, t in p.acked[-50:]) for p in published)

        wait_for(recovered, timeout=30, message="both producers to publish again after the failover")
        # The outage as producers saw it: the longest silence between two acknowledged batches of one producer.
        outage_s = max(max(b - a for a, b in itertools.pairwise(times))
                       for times in ([t for _, t in p.acked[::50]] for p in published))
        # The promoted replica has no replica of its own, so WAIT 1 writes to its buckets are refused (and
        # retried) until the killed node is back: restarted, as a pod would be, it rejoins as a replica. Not
        # before the failover: a primary restarted empty before its replica took over would wipe the replica.
        wait_for(lambda: victim not in cluster.primary_ports() and len(cluster.primary_ports()) == 3, timeout=30,
                 message="the replica to take over")
        cluster.restart(victim)
        wait_for(lambda: cluster.node(victim).info("replication").get("master_link_status") == "up", timeout=30,
                 message="the restarted node to sync as a replica")
        rejoined_s = time.monotonic() - killed_at
        workloads_at_resume = len(acked_workloads)
        wait_for(lambda: len(acked_workloads) > workloads_at_resume + 50, timeout=30,
                 message="submissions to be answered again after the failover")
        time.sleep(1.0)
        stop.set()
        for t in threads:
            t.join(timeout=30)
        assert victim not in cluster.primary_ports()

        # Telemetry: what is in the stream now, on the promoted replica.
        reader = open_bus(cluster.url, key_prefix=PREFIX)
        stored = {e.payload for e in reader.read_range(STREAM)}
        acked = [(payload, at) for p in published for payload, at in p.acked]
        lost = [(payload, at) for payload, at in acked if payload not in stored]
        after = [payload for payload, at in acked if at > killed_at]
        assert after and all(payload in stored for payload in after), "a report acknowledged after the failover is gone"
        window_s = max((killed_at - at for _, at in lost), default=0.0)
        print(f"\nfailover: producers' longest silence {outage_s:.2f} s, the restarted node was a synced "
              f"replica {rejoined_s:.2f} s after it; {len(acked)} reports acknowledged "
              f"({acked_before} before the kill), {len(lost)} lost, all acknowledged within {window_s * 1000:.0f} ms "
              f"before it; {sum(p.failures for p in published)} publish calls refused during the failover; "
              f"consumer saw {len(seen)} ({len(consumer_errors)} read errors); {len(acked_workloads)} workloads "
              f"answered ({len(submit_retries)} retries), the victim owned the stream and "
              f"{buckets_on_victim}/{len(bucket_keys())} workload buckets")
        assert window_s < 1.0, f"reports acknowledged {window_s:.2f} s before the kill were lost: not replication lag"
        assert seen & set(after), "the consumer read nothing published after the failover"

        # Workloads: every answered submission is there, once per key, with the id its client was given.
        restored = WorkloadStore(reader).restore()
        by_key: dict[str, list[str]] = {}
        for w in restored:
            by_key.setdefault(w.idempotency_key, []).append(w.id)
        missing = [k for k, wid in acked_workloads.items() if by_key.get(k) != [wid]]
        assert not missing, f"{len(missing)} answered workloads lost or doubled, e.g. {missing[:3]}"
        assert all(len(ids) == 1 for ids in by_key.values())
        reader.close()
        for bus in buses:
            bus.close()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        cluster.stop()
