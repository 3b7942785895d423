"""The leader lock of the global scheduler's high availability (global_scheduler/leadership.py) on a real Redis:
acquire, renew and lose with an injected clock (the renew deadline is judged by the replica's own clock,
so no sleeps), and fencing: a deposed leader's store write of a new attempt is refused and nothing is
published."""

from __future__ import annotations

import time

import pytest
import redis

from global_scheduler.leadership import Fence, FencedError, LeaderElector, LeaderRecord, RedisLease
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.settings import GlobalSchedulerSettings, HaSettings
from global_scheduler.store import DEFAULT_BUCKETS, WorkloadStore, bucket_key, bucket_keys
from global_scheduler.validation import parse_requests
from meridian.bus import dispatch_stream, open_bus
from protos import global_api_pb2 as api
from protos import telemetry_pb2 as tpb


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _client(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)


def _elector(url: str, prefix: str, name: str, clock: Clock, events: list[str]) -> LeaderElector:
    return LeaderElector(RedisLease(_client(url), key_prefix=prefix), instance=name, advertise=f"{name}:1",
                         lease_duration_s=5.0, renew_deadline_s=3.5, retry_period_s=0.5, clock=clock,
                         on_started=lambda r: events.append(f"{name} started {r.epoch}"),
                         on_stopped=lambda: events.append(f"{name} stopped"))


def test_acquire_renew_and_lose_to_another_holder(redis_url: str, key_prefix: str) -> None:
    clock, events = Clock(), []
    a = _elector(redis_url, key_prefix, "a", clock, events)
    b = _elector(redis_url, key_prefix, "b", clock, events)
    a.step()
    b.step()
    assert a.is_leader() and not b.is_leader()
    assert events == ["a started 1"]
    assert b.leader is not None and (b.leader.instance, b.leader.advertise, b.leader.epoch) == ("a", "a:1", 1)
    raw = _client(redis_url).get(key_prefix + "meridian:global:leader")
    assert LeaderRecord.parse(raw) == a.record
    ttl_ms = _client(redis_url).pttl(key_prefix + "meridian:global:leader")
    assert 0 < ttl_ms <= 5000
    clock.t += 3.0
    a.step()  # renewed: the deadline moves with it
    clock.t += 3.0
    assert a.is_leader()
    # The lock expires (simulated: deleted) and b takes it with a larger epoch; a's next renewal is refused.
    _client(redis_url).delete(key_prefix + "meridian:global:leader")
    b.step()
    assert b.is_leader() and b.record is not None and b.record.epoch == 2
    a.step()
    assert not a.is_leader() and a.record is None
    assert events == ["a started 1", "b started 2", "a stopped"]
    # A graceful stop hands the lock over at once (compare-and-delete).
    b.stop()
    assert events[-1] == "b stopped"
    a.step()
    assert a.is_leader() and a.record is not None and a.record.epoch == 3


def test_a_leader_that_cannot_renew_stops_at_its_renew_deadline(redis_server) -> None:
    clock, events = Clock(), []
    a = _elector(redis_server.url, "", "a", clock, events)
    a.step()
    assert a.is_leader()
    redis_server.kill()  # renewals fail from now on
    clock.t += 2.0
    a.step()
    assert a.is_leader() and events == ["a started 1"]  # within the deadline: still leading
    clock.t += 1.4
    assert a.is_leader()
    clock.t += 0.1  # 3.5 s since the last renewal was sent: below the 5 s lease, it stops
    assert not a.is_leader() and a.token() is None  # the API and the fence see it at once
    a.step()
    assert events == ["a started 1", "a stopped"] and a.record is None


def test_the_settings_order_the_timings() -> None:
    with pytest.raises(ValueError, match="renew_deadline_s"):
        HaSettings(lease_duration_s=3.0, renew_deadline_s=3.0)
    assert not HaSettings().enabled  # one replica unless asked


def test_a_stale_token_cannot_write_the_store(redis_url: str, key_prefix: str) -> None:
    clock, events = Clock(), []
    a = _elector(redis_url, key_prefix, "a", clock, events)
    b = _elector(redis_url, key_prefix, "b", clock, events)
    a.step()
    bus = open_bus(redis_url, key_prefix=key_prefix)
    store = WorkloadStore(bus, fence=Fence(a.lease, a.token))
    spec = api.WorkloadSpec(name="x", tenant="t", replicas=1, requests=api.ResourceQuantities(cpu="1", memory="1Gi"))
    w, created = store.create(spec, parse_requests(spec.requests), "k1")
    assert created
    _client(redis_url).delete(key_prefix + "meridian:global:leader")  # a's lease expired; b leads
    b.step()
    store.update(w.id, state=api.WORKLOAD_STATE_DISPATCHED, cluster="c", attempt=1)
    with pytest.raises(FencedError):  # a still believes it leads (no renewal yet): Redis refuses the token
        store.flush()
    with pytest.raises(FencedError):
        store.create(spec, parse_requests(spec.requests), "k2")
    kept = {k.decode(): api.Workload.FromString(v)
            for key in bucket_keys() for k, v in _client(redis_url).hgetall(key_prefix + key).items()}
    assert list(kept) == [w.id] and kept[w.id].attempt == 0  # nothing of the deposed leader's writes landed
    # Once its own clock says the deadline passed it refuses without asking Redis.
    clock.t += 10
    with pytest.raises(FencedError, match="not the leader"):
        store.flush()


def _summary(cluster: str) -> tpb.ClusterSummary:
    return tpb.ClusterSummary(
        cluster=cluster, region="eu-north", sequence=1, generated_unix_ms=int(time.time() * 1000), nodes_total=1,
        nodes_schedulable=1, allocatable=tpb.ResourceVector(milli_cpu=64000, memory_bytes=2**38),
        free=tpb.ResourceVector(milli_cpu=64000, memory_bytes=2**38), max_node_free_milli_cpu=64000,
        max_node_free_memory_bytes=2**38)


def test_a_deposed_leader_never_publishes_a_new_attempt(redis_url: str, key_prefix: str) -> None:
    clock, events = Clock(), []
    a = _elector(redis_url, key_prefix, "a", clock, events)
    b = _elector(redis_url, key_prefix, "b", clock, events)
    a.step()
    bus = open_bus(redis_url, key_prefix=key_prefix)
    settings = GlobalSchedulerSettings(bus={"url": redis_url, "key_prefix": key_prefix},
                                       routing={"policy": "karmada", "worker_process": False})
    engine = GlobalScheduler(settings=settings, bus=bus, fence=Fence(a.lease, a.token))
    engine.registry.apply(_summary("c1"))
    spec = api.WorkloadSpec(name="x", tenant="t", replicas=1, requests=api.ResourceQuantities(cpu="1", memory="1Gi"))
    w, _ = engine.store.create(spec, parse_requests(spec.requests), "k")
    _client(redis_url).delete(key_prefix + "meridian:global:leader")
    b.step()  # b leads now; a has not noticed
    engine.route_batch([w.id])
    assert bus.read_range(dispatch_stream("c1")) == []  # the attempt was not durable, so it was not published
    back = engine.store.get(w.id)
    assert (back.state, back.attempt) == (api.WORKLOAD_STATE_PENDING, 0)  # rolled back
    stored = api.Workload.FromString(_client(redis_url).hget(key_prefix + bucket_key(w.id, DEFAULT_BUCKETS), w.id))
    assert (stored.state, stored.attempt) == (api.WORKLOAD_STATE_PENDING, 0)
    bus.close()
