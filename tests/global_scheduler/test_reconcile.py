"""Reconciliation of DISPATCHED workloads against what clusters report holding: the decision table, one
engine pass on the in-process bus with a hand-driven clock, and the heals end to end on real Redis (a
crash between the durable write and the publish, a lost event, a cluster that is gone)."""

from __future__ import annotations

import grpc
import pytest
from prometheus_client import REGISTRY

from global_scheduler.reconcile import REPUBLISH, REROUTE, Verdict, decide
from global_scheduler.registry import HoldingsView
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import build_server
from global_scheduler.settings import GlobalSchedulerSettings
from global_scheduler.store import WorkloadStore
from global_scheduler.validation import parse_requests
from meridian.bus import BusError, dispatch_stream, events_stream, open_bus
from meridian.envtest import wait_for
from protos import dispatch_pb2 as dpb
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from protos import telemetry_pb2 as tpb
from tests.global_api_helpers import spec, wait_state
from tests.global_scheduler.conftest import Federation

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


GRACE_S = 10.0
TIMEOUT_S = 15.0


def _view(*, ready: bool = True, generated_s: float = 100.0, held: tuple[str, ...] | None = ()) -> HoldingsView:
    return HoldingsView(ready, generated_s, None if held is None else frozenset(held))


@pytest.mark.parametrize(("view", "dispatched_s", "now_s", "heard_window_s", "expected"), [
    # Dispatched 5 s ago with a 10 s grace: too early to judge anything, even on a cluster that is down.
    pytest.param(_view(ready=False), 95.0, 100.0, 100.0, None, id="inside-grace"),
    # Its cluster is up and its summary, made at 100 ≥ 80 + 10, holds nothing: the place was lost.
    pytest.param(_view(), 80.0, 100.0, 100.0, Verdict(REPUBLISH, "place_lost"), id="place-lost"),
    # The summary holds it but the store still says DISPATCHED: the event was lost.
    pytest.param(_view(held=("w",)), 80.0, 100.0, 100.0, Verdict(REPUBLISH, "event_lost"), id="event-lost"),
    # Summary made at 100 < 95 + 10: it may predate the place reaching the cluster.
    pytest.param(_view(), 95.0, 106.0, 100.0, None, id="summary-too-old"),
    # The summary does not list what the cluster holds (a telemetry summary): nothing can be told.
    pytest.param(_view(held=None), 80.0, 100.0, 100.0, None, id="holdings-unknown"),
    pytest.param(_view(ready=False), 80.0, 100.0, 100.0, Verdict(REROUTE, "cluster_down"), id="cluster-down"),
    # Never heard of, and every cluster could have been heard for 16 s > the 15 s cluster timeout.
    pytest.param(None, 80.0, 100.0, 16.0, Verdict(REROUTE, "cluster_unknown"), id="cluster-gone"),
    # Never heard of, but the bus has been readable for only 14 s: it may still report.
    pytest.param(None, 80.0, 100.0, 14.0, None, id="cluster-not-heard-yet"),
])
def test_decide(view: HoldingsView | None, dispatched_s: float, now_s: float, heard_window_s: float,
                expected: Verdict | None) -> None:
    assert decide(workload_id="w", view=view, dispatched_s=dispatched_s, now_s=now_s, grace_s=GRACE_S,
                  heard_window_s=heard_window_s, cluster_timeout_s=TIMEOUT_S) == expected


class _Clock:
    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s


def _summary(cluster: str, sequence: int, generated_s: float, held: tuple[str, ...] = ()) -> tpb.ClusterSummary:
    return tpb.ClusterSummary(
        cluster=cluster, region="eu-north", sequence=sequence, generated_unix_ms=int(generated_s * 1000),
        nodes_total=1, nodes_schedulable=1, allocatable=tpb.ResourceVector(milli_cpu=64000, memory_bytes=2**38),
        free=tpb.ResourceVector(milli_cpu=64000, memory_bytes=2**38), max_node_free_milli_cpu=64000,
        max_node_free_memory_bytes=2**38, holdings=[tpb.WorkloadHolding(workload=w) for w in held],
        holdings_complete=True)


def _places(bus, cluster: str) -> list[tuple[str, int]]:
    out = []
    for entry in bus.read_range(dispatch_stream(cluster)):
        msg = dpb.DispatchMessage.FromString(entry.payload)
        if msg.WhichOneof("action") == "place":
            out.append((msg.place.workload_id, msg.place.attempt))
    return out


def test_a_pass_republishes_only_after_the_grace_and_once_per_grace() -> None:
    """The engine's pass on the in-process bus: the place it published at t=1000 is not in the cluster's
    summaries; it is published again only once a summary made 10 s after it still lacks it, then not again
    until a summary made 10 s after that second publish."""
    clock = _Clock(1000.0)
    settings = GlobalSchedulerSettings(bus={"url": "memory://"}, routing={"policy": "karmada", "worker_process": False},
                                       reconcile={"grace_s": GRACE_S})
    bus = open_bus("memory://")
    engine = GlobalScheduler(settings=settings, bus=bus, clock=clock)
    engine.registry.apply(_summary("c1", 1, 999.0), now_s=999.0)
    w, _ = engine.store.create(spec(), parse_requests(spec().requests), "k")
    engine.route_batch([w.id])
    assert _places(bus, "c1") == [(w.id, 1)]
    clock.now_s = 1012.0
    engine.registry.apply(_summary("c1", 2, 1008.0), now_s=1008.0)  # made before 1000 + 10
    assert engine.reconcile() == {}
    engine.registry.apply(_summary("c1", 3, 1011.0), now_s=1011.0)  # made after, and the workload is not there
    assert engine.reconcile() == {(REPUBLISH, "place_lost"): 1}
    assert _places(bus, "c1") == [(w.id, 1), (w.id, 1)]  # the same attempt
    assert engine.reconcile() == {}  # the re-publish restarted its grace
    clock.now_s = 1030.0
    engine.registry.apply(_summary("c1", 4, 1029.0, held=(w.id,)), now_s=1029.0)  # placed, event lost
    assert engine.reconcile() == {(REPUBLISH, "event_lost"): 1}
    # News arrives: not DISPATCHED any more, never reconciled again.
    engine.apply_event(dpb.PlacementEvent(workload_id=w.id, attempt=1, cluster="c1",
                                          phase=dpb.PLACEMENT_PHASE_RUNNING, nodes=["n"]))
    clock.now_s = 1100.0
    engine.registry.apply(_summary("c1", 5, 1099.0), now_s=1099.0)
    assert engine.reconcile() == {} and len(_places(bus, "c1")) == 3


def test_no_judgement_while_the_bus_is_unreadable() -> None:
    clock = _Clock(1000.0)
    settings = GlobalSchedulerSettings(bus={"url": "memory://"}, routing={"policy": "karmada", "worker_process": False},
                                       reconcile={"grace_s": GRACE_S})
    engine = GlobalScheduler(settings=settings, bus=open_bus("memory://"), clock=clock)
    engine.registry.apply(_summary("c1", 1, 999.0), now_s=999.0)
    w, _ = engine.store.create(spec(), parse_requests(spec().requests), "k")
    engine.route_batch([w.id])
    engine.registry.apply(_summary("c1", 2, 1020.0), now_s=1020.0)
    clock.now_s = 1021.0
    engine.registry.bus_unreachable(1020.5)
    assert engine.reconcile() == {}
    engine.registry.bus_readable(1021.0)
    assert engine.reconcile() == {(REPUBLISH, "place_lost"): 1}


def test_a_summary_stream_answering_errors_counts_as_unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Redis loading its append-only file after a restart answers every read with LOADING: the clusters'
    summaries cannot be read, so neither liveness nor reconciliation may judge them."""
    settings = GlobalSchedulerSettings(bus={"url": "memory://"}, routing={"policy": "karmada", "worker_process": False})
    engine = GlobalScheduler(settings=settings, bus=open_bus("memory://"))

    def loading(*args: object, **kwargs: object) -> list[object]:
        raise BusError("LOADING Redis is loading the dataset in memory")

    monkeypatch.setattr(engine.bus, "read_group", loading)
    with pytest.raises(BusError):
        engine._summary_loop()
    assert engine.registry.readable_since() is None
    assert engine.reconcile() == {}


# ------------------------------------------------------------------ end to end on real Redis


def _restart(fed: Federation, **reconcile: float) -> tuple[GlobalScheduler, api_grpc.GlobalSchedulerStub]:
    """A new engine and API on the same Redis keys, with fast reconciliation (clusters keep running)."""
    fed.server.stop(0.2)
    settings = fed.engine.settings.model_copy(update={"reconcile": fed.engine.settings.reconcile.model_copy(
        update={"interval_s": 0.2, "grace_s": 1.0, **reconcile})})
    engine = GlobalScheduler(settings=settings, bus=open_bus(settings.bus.url, key_prefix=settings.bus.key_prefix))
    fed.server = build_server(engine)
    fed.engine = engine
    return engine, api_grpc.GlobalSchedulerStub(grpc.insecure_channel(f"127.0.0.1:{fed.server.port}"))


def _left_dispatched(fed: Federation, cluster: str, key: str) -> api.Workload:
    """What a scheduler that crashed between its durable write and its publish leaves: the record says
    DISPATCHED (attempt 1) to ``cluster``, and no place message exists."""
    settings = fed.engine.settings
    store = WorkloadStore(open_bus(settings.bus.url, key_prefix=settings.bus.key_prefix))
    w, _ = store.create(spec(name=key), parse_requests(spec().requests), key)
    store.update(w.id, state=api.WORKLOAD_STATE_DISPATCHED, cluster=cluster, region="eu-north", attempt=1,
                 message=f"dispatched to {cluster} (attempt 1)")
    store.flush()
    return w


def _count(action: str, reason: str) -> float:
    return REGISTRY.get_sample_value("meridian_reconciliations_total", {"action": action, "reason": reason}) or 0.0


def test_a_dispatch_lost_in_a_crash_is_published_again(federation) -> None:
    fed = federation()
    w = _left_dispatched(fed, "north-1", "crashed-before-publish")
    before = _count(REPUBLISH, "place_lost")
    engine, stub = _restart(fed)
    running = wait_state(stub, w.id, api.WORKLOAD_STATE_RUNNING, timeout_s=20)
    assert (running.cluster, running.attempt) == ("north-1", 1)
    assert _places(engine.bus, "north-1") == [(w.id, 1)]  # published once, by the reconciliation
    assert _count(REPUBLISH, "place_lost") == before + 1
    assert int(fed.workers["north-1"].state.req_milli_cpu.sum()) == 4000  # 2 × 2 CPU, placed once


def test_a_lost_event_is_sent_again(federation, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster placed the workload but its events never reached the global tier."""
    fed = federation()
    w = _left_dispatched(fed, "north-1", "event-lost")
    worker = fed.workers["north-1"]
    fed.stop_cluster("north-1")
    # The fixture starts north-1's thread first; this test drives the worker by hand until it restarts it.
    wait_for(lambda: not fed.threads[0].is_alive(), message="the worker thread to stop")
    worker.bus.publish(dispatch_stream("north-1"), dpb.DispatchMessage(cluster="north-1", place=dpb.PlaceWorkload(
        workload_id=w.id, attempt=1, name="event-lost", tenant="shop", replicas=2,
        requests=dpb.ReplicaRequests(milli_cpu=2000, memory_bytes=4 * 2**30))).SerializeToString())
    real_publish_many = worker.bus.publish_many
    with monkeypatch.context() as patch:  # the events are "published" into the void
        patch.setattr(worker.bus, "publish_many", lambda stream, payloads, **kw: len(payloads)
                      if stream == events_stream("north-1") else real_publish_many(stream, payloads, **kw))
        assert worker.poll_once() == 1
    assert w.id in worker.held and worker.bus.read_range(events_stream("north-1")) == []
    fed.start_cluster("north-1")
    before = _count(REPUBLISH, "event_lost")
    _, stub = _restart(fed)
    running = wait_state(stub, w.id, api.WORKLOAD_STATE_RUNNING, timeout_s=20)
    assert (running.cluster, running.attempt, len(running.nodes)) == ("north-1", 1, 2)
    # At least once: under load a second pass may run before the re-sent event is applied, and
    # re-publishing the same attempt is harmless; what matters is that it is placed once.
    assert _count(REPUBLISH, "event_lost") >= before + 1
    assert int(worker.state.req_milli_cpu.sum()) == 4000  # still placed once


def test_a_workload_dispatched_to_a_cluster_that_is_gone_is_rerouted(federation) -> None:
    fed = federation()
    w = _left_dispatched(fed, "gone-1", "on-a-gone-cluster")
    before = _count(REROUTE, "cluster_unknown")
    engine, stub = _restart(fed)
    running = wait_state(stub, w.id, api.WORKLOAD_STATE_RUNNING, timeout_s=20)
    assert running.cluster in fed.workers and running.attempt == 2
    assert _count(REROUTE, "cluster_unknown") == before + 1
    # Should the cluster come back, the release tells it to free whatever it held of attempt 1.
    releases = [dpb.DispatchMessage.FromString(e.payload).release for e in engine.bus.read_range(dispatch_stream("gone-1"))]
    assert [(r.workload_id, r.attempt) for r in releases] == [(w.id, 1)]

