"""Durable writes (``replicas`` > 0: the write, then ``WAIT`` on its connection) on both Redis buses, the store's
use of them, and how a process names a Redis Cluster (``redis+cluster://``) and is told when it cannot."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
import redis
from pydantic import ValidationError

from global_scheduler.settings import GlobalSchedulerSettings
from global_scheduler.store import WorkloadStore, bucket_key, bucket_keys
from global_scheduler.validation import parse_requests
from meridian.bus import (
    BusConfigError,
    BusUnavailableError,
    RedisPyStreamBus,
    RedisStreamBus,
    open_bus,
    redis_client,
)
from meridian.bus.connection import endpoint_from_url, require_redis
from meridian.envtest import wait_for
from meridian.errors import UserError
from tests.conftest import RedisServer
from tests.global_api_helpers import spec

BUSES = pytest.mark.parametrize("make", [RedisStreamBus, RedisPyStreamBus], ids=["hand-written", "redis-py"])


@pytest.fixture
def primary_with_replica(redis_server: RedisServer) -> Iterator[RedisServer]:
    """``redis_server`` with a real replica (``--replicaof``), in sync before the test starts."""
    replica = RedisServer()
    binary = shutil.which("redis-server")
    assert binary is not None
    replica.proc = subprocess.Popen(
        [binary, "--port", str(replica.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
         "--dir", replica.workdir, "--replicaof", "127.0.0.1", str(redis_server.port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = redis.Redis(port=replica.port, socket_timeout=1, decode_responses=True)
    wait_for(lambda: probe.info("replication").get("master_link_status") == "up", timeout=20,
             message="the replica to sync")
    yield redis_server
    replica.kill()
    shutil.rmtree(replica.workdir, ignore_errors=True)


@BUSES
def test_a_write_no_replica_confirms_is_not_acknowledged(make, redis_server: RedisServer) -> None:
    bus = make(redis_server.url, wait_timeout_ms=100)
    try:
        with pytest.raises(BusUnavailableError, match="reached 0 of 1 replica"):
            bus.hash_set("h", {"a": b"1"}, replicas=1)
        with pytest.raises(BusUnavailableError, match="reached 0 of 1 replica"):
            bus.hash_delete("h", ["a"], replicas=1)
        bus.hash_set("h", {"b": b"2"})  # the connection is still usable, and replicas=0 needs none
        assert dict(bus.hash_items("h"))["b"] == b"2"
    finally:
        bus.close()


@BUSES
def test_a_write_a_replica_confirms_is_on_the_replica(make, primary_with_replica: RedisServer) -> None:
    bus = make(primary_with_replica.url)
    try:
        bus.hash_set("h", {"a": b"1"}, replicas=1)
        replica_port = int(redis.Redis(port=primary_with_replica.port, decode_responses=True)
                           .info("replication")["slave0"]["port"])
        assert redis.Redis(port=replica_port).hget("h", "a") == b"1"  # WAIT returned: the replica has it
        bus.hash_delete("h", ["a"], replicas=1)
        assert redis.Redis(port=replica_port).hget("h", "a") is None
    finally:
        bus.close()


def test_a_store_without_its_replica_refuses_the_submission_and_keeps_nothing(redis_server: RedisServer) -> None:
    bus = RedisStreamBus(redis_server.url, wait_timeout_ms=100)
    store = WorkloadStore(bus, replicas=1)
    with pytest.raises(BusUnavailableError):
        store.create(spec(), parse_requests(spec().requests), "k")
    assert len(store) == 0
    bus.close()


def test_records_are_spread_over_buckets_and_restored_from_all(redis_url: str, key_prefix: str) -> None:
    bus = open_bus(redis_url, key_prefix=key_prefix)
    store = WorkloadStore(bus, buckets=8)
    requests = parse_requests(spec().requests)
    ids = [store.create(spec(name=f"w{i}"), requests, f"k{i}")[0].id for i in range(64)]
    used = {bucket_key(wid, 8) for wid in ids}
    assert len(used) >= 6 and used <= set(bucket_keys(8))
    for wid in ids:
        assert dict(bus.hash_items(bucket_key(wid, 8)))[wid]
    assert [w.id for w in WorkloadStore(bus, buckets=8).restore()] == ids
    bus.close()


def test_restore_keeps_only_the_answered_record_of_an_idempotency_key(redis_url: str, key_prefix: str) -> None:
    """A first write whose confirmation failed left a record; the retry with the same key was answered with
    another id. Only the answered one is restored, so the workload is routed once."""
    bus = open_bus(redis_url, key_prefix=key_prefix)
    requests = parse_requests(spec().requests)
    orphan, _ = WorkloadStore(bus).create(spec(), requests, "order-1", now_s=1000.0)
    answered, _ = WorkloadStore(bus).create(spec(), requests, "order-1", now_s=1001.0)
    restored = WorkloadStore(bus)
    assert [w.id for w in restored.restore()] == [answered.id]
    again, created = restored.create(spec(), requests, "order-1")
    assert (again.id, created) == (answered.id, False)
    assert orphan.id != answered.id
    bus.close()


def test_cluster_urls_name_a_cluster_and_only_database_0() -> None:
    endpoint = endpoint_from_url("redis+cluster://user:secret@10.0.0.1:7000")
    assert endpoint.cluster and not endpoint.tls and endpoint.redacted_url == "redis+cluster://user:***@10.0.0.1:7000"
    assert endpoint_from_url("rediss+cluster://10.0.0.1:7000").tls
    assert "db" not in endpoint.redis_kwargs()
    with pytest.raises(BusConfigError, match="only database 0"):
        endpoint_from_url("redis+cluster://10.0.0.1:7000/2")
    with pytest.raises(BusConfigError, match="redis\\+cluster://"):
        endpoint_from_url("cluster://10.0.0.1:7000")
    with pytest.raises(BusConfigError, match="needs one Redis"):
        redis_client("redis+cluster://127.0.0.1:7000")


def test_an_unreachable_cluster_is_one_line_at_start() -> None:
    with pytest.raises(UserError, match=r"Redis Cluster at redis\+cluster://127\.0\.0\.1:1 is unreachable"):
        require_redis("redis+cluster://127.0.0.1:1", setting="--bus-url", timeout_s=0.5)


def test_the_cluster_bus_and_its_settings(redis_cluster_url: str, cluster_key_prefix: str) -> None:
    bus = open_bus(redis_cluster_url, key_prefix=cluster_key_prefix)
    assert isinstance(bus, RedisStreamBus) and bus.is_cluster and bus.ping()
    require_redis(redis_cluster_url, setting="--bus-url")
    bus.hash_set("meridian:workloads:{b001}", {"w": b"x"}, replicas=1)  # every primary has a synced replica
    bus.close()
    with pytest.raises(ValidationError, match=r"ha\.enabled with a Redis Cluster bus"):
        GlobalSchedulerSettings(bus={"url": redis_cluster_url}, ha={"enabled": True, "advertise": "h:1"})
