"""``meridian bench api`` end to end at a small rate: real server process, real client processes, real Redis.

The latency target lives in the benchmark (docs/results-api.md); here only what must always hold: every
accepted workload is dispatched exactly once, and the server runs with the configured switch interval.
"""

from __future__ import annotations

import sys

import redis

from global_scheduler.bench_api import run_api_bench, run_api_bench_on_primaries
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus.cleanup import prefix_pattern
from tests.redis_helpers import require


def test_small_load_is_dispatched_exactly_once(redis_url: str) -> None:
    r = run_api_bench(redis_url=redis_url, rate=100.0, duration_s=2.0, clients=2, clusters=3, policy="karmada",
                      gil_switch_interval_ms=0.5)
    d = r.as_dict()
    assert r.errors == 0
    assert r.accepted >= 190  # 2 s at 100/s, open loop
    assert r.dispatched_unique == r.accepted and r.duplicates == 0 and r.missing == 0
    assert d["server_pending"] == 0
    # The server routed in its worker process, which never had to be replaced.
    assert r.routing_process and d["server_routing_worker_pid"] and d["server_routing_worker_restarts"] == 0
    # Every dispatch's lag from acceptance was recorded, and none is negative or longer than the run.
    assert d["server_dispatch_lags"] == r.accepted
    assert 0 <= d["server_dispatch_lag_ms_p50"] <= d["server_dispatch_lag_ms_p99"] <= d["server_dispatch_lag_ms_max"]
    assert d["server_dispatch_lag_ms_max"] < 60_000
    assert abs(d["server_switch_interval_ms"] - 0.5) < 1e-9
    # The GC report is consistent: per-generation counts add up, the longest pause is one of them.
    by_gen = d["server_gc_by_generation"]
    assert sum(g["collections"] for g in by_gen.values()) == d["server_gc_collections"] > 0
    assert d["server_gc_pause_ms_max"] == max(g["pause_ms_max"] for g in by_gen.values())
    assert len(d["server_gc_full_collections_at_s_ms"]) == by_gen[2]["collections"]
    # The run removed every key under its private prefix.
    client = redis.Redis.from_url(redis_url)
    try:
        assert list(client.scan_iter(match=prefix_pattern(d["redis_key_prefix"]))) == []
    finally:
        client.close()


def test_server_applies_the_switch_interval(federation) -> None:
    before = sys.getswitchinterval()
    try:
        fed = federation()
        assert fed.engine.settings.api.gil_switch_interval_ms == GlobalSchedulerSettings().api.gil_switch_interval_ms
        assert abs(sys.getswitchinterval() - fed.engine.settings.api.gil_switch_interval_ms / 1000) < 1e-12
    finally:
        sys.setswitchinterval(before)


def test_the_same_load_runs_on_a_redis_cluster_beside_one_redis(redis_url: str) -> None:
    """``bench api --cluster-primaries``: the global scheduler's bus and store on a real one-primary Redis Cluster,
    every accepted workload dispatched exactly once there too, and the primary's CPU measured."""
    require("redis-server")
    require("redis-cli")
    runs = run_api_bench_on_primaries([1], redis_url=redis_url, rate=50.0, duration_s=1.0, clients=1, clusters=2,
                                      policy="karmada", progress=lambda _: None)
    assert list(runs) == ["redis", "cluster-1"]
    for d in runs.values():
        assert d["errors"] == 0 and d["accepted"] >= 40
        assert d["dispatched_unique"] == d["accepted"] and d["duplicates"] == 0 and d["missing"] == 0
    assert len(runs["cluster-1"]["redis_cpu_pct"]) == 1 and runs["cluster-1"]["redis_cpu_pct"][0] > 0
