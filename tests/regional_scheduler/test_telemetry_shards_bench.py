"""Issue 27's client and Redis Cluster measurements in ``meridian bench telemetry``, on a tiny sample:
the hand-written vs redis-py comparison against the real Redis, and one 1-primary cluster run."""

from __future__ import annotations

import time

import redis
from redis.cluster import key_slot

from meridian.bus import telemetry_stream
from meridian.fleet import SimulatedFleet
from regional_scheduler.telemetry_shards_bench import balanced_members, measure_clients, measure_shards
from tests.redis_helpers import require


def _payloads(n: int) -> list[bytes]:
    fleet = SimulatedFleet(cluster="bench", region="bench", n_nodes=n)
    fleet.advance(time.time())
    return fleet.reports(time.time())


def test_clients_measures_both_buses_and_leaves_no_stream(redis_url: str, key_prefix: str) -> None:
    out = measure_clients(redis_url, _payloads(2000), key_prefix=key_prefix, seconds=0.3, rounds=2,
                          drain_reports=2000, batch=500, chunk=500)
    for path in ("publish", "drain"):
        row = out[path]
        assert row["hand_written"] > 0 and row["redis_py"] > 0
        assert abs(row["ratio"] - row["hand_written"] / row["redis_py"]) < 0.01
        assert len(row["passes"]) == 2
    assert isinstance(out["hiredis"], bool)
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=f"{key_prefix}*")) == []
    finally:
        client.close()


def test_clients_drain_can_be_skipped(redis_url: str, key_prefix: str) -> None:
    out = measure_clients(redis_url, _payloads(200), key_prefix=key_prefix, seconds=0.1, rounds=1, drain_reports=0)
    assert out["drain"] is None and out["publish"]["redis_py"] > 0


def test_balanced_members_spread_over_every_cluster_size() -> None:
    members = balanced_members(12, [1, 2, 3])
    assert len(set(members)) == 12
    slots = [key_slot(telemetry_stream(m).encode()) for m in members]
    for n in (2, 3):
        bounds = [round(i * 16384 / n) for i in range(n + 1)]
        per = [sum(bounds[i] <= s < bounds[i + 1] for s in slots) for i in range(n)]
        assert per == [12 // n] * n


def test_shards_one_primary_run() -> None:
    require("redis-server")
    require("redis-cli")
    out = measure_shards([1], _payloads(400), producers=2, seconds=0.3, streams=4, chunk=200, pin=True,
                         warmup_s=0.1)
    one = out["1"]
    assert one["reports_per_s"] > 0 and one["producers_alive_at_end"]
    assert len(one["redis_cpu_pct"]) == 1 and len(one["producer_cpu_pct"]) == 2
    assert one["streams_per_primary"] == [4]
    assert len(out["members"]) == 4
    if out["pinned"] is not None:  # two usable cores
        pinned = out["pinned"]["1"]
        assert pinned["reports_per_s"] > 0 and len(pinned["producer_cpu_pct"]) == 2
        assert pinned["pinned"]["redis_core"] != pinned["pinned"]["producer_core"]


def test_shards_hand_written_producers_publish_to_each_streams_primary() -> None:
    require("redis-server")
    require("redis-cli")
    out = measure_shards([2], _payloads(400), producers=1, seconds=0.3, streams=4, chunk=200, pin=False,
                         warmup_s=0.1, client="hand_written")
    two = out["2"]
    assert out["client"] == two["client"] == "hand_written"
    assert two["reports_per_s"] > 0 and two["producers_alive_at_end"] and two["streams_per_primary"] == [2, 2]
    assert len(two["redis_cpu_pct"]) == 2 and len(two["producer_cpu_pct"]) == 1
    assert out["pinned"] is None and "ratio_2_to_1" not in two
