"""Requests judged before any cluster has reported: configured regions and physical node limits."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import grpc
import pytest

from global_scheduler.errors import error_details
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import RunningServer, build_server
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus import open_bus
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


TOKEN = "t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@pytest.fixture
def api_without_clusters(redis_url: str, key_prefix: str) -> Iterator[Callable[..., api_grpc.GlobalSchedulerStub]]:
    running: list[tuple[RunningServer, grpc.Channel]] = []

    def make(regions: list[str]) -> api_grpc.GlobalSchedulerStub:
        settings = GlobalSchedulerSettings(
            api={"listen": "127.0.0.1:0", "auth_tokens": [TOKEN], "max_workers": 8},
            bus={"url": redis_url, "key_prefix": key_prefix, "block_ms": 50},
            registry={"regions": regions}, routing={"policy": "karmada"})
        server = build_server(GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix)))
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        running.append((server, channel))
        return api_grpc.GlobalSchedulerStub(channel)

    yield make
    for server, channel in running:
        channel.close()
        server.stop(0.2)


def _spec(**kw: object) -> api.WorkloadSpec:
    base: dict[str, object] = {"name": "web", "tenant": "shop", "replicas": 2,
                               "requests": api.ResourceQuantities(cpu="2", memory="4Gi")}
    base.update(kw)
    return api.WorkloadSpec(**base)


def test_configured_regions_are_judged_before_any_cluster_reports(api_without_clusters) -> None:
    stub = api_without_clusters(["eu-north", "eu-west"])
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=_spec(allowed_regions=["mars-1"])), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(err.value).reason == "UNKNOWN_REGION"
    assert "known regions: eu-north, eu-west" in err.value.details()
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=_spec(origin_region="mars-1", latency_slo_ms=50.0)),
                            metadata=AUTH)
    assert error_details(err.value).reason == "UNKNOWN_REGION"
    ok = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=_spec(allowed_regions=["mars-1", "eu-west"])),
                             metadata=AUTH)
    assert ok.state == api.WORKLOAD_STATE_PENDING  # a configured region may have no cluster yet: it waits


@pytest.mark.parametrize("requests", [
    pytest.param(api.ResourceQuantities(cpu="1", memory="8Ei"), id="8Ei-memory"),
    pytest.param(api.ResourceQuantities(cpu="2000000", memory="1Gi"), id="2M-cores"),
])
@pytest.mark.parametrize("regions", [pytest.param([], id="nothing-configured"), pytest.param(["eu-north"], id="configured")])
def test_a_replica_larger_than_any_node_can_be_is_refused_before_any_report(api_without_clusters, requests,
                                                                          regions) -> None:
    stub = api_without_clusters(regions)
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=_spec(requests=requests)), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert error_details(err.value).reason == "NO_CLUSTER_CAN_FIT"


def test_nothing_configured_and_nothing_reported_accepts_and_waits(api_without_clusters) -> None:
    stub = api_without_clusters([])
    ok = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=_spec(allowed_regions=["eu-north"])), metadata=AUTH)
    assert ok.state == api.WORKLOAD_STATE_PENDING
