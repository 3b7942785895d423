"""Whether a workload can ever run: the one rule (``ClusterRegistry.fit_outlook``) behind the router's
FAILED-or-PENDING and SubmitWorkload's NO_CLUSTER_CAN_FIT.

FAILED only when no reporting cluster in an allowed region can hold the workload, even empty, and no
allowed region may still gain a cluster: with configured regions (``registry.regions``) those are the
configured ones without a reporting cluster; with none configured, any allowed region without one.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import grpc
import pytest

from global_scheduler.errors import error_details
from global_scheduler.registry import ClusterRegistry, Fit
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import build_server
from global_scheduler.settings import GlobalSchedulerSettings
from global_scheduler.validation import parse_requests
from meridian.bus import open_bus
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from protos import telemetry_pb2 as tpb

GIB = 2**30
CORE = 1000  # milli-CPU


def _summary(cluster: str, region: str, *, nodes: int = 4, cores_per_node: int = 32,
             sequence: int = 1) -> tpb.ClusterSummary:
    """An empty cluster of ``nodes`` × ``cores_per_node`` cores and 128 GiB."""
    cpu, memory = nodes * cores_per_node * CORE, nodes * 128 * GIB
    return tpb.ClusterSummary(
        cluster=cluster, region=region, sequence=sequence, generated_unix_ms=1_000_000, nodes_total=nodes,
        nodes_schedulable=nodes, allocatable=tpb.ResourceVector(milli_cpu=cpu, memory_bytes=memory),
        free=tpb.ResourceVector(milli_cpu=cpu, memory_bytes=memory), max_node_free_milli_cpu=cores_per_node * CORE,
        max_node_free_memory_bytes=128 * GIB)


SMALL = {"nodes": 1, "cores_per_node": 4}  # 4 cores: too small for 2 × 8 cores
BIG = {"nodes": 4, "cores_per_node": 32}


def _registry(configured: tuple[str, ...], clusters: dict[str, tuple[str, dict[str, int]]]) -> ClusterRegistry:
    registry = ClusterRegistry(configured_regions=configured)
    for name, (region, size) in clusters.items():
        registry.apply(_summary(name, region, **size), now_s=1000.0)
    return registry


def _outlook(registry: ClusterRegistry, allowed: tuple[str, ...], *, cores: int = 8, replicas: int = 2):
    return registry.fit_outlook(replicas=replicas, milli_cpu=cores * CORE, memory_bytes=GIB, gpu=0.0,
                                allowed_regions=set(allowed) or None)


# Each case: configured regions, reporting clusters (name → region, size), the workload's allowed regions
# (2 replicas of 8 cores), and the verdict with the regions it waits for.
@pytest.mark.parametrize(("configured", "clusters", "allowed", "fit", "waiting"), [
    pytest.param((), {"west-1": ("eu-west", BIG)}, ("eu-west",), Fit.NOW, (), id="a-reporting-cluster-holds-it"),
    pytest.param((), {}, (), Fit.LATER, (), id="nothing-configured-nothing-reported"),
    # The README's case: the only cluster reports from region `local`, which the workload does not allow.
    pytest.param((), {"local": ("local", BIG)}, ("eu-north", "eu-west"), Fit.LATER, ("eu-north", "eu-west"),
                 id="nothing-configured-allowed-regions-without-a-cluster"),
    pytest.param((), {"west-1": ("eu-west", SMALL)}, ("eu-north", "eu-west"), Fit.LATER, ("eu-north",),
                 id="nothing-configured-one-allowed-region-too-small-another-without-a-cluster"),
    pytest.param((), {"west-1": ("eu-west", SMALL)}, ("eu-west",), Fit.NEVER, (),
                 id="nothing-configured-every-allowed-region-reports-too-small"),
    pytest.param((), {"west-1": ("eu-west", SMALL), "north-1": ("eu-north", SMALL)}, (), Fit.NEVER, (),
                 id="nothing-configured-any-region-every-reporting-cluster-too-small"),
    pytest.param(("eu-north", "eu-west"), {"west-1": ("eu-west", SMALL)}, (), Fit.LATER, ("eu-north",),
                 id="configured-region-without-a-cluster-any-region-allowed"),
    pytest.param(("eu-north", "eu-west"), {"west-1": ("eu-west", SMALL)}, ("eu-west", "eu-north"), Fit.LATER,
                 ("eu-north",), id="configured-allowed-region-without-a-cluster"),
    pytest.param(("eu-north", "eu-west"), {"west-1": ("eu-west", SMALL), "local": ("local", BIG)}, ("eu-west",),
                 Fit.NEVER, (), id="configured-the-only-allowed-region-reports-too-small"),
    pytest.param(("eu-north", "eu-west"), {"west-1": ("eu-west", SMALL), "north-1": ("eu-north", SMALL)}, (),
                 Fit.NEVER, (), id="configured-every-region-reports-too-small"),
    pytest.param(("eu-north",), {}, ("mars-1",), Fit.NEVER, (), id="configured-allowed-region-neither-known"),
    pytest.param(("eu-north",), {}, (), Fit.LATER, ("eu-north",), id="configured-nothing-reported"),
])
def test_the_rule(configured: tuple[str, ...], clusters: dict[str, tuple[str, dict[str, int]]],
                  allowed: tuple[str, ...], fit: Fit, waiting: tuple[str, ...]) -> None:
    outlook = _outlook(_registry(configured, clusters), allowed)
    assert (outlook.fit, outlook.waiting_for) == (fit, waiting), outlook.reason
    if fit is Fit.LATER and waiting:
        assert all(region in outlook.reason for region in waiting)


@pytest.mark.parametrize("configured", [pytest.param((), id="nothing-configured"),
                                        pytest.param(("eu-north", "eu-west", "local", "us-east"), id="configured")])
def test_an_allowed_region_without_a_cluster_waits_whichever_others_report(configured: tuple[str, ...]) -> None:
    """Clusters outside the allowed regions, big or small, reporting or not, never fail the workload."""
    others = {"local": ("local", BIG), "east-1": ("us-east", SMALL), "west-1": ("eu-west", SMALL)}
    for n in range(len(others) + 1):
        for names in itertools.combinations(others, n):
            outlook = _outlook(_registry(configured, {k: others[k] for k in names}), ("eu-north", "eu-west"))
            assert outlook.fit is Fit.LATER and outlook.waiting_for[0] == "eu-north", (names, outlook)


@pytest.mark.parametrize("configured", [pytest.param((), id="nothing-configured"),
                                        pytest.param(("eu-north",), id="configured")])
def test_a_replica_larger_than_any_node_can_be_never_fits(configured: tuple[str, ...]) -> None:
    outlook = _registry(configured, {}).fit_outlook(replicas=1, milli_cpu=1000, memory_bytes=2**63,
                                                    gpu=0.0, allowed_regions=None)
    assert outlook.fit is Fit.NEVER


def test_a_cluster_that_is_down_still_counts() -> None:
    registry = ClusterRegistry(cluster_timeout_s=1.0)
    registry.apply(_summary("west-1", "eu-west", **BIG), now_s=1000.0)
    assert registry.sweep(now_s=1010.0) == ["west-1"]
    assert _outlook(registry, ("eu-west",)).fit is Fit.NOW  # it may come back


def test_a_replica_larger_than_the_largest_node_never_fits_there() -> None:
    registry = _registry((), {"west-1": ("eu-west", BIG)})  # 128 cores in all, 32 per node
    assert _outlook(registry, ("eu-west",), cores=48, replicas=1).fit is Fit.NEVER


# ------------------------------------------------------------------ the router


def _engine(configured: tuple[str, ...]) -> GlobalScheduler:
    settings = GlobalSchedulerSettings(bus={"url": "memory://"}, registry={"regions": list(configured)},
                                       routing={"policy": "karmada", "worker_process": False})
    return GlobalScheduler(settings=settings, bus=open_bus("memory://"))


def _spec(allowed: tuple[str, ...], *, cpu: str = "8") -> api.WorkloadSpec:
    return api.WorkloadSpec(name="web", tenant="shop", replicas=2, allowed_regions=allowed,
                            requests=api.ResourceQuantities(cpu=cpu, memory="1Gi"))


def test_accepted_before_the_first_report_it_waits_for_its_region_then_runs_there() -> None:
    """The README's walk-through gone wrong: a workload for eu-north/eu-west, accepted before any report, then
    a worker in region `local` reports. It is PENDING and says what it waits for, not FAILED; a cluster in
    eu-west then takes it."""
    engine = _engine(())
    spec = _spec(("eu-north", "eu-west"))
    w, _ = engine.store.create(spec, parse_requests(spec.requests), "")
    engine.registry.apply(_summary("local", "local", **BIG), now_s=1000.0)
    engine.route_batch([w.id])
    waiting = engine.store.get(w.id)
    assert waiting.state == api.WORKLOAD_STATE_PENDING
    assert waiting.message.startswith("waiting: no cluster in eu-north, eu-west has reported yet"), waiting.message
    engine.registry.apply(_summary("west-1", "eu-west", **BIG), now_s=1001.0)
    engine.route_batch([w.id])
    routed = engine.store.get(w.id)
    assert (routed.state, routed.cluster) == (api.WORKLOAD_STATE_DISPATCHED, "west-1")


@pytest.mark.parametrize(("configured", "allowed", "state", "message"), [
    pytest.param((), ("eu-west",), api.WORKLOAD_STATE_FAILED,
                 "no allowed cluster can ever fit it: none of the 1 reporting cluster(s) in eu-west can hold it",
                 id="every-allowed-region-reports-too-small"),
    pytest.param((), ("eu-north", "eu-west"), api.WORKLOAD_STATE_PENDING,
                 "waiting: none of the 1 reporting cluster(s) in eu-north, eu-west can hold it, even empty; a cluster "
                 "in eu-north, where none reports yet, may", id="nothing-configured-another-allowed-region"),
    pytest.param(("eu-north", "eu-west"), (), api.WORKLOAD_STATE_PENDING,
                 "waiting: none of the 1 reporting cluster(s) can hold it, even empty; a cluster in eu-north",
                 id="configured-region-without-a-cluster"),
    pytest.param(("eu-west",), (), api.WORKLOAD_STATE_FAILED, "no allowed cluster can ever fit it",
                 id="configured-every-region-reports-too-small"),
])
def test_too_big_for_every_reporting_cluster(configured: tuple[str, ...], allowed: tuple[str, ...], state: int,
                                             message: str) -> None:
    engine = _engine(configured)
    engine.registry.apply(_summary("west-1", "eu-west", **SMALL), now_s=1000.0)
    spec = _spec(allowed)
    w, _ = engine.store.create(spec, parse_requests(spec.requests), "")
    engine.route_batch([w.id])
    got = engine.store.get(w.id)
    assert got.state == state and got.message.startswith(message), got.message


# ------------------------------------------------------------------ SubmitWorkload


@pytest.fixture
def stub_and_engine() -> Iterator[tuple[api_grpc.GlobalSchedulerStub, GlobalScheduler]]:
    settings = GlobalSchedulerSettings(api={"listen": "127.0.0.1:0", "max_workers": 8}, bus={"url": "memory://"},
                                       registry={"regions": []}, routing={"policy": "karmada", "worker_process": False},
                                       store={"persist": False})
    engine = GlobalScheduler(settings=settings, bus=open_bus("memory://"))
    server = build_server(engine)
    channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
    yield api_grpc.GlobalSchedulerStub(channel), engine
    channel.close()
    server.stop(0.2)


def test_submit_applies_the_same_rule(stub_and_engine) -> None:
    stub, engine = stub_and_engine
    engine.registry.apply(_summary("west-1", "eu-west", **SMALL), now_s=1000.0)
    # eu-north may still gain a cluster: accepted, and it waits.
    ok = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=_spec(("eu-west", "eu-north"))), timeout=10)
    assert ok.state == api.WORKLOAD_STATE_PENDING
    # Every allowed region reports, and none can hold it: refused.
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=_spec(("eu-west",))), timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_details(err.value).reason == "NO_CLUSTER_CAN_FIT"
