"""Accepted workloads survive a restart of the global scheduler (real gRPC server, real Redis).

The idempotency promise — the same key gives the same workload, never two — must hold across a restart,
and a workload still pending when the scheduler stopped must be routed by the next one.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import grpc
import pytest

from global_scheduler.errors import error_details
from global_scheduler.scheduler import EVENTS_GROUP, GlobalScheduler
from global_scheduler.server import build_server
from global_scheduler.settings import GlobalSchedulerSettings
from global_scheduler.store import WorkloadStore, bucket_keys
from global_scheduler.validation import parse_requests
from meridian.bus import SUMMARY_STREAM, BusUnavailableError, events_stream, open_bus
from meridian.envtest import wait_for
from protos import dispatch_pb2 as dpb
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from protos import telemetry_pb2 as tpb
from tests.global_api_helpers import AUTH, spec, wait_state


def _restart(fed) -> tuple[GlobalScheduler, api_grpc.GlobalSchedulerStub, object]:
    """Stop the API and engine (clusters keep running) and start new ones on the same Redis keys."""
    settings = fed.engine.settings
    fed.server.stop(0.2)
    engine = GlobalScheduler(settings=settings, bus=open_bus(settings.bus.url, key_prefix=settings.bus.key_prefix))
    running = build_server(engine)
    fed.server = running  # the fixture stops whatever server the federation holds at teardown
    fed.engine = engine
    return engine, api_grpc.GlobalSchedulerStub(grpc.insecure_channel(f"127.0.0.1:{running.port}")), running


ON_BOTH = pytest.mark.parametrize("redis_cluster", [False, True], ids=["redis", "redis-cluster"])


@ON_BOTH
def test_idempotency_and_state_survive_a_restart(federation, redis_cluster: bool) -> None:
    fed = federation(redis_cluster=redis_cluster)
    stub = fed.stub()
    first = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="order-1"), metadata=AUTH)
    running = wait_state(stub, first.id, api.WORKLOAD_STATE_RUNNING)

    engine, stub2, _ = _restart(fed)
    assert len(engine.store) == 1
    got = stub2.GetWorkload(api.GetWorkloadRequest(id=first.id), metadata=AUTH)
    assert (got.state, got.cluster, got.attempt) == (api.WORKLOAD_STATE_RUNNING, running.cluster, running.attempt)
    again = stub2.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="order-1"), metadata=AUTH)
    assert again.id == first.id and len(engine.store) == 1
    with pytest.raises(grpc.RpcError) as err:  # the key is still bound to the first spec
        stub2.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(replicas=3), idempotency_key="order-1"),
                             metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS and error_details(err.value).workload_id == first.id
    # Nothing was dispatched a second time: the restarted engine has routed nothing.
    assert engine.dispatched_total == 0


@ON_BOTH
def test_pending_workload_is_routed_after_a_restart(federation, redis_cluster: bool) -> None:
    fed = federation(redis_cluster=redis_cluster)
    settings = fed.engine.settings
    # A workload accepted by a scheduler that stopped before routing it: only the store's record exists.
    store = WorkloadStore(open_bus(settings.bus.url, key_prefix=settings.bus.key_prefix),
                          replicas=settings.store.wait_replicas)
    w, created = store.create(spec(name="left-behind"), parse_requests(spec().requests), "k-left")
    assert created
    engine, stub2, _ = _restart(fed)
    assert wait_state(stub2, w.id, api.WORKLOAD_STATE_RUNNING).attempt == 1
    assert engine.dispatched_total == 1


def test_unreadable_record_is_skipped(redis_url: str, key_prefix: str) -> None:
    bus = open_bus(redis_url, key_prefix=key_prefix)
    good = WorkloadStore(bus)
    w, _ = good.create(spec(), parse_requests(spec().requests), "k")
    bus.hash_set(bucket_keys()[3], {"broken": b"\xff\x00not a workload"})
    restored = WorkloadStore(bus).restore()
    assert [r.id for r in restored] == [w.id]


def test_submit_while_redis_is_down_keeps_nothing(redis_server) -> None:
    settings = GlobalSchedulerSettings(api={"listen": "127.0.0.1:0"}, bus={"url": redis_server.url},
                                       routing={"policy": "karmada", "worker_process": False})
    engine = GlobalScheduler(settings=settings, bus=open_bus(redis_server.url))
    running = build_server(engine)
    try:
        stub = api_grpc.GlobalSchedulerStub(grpc.insecure_channel(f"127.0.0.1:{running.port}"))
        redis_server.kill()
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k"), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        assert error_details(err.value).reason == "STORE_UNAVAILABLE"
        assert len(engine.store) == 0
        redis_server.start()  # same port: the retry with the same key is accepted once
        first = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k"), timeout=10)
        again = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k"), timeout=10)
        assert first.id == again.id and len(engine.store) == 1
    finally:
        running.stop(0.2)


def test_terminal_workloads_are_purged_after_retention(redis_url: str, key_prefix: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1_000.0]  # the store's clock (its records' stamps), injected: no waiting for the real one
    monkeypatch.setattr("global_scheduler.store.time", SimpleNamespace(time=lambda: clock[0]))
    bus = open_bus(redis_url, key_prefix=key_prefix)
    store = WorkloadStore(bus)
    req = parse_requests(spec().requests)
    old_failed, _ = store.create(spec(name="a"), req, "ka")
    running, _ = store.create(spec(name="b"), req, "kb")
    fresh_cancelled, _ = store.create(spec(name="c"), req, "kc")
    store.update(old_failed.id, state=api.WORKLOAD_STATE_FAILED)
    store.update(running.id, state=api.WORKLOAD_STATE_RUNNING)
    cutoff = 1_500.0
    clock[0] = 2_000.0
    store.update(fresh_cancelled.id, state=api.WORKLOAD_STATE_CANCELLED)  # changed after the cutoff
    store.flush()
    assert store.purge(cutoff) == 1
    assert store.get(old_failed.id) is None and store.get(running.id) and store.get(fresh_cancelled.id)
    assert {w.id for w in WorkloadStore(bus).restore()} == {running.id, fresh_cancelled.id}
    again, created = store.create(spec(name="a"), req, "ka")  # the purged key is free again
    assert created and again.id != old_failed.id


def test_events_a_dead_instance_read_but_never_acked_are_claimed(redis_url: str, key_prefix: str) -> None:
    """The previous scheduler read a cluster's RUNNING event and died before applying it: the next one
    (another consumer name) claims it, so the workload does not stay DISPATCHED forever."""
    bus = open_bus(redis_url, key_prefix=key_prefix)
    store = WorkloadStore(bus)
    w, _ = store.create(spec(), parse_requests(spec().requests), "k")
    store.update(w.id, state=api.WORKLOAD_STATE_DISPATCHED, cluster="c1", region="eu-north", attempt=1)
    store.flush()
    bus.publish(SUMMARY_STREAM, tpb.ClusterSummary(
        cluster="c1", region="eu-north", sequence=1, generated_unix_ms=int(time.time() * 1000), nodes_total=1,
        nodes_schedulable=1, allocatable=tpb.ResourceVector(milli_cpu=64_000, memory_bytes=2**38)).SerializeToString())
    stream = events_stream("c1")
    bus.ensure_group(stream, EVENTS_GROUP, start_id="0")
    bus.publish(stream, dpb.PlacementEvent(workload_id=w.id, attempt=1, cluster="c1",
                                           phase=dpb.PLACEMENT_PHASE_RUNNING).SerializeToString())
    assert len(bus.read_group(stream, EVENTS_GROUP, "global-dead", count=10)) == 1  # read, never acked
    # claim_idle_ms far beyond the test: only the new engine's first look (everything pending is a
    # predecessor's) can take the entry, not a periodic claim of entries idle long enough.
    settings = GlobalSchedulerSettings(api={"listen": "127.0.0.1:0"},
                                       bus={"url": redis_url, "key_prefix": key_prefix, "claim_idle_ms": 3_600_000},
                                       # c1 sends one summary: under load the engine's start-up alone can
                                       # outlast a normal timeout and c1 would be judged down (not this test)
                                       registry={"cluster_timeout_s": 600.0},
                                       routing={"policy": "karmada"})
    engine = GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix))
    running = build_server(engine)
    try:
        wait_for(lambda: engine.store.get(w.id).state == api.WORKLOAD_STATE_RUNNING,
                 timeout=60, interval=0.05,
                 message="the claimed RUNNING event to be applied")
        wait_for(lambda: bus.pending(stream, EVENTS_GROUP) == 0, timeout=60, interval=0.05,
                 message="the claimed event to be acknowledged")
    finally:
        running.stop(0.2)


class _HeldHashBus:
    """The real Redis bus, with each hash write held until the test sets ``release``, so that submissions
    overlap it for as long as the test needs, however slowly the threads run."""

    def __init__(self, bus) -> None:
        self._bus = bus
        self.writes: list[int] = []  # records per hash write
        self.started = threading.Event()  # a hash write has begun (and is held)
        self.release = threading.Event()  # lets the held writes, and every later one, through

    def hash_set(self, key: str, items, *, replicas: int = 0) -> None:
        self.started.set()
        assert self.release.wait(30), "the test never released the held hash write"
        self.writes.append(len(items))
        self._bus.hash_set(key, items, replicas=replicas)

    def __getattr__(self, name: str):
        return getattr(self._bus, name)


def test_concurrent_submissions_share_writes_and_stay_invisible_until_written(redis_url: str,
                                                                              key_prefix: str) -> None:
    bus = _HeldHashBus(open_bus(redis_url, key_prefix=key_prefix))
    store = WorkloadStore(bus, buckets=1)  # one bucket: one batch is one hash write
    req = parse_requests(spec().requests)
    results: list[tuple[api.Workload, bool]] = []
    submitting = threading.Semaphore(0)  # released once per thread that is about to call create

    def submit(key: str) -> None:
        submitting.release()
        results.append(store.create(spec(name=key), req, key))

    first = threading.Thread(target=submit, args=("k0",))
    first.start()
    assert bus.started.wait(5)
    # While k0's write is in flight (held until ``release``), 20 more arrive (and k0 again): none is
    # visible before it is written.
    threads = [threading.Thread(target=submit, args=(f"k{i}",)) for i in range(1, 21)]
    threads.append(threading.Thread(target=submit, args=("k0",)))
    for t in threads:
        t.start()
    for _ in range(1 + len(threads)):
        assert submitting.acquire(timeout=10)
    assert len(store) == 0
    bus.release.set()
    for t in [first, *threads]:
        t.join(10)
    assert len(store) == 21 and sum(created for _, created in results) == 21
    by_key: dict[str, set[str]] = {}
    for w, _ in results:
        by_key.setdefault(w.idempotency_key, set()).add(w.id)
    assert all(len(ids) == 1 for ids in by_key.values())  # the repeated key got the same workload
    # The 21 records took far fewer than 21 round trips, and every one is in Redis.
    assert sum(bus.writes) == 21 and len(bus.writes) <= 4
    assert {w.id for w in WorkloadStore(bus).restore()} == {w.id for w, _ in results}


def test_a_failed_batch_write_fails_every_submission_in_it_and_keeps_nothing(redis_server) -> None:
    bus = _HeldHashBus(open_bus(redis_server.url))
    store = WorkloadStore(bus, buckets=1)  # one bucket: one batch is one hash write
    req = parse_requests(spec().requests)
    errors: list[BaseException] = []

    def submit(key: str) -> None:
        try:
            store.create(spec(name=key), req, key)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(f"k{i}",)) for i in range(6)]
    threads[0].start()
    assert bus.started.wait(5)
    redis_server.kill()  # the writes now in flight or waiting all fail
    for t in threads[1:]:
        t.start()
    bus.release.set()  # k0's write goes on only now, to the dead server
    for t in threads:
        t.join(30)
    assert len(errors) == 6 and all(isinstance(e, BusUnavailableError) for e in errors)
    assert len(store) == 0
    redis_server.start()
    w, created = store.create(spec(name="k3"), req, "k3")  # the key is free again
    assert created and [r.id for r in WorkloadStore(bus).restore()] == [w.id]
