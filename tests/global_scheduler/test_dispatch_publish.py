"""A dispatch publish that fails is published again to the same cluster with the same attempt, never routed
elsewhere: the failure may be a lost reply (the entries are in the stream), and an attempt that reached
two clusters would be placed on both (in-process bus, the engine driven by hand)."""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest

from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.settings import GlobalSchedulerSettings
from global_scheduler.validation import parse_requests
from meridian.bus import BusUnavailableError, dispatch_stream, open_bus
from meridian.bus.base import StreamBus
from protos import dispatch_pb2 as dpb
from protos import global_api_pb2 as api
from protos import telemetry_pb2 as tpb

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


def _summary(cluster: str) -> tpb.ClusterSummary:
    return tpb.ClusterSummary(
        cluster=cluster, region="eu-north", sequence=1, generated_unix_ms=int(time.time() * 1000), nodes_total=1,
        nodes_schedulable=1, allocatable=tpb.ResourceVector(milli_cpu=64000, memory_bytes=2**38),
        free=tpb.ResourceVector(milli_cpu=64000, memory_bytes=2**38), max_node_free_milli_cpu=64000,
        max_node_free_memory_bytes=2**38)


def _places(bus: StreamBus, cluster: str) -> list[tuple[str, int]]:
    msgs = [dpb.DispatchMessage.FromString(e.payload) for e in bus.read_range(dispatch_stream(cluster))]
    return [(m.place.workload_id, m.place.attempt) for m in msgs if m.WhichOneof("action") == "place"]


@pytest.mark.parametrize("landed", [
    pytest.param(True, id="reply-lost"),  # Redis appended the entries, the reply never came back
    pytest.param(False, id="not-appended"),
])
def test_a_failed_publish_is_retried_to_the_same_cluster(landed: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    bus = open_bus("memory://")
    settings = GlobalSchedulerSettings(bus={"url": "memory://"}, routing={"policy": "karmada", "worker_process": False})
    engine = GlobalScheduler(settings=settings, bus=bus)
    for cluster in ("a", "b"):
        engine.registry.apply(_summary(cluster))
    real_publish_many = bus.publish_many
    failures: list[str] = []

    def flaky(stream: str, payloads: Sequence[bytes], *, maxlen: int | None = None) -> int:
        if not failures:
            failures.append(stream)
            if landed:
                real_publish_many(stream, payloads, maxlen=maxlen)
            raise BusUnavailableError("timed out waiting for the reply")
        return real_publish_many(stream, payloads, maxlen=maxlen)

    monkeypatch.setattr(bus, "publish_many", flaky)
    # 60 of a cluster's 64 CPU: once reserved on the first cluster, a second routing would pick the other.
    spec = api.WorkloadSpec(name="big", tenant="t", replicas=1, requests=api.ResourceQuantities(cpu="60", memory="1Gi"))
    w, _ = engine.store.create(spec, parse_requests(spec.requests), "k")
    engine.route_batch([w.id])
    first = engine.store.get(w.id)
    assert (first.state, first.attempt) == (api.WORKLOAD_STATE_DISPATCHED, 1)  # it stands: it may have landed
    engine.publish_unsent()
    engine.route_batch(engine._take_batch())  # nothing is queued again
    other = "b" if first.cluster == "a" else "a"
    assert _places(bus, first.cluster) == [(w.id, 1)] * (2 if landed else 1)
    assert _places(bus, other) == []
    assert engine.dispatched_total == 1 and not engine._unsent


def test_an_unsent_place_is_dropped_once_its_workload_moved_on() -> None:
    bus = open_bus("memory://")
    settings = GlobalSchedulerSettings(bus={"url": "memory://"}, routing={"policy": "karmada", "worker_process": False})
    engine = GlobalScheduler(settings=settings, bus=bus)
    engine.registry.apply(_summary("a"))
    spec = api.WorkloadSpec(name="x", tenant="t", replicas=1, requests=api.ResourceQuantities(cpu="1", memory="1Gi"))
    w, _ = engine.store.create(spec, parse_requests(spec.requests), "k")
    engine._unsent["a"] = [(w.id, 1, b"never sent")]
    engine.cancel(w.id)
    engine.publish_unsent()
    assert _places(bus, "a") == [] and not engine._unsent
