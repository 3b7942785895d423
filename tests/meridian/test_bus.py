"""One contract suite for every ``StreamBus`` implementation (ARCHITECTURE.md: the fabric).

The same tests run on the in-process bus and, on the real server at REDIS_URL and on a real Redis Cluster
(``redis+cluster://``), on the production bus (redis-py plus the hand-packed publish) and on the pure redis-py
bus, each under a unique key prefix.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from meridian.bus import (
    InProcessStreamBus,
    RedisPyStreamBus,
    RedisStreamBus,
    StreamBus,
    StreamEntry,
    dead_letter_stream,
    open_bus,
    telemetry_stream,
)
from meridian.bus.health import GroupGauges
from protos import telemetry_pb2

STREAM = telemetry_stream("contract")


@pytest.fixture(params=["memory", "redis", "redis-py", "redis-cluster", "redis-py-cluster"])
def bus(request: pytest.FixtureRequest, redis_url: str) -> Iterator[StreamBus]:
    impl: StreamBus
    if request.param == "memory":
        impl = InProcessStreamBus(key_prefix=request.getfixturevalue("key_prefix"))
    elif request.param == "redis":
        impl = RedisStreamBus(redis_url, key_prefix=request.getfixturevalue("key_prefix"))
    elif request.param == "redis-py":
        impl = RedisPyStreamBus(redis_url, key_prefix=request.getfixturevalue("key_prefix"))
    elif request.param == "redis-cluster":
        url = request.getfixturevalue("redis_cluster_url")
        impl = open_bus(url, key_prefix=request.getfixturevalue("cluster_key_prefix"))
        assert isinstance(impl, RedisStreamBus) and impl.is_cluster
    else:
        url = request.getfixturevalue("redis_cluster_url")
        impl = RedisPyStreamBus(url, key_prefix=request.getfixturevalue("cluster_key_prefix"))
    yield impl
    impl.close()


def _ids_increase(entries: list[StreamEntry]) -> bool:
    keys = [tuple(int(x) for x in e.entry_id.split("-")) for e in entries]
    return keys == sorted(keys) and len(set(keys)) == len(keys)


def test_implements_protocol(bus: StreamBus) -> None:
    assert isinstance(bus, StreamBus)


@pytest.mark.parametrize(
    "payloads",
    [
        pytest.param([b"a"], id="one"),
        pytest.param([b"x%d" % i for i in range(2500)], id="more-than-one-pipeline-chunk"),
        pytest.param([bytes(range(256)) * 400, b"\r\n$3\r\n*\r\n", b""], id="binary-large-and-empty"),
    ],
)
def test_published_entries_are_read_in_order(bus: StreamBus, payloads: list[bytes]) -> None:
    assert bus.publish_many(STREAM, payloads) == len(payloads)
    bus.ensure_group(STREAM, "g")
    got: list[StreamEntry] = []
    while batch := bus.read_group(STREAM, "g", "c1", count=1000):
        got.extend(batch)
    assert [e.payload for e in got] == payloads
    assert _ids_increase(got)
    assert bus.length(STREAM) == len(payloads)


def test_single_publish_returns_the_entry_id(bus: StreamBus) -> None:
    first = bus.publish(STREAM, b"one")
    second = bus.publish(STREAM, b"two")
    assert [e.entry_id for e in bus.read_range(STREAM)] == [first, second]
    latest = bus.read_latest(STREAM)
    assert latest == StreamEntry(second, b"two")


def test_read_latest_of_empty_stream_is_none(bus: StreamBus) -> None:
    assert bus.read_latest(STREAM) is None
    assert bus.publish_many(STREAM, []) == 0


def test_group_delivers_each_entry_to_one_consumer(bus: StreamBus) -> None:
    bus.ensure_group(STREAM, "g")
    bus.publish_many(STREAM, [b"%d" % i for i in range(10)])
    first = bus.read_group(STREAM, "g", "c1", count=4)
    second = bus.read_group(STREAM, "g", "c2", count=100)
    assert len(first) == 4 and len(second) == 6
    assert {e.payload for e in first} | {e.payload for e in second} == {b"%d" % i for i in range(10)}
    assert bus.read_group(STREAM, "g", "c3", count=100) == []


def test_group_created_at_end_skips_history(bus: StreamBus) -> None:
    bus.publish(STREAM, b"old")
    bus.ensure_group(STREAM, "late", start_id="$")
    bus.publish(STREAM, b"new")
    assert [e.payload for e in bus.read_group(STREAM, "late", "c", count=10)] == [b"new"]


def test_ensure_group_twice_keeps_position(bus: StreamBus) -> None:
    bus.ensure_group(STREAM, "g")
    bus.publish_many(STREAM, [b"1", b"2"])
    assert len(bus.read_group(STREAM, "g", "c", count=1)) == 1
    bus.ensure_group(STREAM, "g")
    assert [e.payload for e in bus.read_group(STREAM, "g", "c", count=10)] == [b"2"]


def test_ack_clears_pending(bus: StreamBus) -> None:
    bus.ensure_group(STREAM, "g")
    bus.publish_many(STREAM, [b"1", b"2", b"3"])
    entries = bus.read_group(STREAM, "g", "c", count=10)
    assert bus.pending(STREAM, "g") == 3
    assert bus.ack(STREAM, "g", [e.entry_id for e in entries[:2]]) == 2
    assert bus.ack(STREAM, "g", [entries[0].entry_id]) == 0  # acknowledging twice is harmless
    assert bus.pending(STREAM, "g") == 1
    assert bus.ack(STREAM, "g", []) == 0


@pytest.mark.parametrize(
    ("min_idle_ms", "expect_claimed"),
    [
        pytest.param(0, 5, id="idle-enough-claimed"),
        pytest.param(3_600_000, 0, id="recently-delivered-left-alone"),
    ],
)
def test_claim_stale_takes_over_a_dead_consumers_pending(bus: StreamBus, min_idle_ms: int,
                                                        expect_claimed: int) -> None:
    bus.ensure_group(STREAM, "g")
    bus.publish_many(STREAM, [b"%d" % i for i in range(5)])
    dead = bus.read_group(STREAM, "g", "dead", count=10)
    claimed = bus.claim_stale(STREAM, "g", "alive", min_idle_ms=min_idle_ms, count=100)
    assert len(claimed) == expect_claimed
    if expect_claimed:
        assert [e.payload for e in claimed] == [e.payload for e in dead]
        bus.ack(STREAM, "g", [e.entry_id for e in claimed])
    assert bus.pending(STREAM, "g") == 5 - expect_claimed


def test_claim_respects_count(bus: StreamBus) -> None:
    bus.ensure_group(STREAM, "g")
    bus.publish_many(STREAM, [b"%d" % i for i in range(7)])
    bus.read_group(STREAM, "g", "dead", count=10)
    assert len(bus.claim_stale(STREAM, "g", "alive", min_idle_ms=0, count=3)) == 3


def test_maxlen_trims_approximately(bus: StreamBus) -> None:
    for _ in range(10):
        bus.publish_many(STREAM, [b"x" * 10] * 500, maxlen=100)
    # Approximate trimming never keeps fewer than asked, and drops whole macro-nodes (100 entries
    # by default in Redis) so the length stays within a node or two of the bound.
    assert 100 <= bus.length(STREAM) <= 400


def test_dead_letter_keeps_reason_and_truncated_payload(bus: StreamBus) -> None:
    entry = StreamEntry("1-0", b"\xff" * 10_000)
    bus.dead_letter(STREAM, entry, reason="oversized: 10000 bytes > 8192", group="g", consumer="c",
                    payload_kept_bytes=16)
    parked = bus.read_range(dead_letter_stream(STREAM))
    assert len(parked) == 1
    envelope = telemetry_pb2.DeadLetter.FromString(parked[0].payload)
    assert envelope.reason == "oversized: 10000 bytes > 8192"
    assert envelope.payload == b"\xff" * 16
    assert envelope.payload_size_bytes == 10_000
    assert (envelope.stream, envelope.entry_id, envelope.group, envelope.consumer) == (STREAM, "1-0", "g", "c")


def test_group_is_recreated_when_the_stream_vanishes(bus: StreamBus) -> None:
    bus.ensure_group(STREAM, "g")
    bus.delete(STREAM)  # what a server restart without persistence looks like to a consumer
    bus.publish(STREAM, b"after")
    assert [e.payload for e in bus.read_group(STREAM, "g", "c", count=10)] == [b"after"]


def test_values_round_trip(bus: StreamBus) -> None:
    assert bus.get_value("meridian:carbon:DE") is None
    bus.set_value("meridian:carbon:DE", b"315.2")
    assert bus.get_value("meridian:carbon:DE") == b"315.2"
    assert bus.ping()


def test_hash_round_trip_beyond_one_scan_page(bus: StreamBus) -> None:
    assert bus.hash_items("meridian:workloads") == []
    bus.hash_set("meridian:workloads", {f"w{i}": bytes([i % 256]) * 3 for i in range(2500)})
    bus.hash_set("meridian:workloads", {"w7": b"updated"})
    items = dict(bus.hash_items("meridian:workloads"))
    assert len(items) == 2500 and items["w7"] == b"updated" and items["w300"] == bytes([300 % 256]) * 3
    bus.delete("meridian:workloads")
    assert bus.hash_items("meridian:workloads") == []


def test_blocking_read_returns_empty_after_timeout(bus: StreamBus) -> None:
    bus.ensure_group(STREAM, "g")
    assert bus.read_group(STREAM, "g", "c", count=10, block_ms=50) == []


def test_group_lag_counts_undelivered_entries(bus: StreamBus) -> None:
    assert bus.group_lag(STREAM, "g") == 0  # no stream yet
    bus.ensure_group(STREAM, "g")
    for i in range(5):
        bus.publish(STREAM, b"%d" % i)
    assert bus.group_lag(STREAM, "g") == 5
    read = bus.read_group(STREAM, "g", "c", count=2)
    assert bus.group_lag(STREAM, "g") == 3 and bus.pending(STREAM, "g") == 2
    bus.ack(STREAM, "g", [e.entry_id for e in read])
    assert bus.group_lag(STREAM, "g") == 3 and bus.pending(STREAM, "g") == 0
    assert bus.group_lag(STREAM, "other") == 0


def test_group_gauges_export_lag_and_pending(bus: StreamBus) -> None:
    now = [0.0]
    gauges = GroupGauges(bus, STREAM, "g", interval_s=5.0, clock=lambda: now[0])
    bus.ensure_group(STREAM, "g")
    for i in range(4):
        bus.publish(STREAM, b"%d" % i)
    bus.read_group(STREAM, "g", "c", count=1)
    gauges.maybe_update()

    def value(name: str) -> float | None:
        return REGISTRY.get_sample_value(name, {"stream": STREAM, "group": "g"})

    assert (value("meridian_stream_lag_entries"), value("meridian_stream_pending_entries")) == (3.0, 1.0)
    bus.read_group(STREAM, "g", "c", count=3)
    gauges.maybe_update()  # within the interval: no query
    assert value("meridian_stream_lag_entries") == 3.0
    now[0] = 5.0
    gauges.maybe_update()
    assert (value("meridian_stream_lag_entries"), value("meridian_stream_pending_entries")) == (0.0, 4.0)
