"""A Redis outage is not a cluster outage: the registry judges a cluster's silence only on time the
bus was readable, and never on a timeout shorter than the interval its summaries arrive at."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable

import pytest
from pydantic import ValidationError

from global_scheduler.registry import ClusterRegistry
from global_scheduler.settings import RegistrySettings
from meridian.envtest import wait_for
from protos import telemetry_pb2 as tpb
from tests.conftest import RedisServer
from tests.global_scheduler.conftest import Federation

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


def _summary(cluster: str, sequence: int, generated_s: float) -> tpb.ClusterSummary:
    return tpb.ClusterSummary(cluster=cluster, region="eu-north", sequence=sequence, nodes_total=1,
                              nodes_schedulable=1, generated_unix_ms=int(generated_s * 1000))


def test_no_cluster_is_judged_while_the_bus_is_unreachable() -> None:
    reg = ClusterRegistry(cluster_timeout_s=15.0)
    reg.apply(_summary("a", 1, 0.0), now_s=0.0)
    reg.bus_unreachable(5.0)
    assert reg.sweep(30.0) == []  # 30 s of silence, but the bus could not be read for 25 of them
    reg.bus_readable(31.0)
    assert reg.sweep(45.0) == []  # 14 s since the bus came back: still inside one timeout
    assert reg.sweep(46.5) == ["a"]  # 15.5 s of readable silence: down
    assert not reg.is_ready("a")


def test_a_cluster_heard_after_the_outage_stays_up() -> None:
    reg = ClusterRegistry(cluster_timeout_s=15.0)
    reg.apply(_summary("a", 1, 0.0), now_s=0.0)
    reg.bus_unreachable(1.0)
    reg.bus_readable(20.0)
    reg.apply(_summary("a", 2, 25.0), now_s=25.0)
    assert reg.sweep(39.0) == [] and reg.is_ready("a")


def test_the_timeout_is_never_below_twice_the_measured_summary_interval() -> None:
    # Summaries every 20 s against a 15 s timeout: the effective timeout is 2 × 20 = 40 s.
    reg = ClusterRegistry(cluster_timeout_s=15.0)
    for k in range(4):
        reg.apply(_summary("slow", k + 1, 20.0 * k), now_s=20.0 * k)
    assert reg.sweep(60.0 + 19.0) == []  # between two summaries: no flap
    assert reg.sweep(60.0 + 41.0) == ["slow"]  # two summaries missed: down


def _regional(cluster: str, region: str, generated_s: float, sequence: int = 1) -> tpb.ClusterSummary:
    return tpb.ClusterSummary(cluster=cluster, region=region, sequence=sequence, nodes_total=1, nodes_schedulable=1,
                              generated_unix_ms=int(generated_s * 1000))


def test_a_silent_cluster_is_forgotten_after_forget_after_s() -> None:
    reg = ClusterRegistry(cluster_timeout_s=15.0, forget_after_s=100.0)
    reg.apply(_regional("a", "eu-north", 0.0), now_s=0.0)
    reg.apply(_regional("b", "eu-west", 0.0), now_s=0.0)
    reg.apply(_regional("c", "eu-west", 0.0), now_s=0.0)
    for k, t in enumerate(range(5, 101, 5)):  # b keeps reporting, every 5 s
        reg.apply(_regional("b", "eu-west", t, sequence=k + 2), now_s=t)
    assert sorted(reg.sweep(16.0)) == ["a", "c"]  # down: the scheduler reroutes their workloads now
    assert sorted(reg.names()) == ["a", "b", "c"]  # still listed (down) until forget_after_s
    assert reg.sweep(100.0) == [] and sorted(reg.names()) == ["a", "b", "c"]  # 100 s: not yet longer than it
    assert reg.sweep(100.5) == []
    assert reg.names() == ["b"] and reg.region_of("a") is None
    # eu-north went with its only cluster; eu-west stays, b still reports from there
    assert reg.regions() == ["eu-west"] and reg.known_regions() == ["eu-west"]
    assert [c.name for c in reg.cluster_messages()] == ["b"]
    # A forgotten cluster that reports again is a new cluster, up at once.
    assert reg.apply(_regional("a", "eu-north", 200.0), now_s=200.0) is True
    assert reg.is_ready("a") and "eu-north" in reg.regions()


def test_a_cluster_is_marked_down_before_it_is_forgotten() -> None:
    # First sweep long after both limits: down now (its workloads rerouted), forgotten only on a later sweep.
    reg = ClusterRegistry(cluster_timeout_s=15.0, forget_after_s=100.0)
    reg.apply(_regional("a", "eu-north", 0.0), now_s=0.0)
    assert reg.sweep(500.0) == ["a"] and reg.names() == ["a"]
    assert reg.sweep(501.0) == [] and reg.names() == []


def test_nothing_is_forgotten_while_the_bus_is_unreachable() -> None:
    reg = ClusterRegistry(cluster_timeout_s=15.0, forget_after_s=100.0)
    reg.apply(_regional("a", "eu-north", 0.0), now_s=0.0)
    assert reg.sweep(20.0) == ["a"]
    reg.bus_unreachable(30.0)
    assert reg.sweep(300.0) == [] and reg.names() == ["a"]
    reg.bus_readable(310.0)
    assert reg.sweep(400.0) == [] and reg.names() == ["a"]  # 90 s of readable silence
    assert reg.sweep(411.0) == [] and reg.names() == []


@pytest.mark.parametrize(("values", "error"), [
    pytest.param({}, None, id="defaults"),
    pytest.param({"cluster_timeout_s": 30.0, "forget_after_s": 60.0}, None, id="longer"),
    pytest.param({"cluster_timeout_s": 30.0, "forget_after_s": 30.0}, "must be longer than", id="equal"),
    pytest.param({"cluster_timeout_s": 7200.0}, "forget_after_s (3600 s) must be longer", id="timeout-past-default"),
])
def test_forget_after_s_must_exceed_the_cluster_timeout(values: dict[str, float], error: str | None) -> None:
    if error is None:
        settings = RegistrySettings(**values)
        assert settings.forget_after_s > settings.cluster_timeout_s
    else:
        with pytest.raises(ValidationError, match=re.escape(error)):
            RegistrySettings(**values)


@pytest.fixture
def redis_url(redis_server: RedisServer) -> str:
    """The federation runs on a private Redis this test can restart."""
    return redis_server.url


def test_a_redis_restart_longer_than_the_cluster_timeout_moves_nothing(
        federation: Callable[..., Federation], redis_server: RedisServer) -> None:
    fed = federation(cluster_timeout_s=2.0)
    downs: list[str] = []
    sweeps: list[float] = []  # when each sweep ran (time.time())
    real_sweep = fed.engine.registry.sweep

    def recording_sweep(now_s: float | None = None) -> list[str]:
        went_down = real_sweep(now_s)
        downs.extend(went_down)
        sweeps.append(time.time())
        return went_down

    fed.engine.registry.sweep = recording_sweep  # type: ignore[method-assign]
    stop = threading.Event()
    not_ready: list[str] = []

    def watch() -> None:  # samples the registry every 50 ms for the whole test
        while not stop.wait(0.05):
            not_ready.extend(n for n in fed.engine.registry.names() if not fed.engine.registry.is_ready(n))

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        redis_server.kill()
        registry = fed.engine.registry
        wait_for(lambda: registry.readable_since() is None, timeout=30, message="the engine to see Redis down")
        time.sleep(4.0)  # the fault: an outage of twice the cluster timeout (its length is what is tested)
        redis_server.start()
        back = time.time()
        # The regional workers reconnect and publish again and the registry hears every cluster; then a sweep
        # runs (the one that would mark them down had the outage counted as their silence).
        wait_for(lambda: registry.readable_since() is not None
                 and all(c.last_seen_unix_s > back for c in registry.cluster_messages()), timeout=30,
                 message="every cluster to be heard after the restart")
        heard = time.time()
        wait_for(lambda: any(s > heard for s in sweeps), timeout=30, message="a sweep after the clusters were heard")
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert downs == [] and not_ready == []
    assert all(fed.engine.registry.is_ready(n) for n in ("north-1", "central-1"))
