"""The operators' API end to end: real gRPC server on loopback, real Redis, regional dispatch workers
placing replicas on simulated clusters."""

from __future__ import annotations

import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client import REGISTRY

from global_scheduler.errors import error_details
from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from tests.global_api_helpers import AUTH, TOKEN, self_signed_certificate, spec, wait_state


def test_submit_dispatch_place_running(federation) -> None:
    fed = federation()
    stub = fed.stub()
    w = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k-1"), metadata=AUTH)
    assert w.state == api.WORKLOAD_STATE_PENDING and w.id
    states = []
    for update in stub.WatchWorkload(api.WatchWorkloadRequest(id=w.id), metadata=AUTH, timeout=30):
        states.append(update.state)
        if update.state == api.WORKLOAD_STATE_RUNNING:
            break
    assert states[-1] == api.WORKLOAD_STATE_RUNNING
    running = stub.GetWorkload(api.GetWorkloadRequest(id=w.id), metadata=AUTH)
    assert running.cluster in fed.workers and running.attempt == 1
    assert len(running.nodes) == 2 and all(n.startswith(running.cluster) for n in running.nodes)
    # The regional worker really holds the replicas: 2 × 2 CPU on its simulated cluster.
    assert int(fed.workers[running.cluster].state.req_milli_cpu.sum()) == 4000
    listed = stub.ListWorkloads(api.ListWorkloadsRequest(state=api.WORKLOAD_STATE_RUNNING), metadata=AUTH)
    assert [x.id for x in listed.workloads] == [w.id]
    clusters = stub.ListClusters(api.ListClustersRequest(), metadata=AUTH).clusters
    assert {c.name for c in clusters} == set(fed.workers) and all(c.ready for c in clusters)
    # Its time from acceptance to dispatch was recorded, and exported under the engine's policy.
    assert len(fed.engine.dispatch_lag_seconds) == 1
    lag = fed.engine.dispatch_lag_seconds[0]
    assert 0 <= lag <= running.updated_unix_s - running.created_unix_s + 1e-3
    assert REGISTRY.get_sample_value("meridian_dispatch_lag_seconds_count",
                                     {"policy": fed.engine.policy_name}) >= 1


def test_idempotent_resubmission(federation) -> None:
    fed = federation()
    stub = fed.stub()
    first = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="same"), metadata=AUTH)
    again = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="same"), metadata=AUTH)
    assert again.id == first.id
    wait_state(stub, first.id, api.WORKLOAD_STATE_RUNNING)
    third = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="same"), metadata=AUTH)
    assert third.id == first.id and third.state == api.WORKLOAD_STATE_RUNNING
    assert len(fed.engine.store) == 1
    # Dispatched exactly once: one place entry across every dispatch stream.
    placed = sum(w.placed_total for w in fed.workers.values())
    assert placed == 1


@pytest.mark.parametrize(("mutate", "field"), [
    pytest.param(lambda s: s.ClearField("name"), "spec.name", id="missing-name"),
    pytest.param(lambda s: setattr(s, "name", "Not_A_Label"), "spec.name", id="bad-name"),
    pytest.param(lambda s: s.ClearField("tenant"), "spec.tenant", id="missing-tenant"),
    pytest.param(lambda s: setattr(s, "replicas", 0), "spec.replicas", id="zero-replicas"),
    pytest.param(lambda s: setattr(s.requests, "cpu", "two"), "spec.requests.cpu", id="bad-cpu"),
    pytest.param(lambda s: setattr(s.requests, "memory", "-1Gi"), "spec.requests.memory", id="negative-memory"),
    pytest.param(lambda s: setattr(s.requests, "gpu_milli", "1500"), "spec.requests.gpu_milli", id="gpu-share-over-one"),
    pytest.param(lambda s: s.ClearField("requests"), "spec.requests", id="missing-requests"),
    pytest.param(lambda s: s.allowed_regions.append("eu north"), "spec.allowed_regions[0]", id="bad-region"),
    pytest.param(lambda s: setattr(s, "latency_slo_ms", -5.0), "spec.latency_slo_ms", id="negative-slo"),
    pytest.param(lambda s: setattr(s, "latency_slo_ms", 50.0), "spec.origin_region", id="slo-without-origin"),
    pytest.param(lambda s: setattr(s, "deferrable", True), "spec.deadline_unix_s", id="deferrable-without-deadline"),
    pytest.param(lambda s: setattr(s, "deadline_unix_s", 2e9), "spec.deadline_unix_s", id="deadline-not-deferrable"),
    pytest.param(lambda s: setattr(s.weights, "energy", -1.0), "spec.weights.energy", id="negative-weight"),
    pytest.param(lambda s: setattr(s, "workload_class", "gold"), "spec.workload_class", id="unknown-class"),
])
def test_invalid_argument_names_the_field(federation, mutate, field: str) -> None:
    fed = federation()
    bad = spec()
    mutate(bad)
    with pytest.raises(grpc.RpcError) as err:
        fed.stub().SubmitWorkload(api.SubmitWorkloadRequest(spec=bad), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(field + ":")
    assert ("meridian-field", field) in tuple(err.value.trailing_metadata())
    details = error_details(err.value)  # the standard google.rpc.BadRequest / ErrorInfo details
    assert details.fields == (field,) and details.reason == "INVALID_FIELD"
    assert len(fed.engine.store) == 0


@pytest.mark.parametrize(("kw", "field"), [
    pytest.param({"allowed_regions": ["mars-1"]}, "spec.allowed_regions", id="no-allowed-region-has-a-cluster"),
    pytest.param({"origin_region": "us-east", "latency_slo_ms": 50.0}, "spec.origin_region",
                 id="slo-from-a-region-without-clusters"),
])
def test_unknown_regions_are_named(federation, kw: dict, field: str) -> None:
    fed = federation()
    with pytest.raises(grpc.RpcError) as err:
        fed.stub().SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(**kw)), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    details = error_details(err.value)
    assert details.fields == (field,) and details.reason == "UNKNOWN_REGION"
    assert "eu-central, eu-north" in err.value.details()  # says which regions do have clusters
    assert len(fed.engine.store) == 0
    # One known region among the allowed is enough (residency lists may name regions not deployed yet).
    ok = fed.stub().SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(allowed_regions=["mars-1", "eu-north"])),
                                   metadata=AUTH)
    assert ok.state == api.WORKLOAD_STATE_PENDING


def test_status_codes(federation) -> None:
    fed = federation()
    stub = fed.stub()
    for call, request in [(stub.GetWorkload, api.GetWorkloadRequest(id="nope")),
                          (stub.CancelWorkload, api.CancelWorkloadRequest(id="nope"))]:
        with pytest.raises(grpc.RpcError) as err:
            call(request, metadata=AUTH)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert error_details(err.value).workload_id == "nope"
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.WatchWorkload(api.WatchWorkloadRequest(id="nope"), metadata=AUTH, timeout=10)))
    assert err.value.code() == grpc.StatusCode.NOT_FOUND
    first = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k"), metadata=AUTH)
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(replicas=3), idempotency_key="k"), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.ALREADY_EXISTS
    taken = error_details(err.value)
    assert (taken.workload_id, taken.reason, taken.fields) == (first.id, "IDEMPOTENCY_KEY_REUSED", ("idempotency_key",))
    # 4 nodes × 32 CPU per cluster: 200 replicas of 32 CPU can never fit, nor can one 64-CPU replica.
    for too_big in (spec(replicas=200, requests=api.ResourceQuantities(cpu="32")),
                    spec(replicas=1, requests=api.ResourceQuantities(cpu="64")),
                    spec(allowed_regions=["eu-north"], replicas=5, requests=api.ResourceQuantities(cpu="32"))):
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=too_big), metadata=AUTH)
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert error_details(err.value).reason == "NO_CLUSTER_CAN_FIT"
    with pytest.raises(grpc.RpcError) as err:
        stub.ListWorkloads(api.ListWorkloadsRequest(page_token="garbage"), metadata=AUTH)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("metadata", [
    pytest.param((), id="missing-token"),
    pytest.param((("authorization", "Bearer wrong"),), id="wrong-token"),
    pytest.param((("authorization", f"Basic {TOKEN}"),), id="wrong-scheme"),
])
def test_unauthenticated_never_reaches_the_servicer(federation, metadata) -> None:
    fed = federation()
    stub = fed.stub()
    for call, request in [(stub.SubmitWorkload, api.SubmitWorkloadRequest(spec=spec())),
                          (stub.ListClusters, api.ListClustersRequest())]:
        with pytest.raises(grpc.RpcError) as err:
            call(request, metadata=metadata)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert error_details(err.value).reason == ("INVALID_TOKEN" if "wrong" in str(metadata) else "MISSING_TOKEN")
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.WatchWorkload(api.WatchWorkloadRequest(id="x"), metadata=metadata, timeout=10)))
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert len(fed.engine.store) == 0
    assert fed.server.interceptor is not None and fed.server.interceptor.rejected == 3


def test_health_and_reflection_are_open(federation) -> None:
    fed = federation()
    channel = grpc.insecure_channel(fed.target)
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", "meridian.v1.GlobalScheduler"):
        assert health.Check(health_pb2.HealthCheckRequest(service=service)).status == \
            health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    reply = next(iter(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
    names = {s.name for s in reply.list_services_response.service}
    assert "meridian.v1.GlobalScheduler" in names


def test_paging_and_cancel(federation) -> None:
    fed = federation()
    stub = fed.stub()
    ids = [stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(name=f"w{i}", replicas=1)), metadata=AUTH).id
           for i in range(5)]
    seen, token = [], ""
    while True:
        page = stub.ListWorkloads(api.ListWorkloadsRequest(page_size=2, page_token=token), metadata=AUTH)
        assert len(page.workloads) <= 2
        seen += [w.id for w in page.workloads]
        token = page.next_page_token
        if not token:
            break
    assert seen == ids
    wait_state(stub, ids[0], api.WORKLOAD_STATE_RUNNING)
    cancelled = stub.CancelWorkload(api.CancelWorkloadRequest(id=ids[0]), metadata=AUTH)
    assert cancelled.state == api.WORKLOAD_STATE_CANCELLED
    worker = fed.workers[cancelled.cluster]
    wait_for(lambda: ids[0] not in worker.held, message="the cluster to release the cancelled workload")


def test_cluster_that_stops_reporting_is_failed_over(federation) -> None:
    fed = federation({"north-1": ("eu-north", 4, 10.0), "north-2": ("eu-north", 4, 20.0),
                      "central-1": ("eu-central", 4, 300.0)})
    stub = fed.stub()
    ids = [stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(name=f"w{i}", replicas=1)), metadata=AUTH).id
           for i in range(9)]
    running = [wait_state(stub, wid, api.WORKLOAD_STATE_RUNNING) for wid in ids]
    victim = running[0].cluster
    on_victim = {w.id for w in running if w.cluster == victim}
    assert on_victim
    fed.stop_cluster(victim)
    for wid in on_victim:
        moved = wait_for(lambda wid=wid: (w := stub.GetWorkload(api.GetWorkloadRequest(id=wid), metadata=AUTH)).state
                         == api.WORKLOAD_STATE_RUNNING and w.cluster != victim and w,
                         timeout=30, message=f"{wid} to fail over")
        assert moved.attempt == 2
    final = {wid: stub.GetWorkload(api.GetWorkloadRequest(id=wid), metadata=AUTH) for wid in ids}
    assert all(w.state == api.WORKLOAD_STATE_RUNNING for w in final.values()), "a workload was lost"
    assert not any(w.cluster == victim for w in final.values())
    clusters = {c.name: c for c in stub.ListClusters(api.ListClustersRequest(), metadata=AUTH).clusters}
    assert not clusters[victim].ready


def test_rejected_by_cluster_is_rerouted(federation) -> None:
    # north-1 (cleanest, so least-carbon picks it first) has 2 × 32 CPU: 64 CPU free in total and 32 on
    # its largest node, so 3 replicas of 20 CPU look feasible to the registry, but only one fits per node.
    fed = federation({"north-1": ("eu-north", 2, 10.0), "central-1": ("eu-central", 4, 300.0)}, policy="least-carbon")
    stub = fed.stub()
    w = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(replicas=3, requests=api.ResourceQuantities(cpu="20"))),
                            metadata=AUTH)
    done = wait_state(stub, w.id, api.WORKLOAD_STATE_RUNNING)
    assert done.cluster == "central-1" and done.attempt == 2
    assert fed.workers["north-1"].failed_total == 1
    assert int(fed.workers["north-1"].state.req_milli_cpu.sum()) == 0  # all or nothing: nothing left behind


def test_failback_of_deferrable_work_that_has_not_started(federation) -> None:
    # Pods take 30 s to start on these simulated clusters, so dispatched work stays SCHEDULED.
    fed = federation({"north-1": ("eu-north", 4, 10.0), "central-1": ("eu-central", 4, 300.0)},
                     policy="least-carbon", start_delay_s=30.0)
    stub = fed.stub()
    fed.stop_cluster("north-1")
    wait_for(lambda: not fed.engine.registry.is_ready("north-1"), message="north-1 to be marked down")
    batch = spec(name="train", replicas=1, deferrable=True, deadline_unix_s=time.time() + 6 * 3600,
                 weights=api.ObjectiveWeights(energy=1.0))
    # Deferring is the policy's call; least-carbon never defers, so the job goes to the only live cluster.
    w = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=batch), metadata=AUTH)
    first = wait_state(stub, w.id, api.WORKLOAD_STATE_SCHEDULED)
    assert first.cluster == "central-1"
    fed.start_cluster("north-1")  # the cleaner cluster recovers before the job started
    moved = wait_for(lambda: (x := stub.GetWorkload(api.GetWorkloadRequest(id=w.id), metadata=AUTH)).cluster
                     == "north-1" and x.state == api.WORKLOAD_STATE_SCHEDULED and x,
                     timeout=30, message="failback to north-1")
    assert moved.attempt == 2
    wait_for(lambda: w.id not in fed.workers["central-1"].held, message="central-1 to release the job")


def test_tls(federation, tmp_path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    fed = federation(tls=(str(cert), str(key)))
    from protos import global_api_pb2_grpc as api_grpc

    secure = api_grpc.GlobalSchedulerStub(grpc.secure_channel(fed.target, grpc.ssl_channel_credentials(cert.read_bytes())))
    clusters = secure.ListClusters(api.ListClustersRequest(), metadata=AUTH, timeout=10).clusters
    assert {c.name for c in clusters} == set(fed.workers)
    with pytest.raises(grpc.RpcError) as err:
        fed.stub().ListClusters(api.ListClustersRequest(), metadata=AUTH, timeout=5)  # plaintext to a TLS port
    assert err.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def test_oversized_request_is_refused_and_the_server_goes_on(federation) -> None:
    fed = federation()
    stub = fed.stub()
    huge = spec(tenant="t" * (5 * 2**20))  # over the server's receive limit (api.max_receive_message_bytes, 1 MiB)
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=huge), metadata=AUTH, timeout=30)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert len(fed.engine.store) == 0
    ok = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec()), metadata=AUTH, timeout=30)
    assert ok.state == api.WORKLOAD_STATE_PENDING and len(fed.engine.store) == 1
