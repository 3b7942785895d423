"""One client cannot take the API down: bounded fields, a 1 MiB request limit, stream limits that keep
threads for unary calls and health checks, ListWorkloads pages bounded in bytes, and garbage bytes
answered INVALID_ARGUMENT without a traceback. Real server on loopback, real Redis (issue 22)."""

from __future__ import annotations

import contextlib
import json
import logging

import grpc
import pytest
from google.protobuf.descriptor import FieldDescriptor
from grpc_health.v1 import health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from global_scheduler.bench_api import length_delimited_field
from global_scheduler.errors import error_details
from global_scheduler.validation import (
    FIELD_BOUNDS,
    MAX_SPEC_BYTES,
    InvalidArgumentError,
    parse_requests,
    validate_list,
    validate_submit,
)
from meridian.cli import build_app
from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from tests.global_api_helpers import TOKEN

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


AUTH = (("authorization", f"Bearer {TOKEN}"),)
SERVICE = api.DESCRIPTOR.services_by_name["GlobalScheduler"]


def spec(**kw: object) -> api.WorkloadSpec:
    base: dict[str, object] = {"name": "web", "tenant": "shop", "replicas": 1,
                               "requests": api.ResourceQuantities(cpu="500m")}
    base.update(kw)
    return api.WorkloadSpec(**base)


# --- every request field is bounded -----------------------------------------------------------------

def _bounded_paths(descriptor, prefix: str) -> set[str]:
    """Paths of every string, bytes, repeated or message field below ``descriptor``."""
    out: set[str] = set()
    for f in descriptor.fields:
        path = f"{prefix}.{f.name}"
        if f.type == FieldDescriptor.TYPE_MESSAGE:
            out.add(path)
            out |= _bounded_paths(f.message_type, path)
        elif f.type in (FieldDescriptor.TYPE_STRING, FieldDescriptor.TYPE_BYTES) or f.is_repeated:
            out.add(path)
    return out


def test_every_string_and_repeated_request_field_has_a_documented_bound() -> None:
    paths: set[str] = set()
    for method in SERVICE.methods:
        paths |= _bounded_paths(method.input_type, method.input_type.name)
    # Nested messages of fixed-size fields only (weights) need no bound of their own; the spec has one.
    unbounded = {p for p in paths - set(FIELD_BOUNDS) if p not in {"SubmitWorkloadRequest.spec.requests",
                                                                    "SubmitWorkloadRequest.spec.weights"}}
    assert not unbounded, f"request fields without a bound in validation.FIELD_BOUNDS: {sorted(unbounded)}"
    assert set(FIELD_BOUNDS) <= paths, "FIELD_BOUNDS names a field the requests do not have"


def _oversized_spec_request() -> api.SubmitWorkloadRequest:
    request = api.SubmitWorkloadRequest(spec=spec())
    request.spec.MergeFromString(length_delimited_field(1000, b"x" * (MAX_SPEC_BYTES + 1)))
    return request


@pytest.mark.parametrize(("request_", "field"), [
    pytest.param(api.SubmitWorkloadRequest(spec=spec(requests=api.ResourceQuantities(cpu="1" * 100_000))),
                 "spec.requests.cpu", id="huge-cpu-quantity"),
    pytest.param(api.SubmitWorkloadRequest(spec=spec(requests=api.ResourceQuantities(memory="9" * 65))),
                 "spec.requests.memory", id="memory-quantity-over-64"),
    pytest.param(api.SubmitWorkloadRequest(spec=spec(requests=api.ResourceQuantities(cpu="1", gpu="0" * 65))),
                 "spec.requests.gpu", id="gpu-quantity-over-64"),
    pytest.param(api.SubmitWorkloadRequest(spec=spec(requests=api.ResourceQuantities(gpu_milli="5" * 65))),
                 "spec.requests.gpu_milli", id="gpu-milli-quantity-over-64"),
    pytest.param(api.SubmitWorkloadRequest(spec=spec(origin_region="r" * 100_000)), "spec.origin_region",
                 id="huge-origin-region"),
    pytest.param(api.SubmitWorkloadRequest(spec=spec(workload_class="c" * 100_000)), "spec.workload_class",
                 id="huge-class"),
    pytest.param(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k" * 100_000), "idempotency_key",
                 id="huge-idempotency-key"),
    pytest.param(_oversized_spec_request(), "spec", id="unknown-fields-over-16KiB"),
])
def test_oversized_submit_fields_are_named(request_: api.SubmitWorkloadRequest, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        validate_submit(request_, now_s=0.0)
    assert err.value.field == field and len(str(err.value)) < 300


def test_the_largest_valid_spec_is_well_under_the_bound() -> None:
    # 64 regions of 63 characters, the longest name, tenant and quantities: what the bounds allow.
    biggest = api.SubmitWorkloadRequest(spec=spec(
        name="n" * 63, tenant="t" * 253, allowed_regions=[f"{i:02d}" + "r" * 61 for i in range(64)],
        origin_region="o" * 63, workload_class="latency-sensitive", deferrable=True, deadline_unix_s=2e9,
        requests=api.ResourceQuantities(cpu="1" * 10, memory="1" * 10, gpu_milli="500"),
        weights=api.ObjectiveWeights(performance=1, cost=1, energy=1, fairness=1)), idempotency_key="k" * 256)
    validate_submit(biggest, now_s=0.0)
    assert biggest.spec.ByteSize() < MAX_SPEC_BYTES / 2
    assert parse_requests(biggest.spec.requests).milli_cpu == 1_111_111_111_000


@pytest.mark.parametrize(("request_", "field"), [
    pytest.param(api.ListWorkloadsRequest(tenant="t" * 100_000), "tenant", id="huge-tenant-filter"),
    pytest.param(api.ListWorkloadsRequest(tenant="a|b"), "tenant", id="tenant-filter-not-a-tenant"),
    pytest.param(api.ListWorkloadsRequest(cluster="c" * 100_000), "cluster", id="huge-cluster-filter"),
    pytest.param(api.ListWorkloadsRequest(page_token="9" * 100_000), "page_token", id="huge-page-token"),
    pytest.param(api.ListWorkloadsRequest(page_token="-1"), "page_token", id="negative-page-token"),
    pytest.param(api.ListWorkloadsRequest(page_token="١٢"), "page_token", id="non-ascii-digits"),
    pytest.param(api.ListWorkloadsRequest(page_size=-1), "page_size", id="negative-page-size"),
    pytest.param(api.ListWorkloadsRequest(page_size=1001), "page_size", id="page-size-over-max"),
    pytest.param(api.ListWorkloadsRequest(state=99), "state", id="unknown-state"),
])
def test_list_filters_are_bounded(request_: api.ListWorkloadsRequest, field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        validate_list(request_, default_page_size=100, max_page_size=1000)
    assert err.value.field == field and len(str(err.value)) < 300


def test_huge_fields_over_grpc(federation) -> None:
    fed = federation()
    stub = fed.stub()
    huge_id = "i" * 500_000
    for call, request in [(stub.GetWorkload, api.GetWorkloadRequest(id=huge_id)),
                          (stub.CancelWorkload, api.CancelWorkloadRequest(id=huge_id)),
                          (stub.ListWorkloads, api.ListWorkloadsRequest(cluster="c" * 500_000)),
                          (stub.SubmitWorkload, _oversized_spec_request())]:
        with pytest.raises(grpc.RpcError) as err:
            call(request, metadata=AUTH, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
        assert len(err.value.details()) < 300
        assert error_details(err.value).fields in {("id",), ("cluster",), ("spec",)}
    with pytest.raises(grpc.RpcError) as err:
        next(iter(stub.WatchWorkload(api.WatchWorkloadRequest(id=huge_id), metadata=AUTH, timeout=10)))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and error_details(err.value).fields == ("id",)
    # Unknown fields beyond MAX_SPEC_BYTES were not stored (nor anything else).
    assert len(fed.engine.store) == 0


def test_a_request_over_one_mib_is_refused_by_the_transport(federation) -> None:
    fed = federation()
    stub = fed.stub()
    request = api.SubmitWorkloadRequest(spec=spec())
    request.spec.MergeFromString(length_delimited_field(1000, b"x" * (3 * 2**19)))  # 1.5 MiB
    with pytest.raises(grpc.RpcError) as err:
        stub.SubmitWorkload(request, metadata=AUTH, timeout=10)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert fed.server.undecodable is not None and fed.server.undecodable.refused == 0  # no handler ran
    assert stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec()), metadata=AUTH, timeout=10).id


# --- watches cannot take every handler thread ------------------------------------------------------

def _open_watch(stub, wid: str, token: str):
    """A watch that has its first snapshot (so it holds its slot), or the error that refused it."""
    call = stub.WatchWorkload(api.WatchWorkloadRequest(id=wid), metadata=(("authorization", f"Bearer {token}"),),
                              timeout=20)
    try:
        first = next(call)
    except grpc.RpcError as exc:
        return None, exc
    assert first.id == wid
    return call, None


def test_watches_are_limited_and_unary_calls_keep_their_threads(federation) -> None:
    # 8 handler threads: at most 4 streams, at most 3 per token, 4 threads always left.
    fed = federation(tokens=["alice", "bob"], api={"max_workers": 8, "max_watches_total": 4,
                                                   "max_watches_per_token": 3, "reserved_workers": 4})
    stub = fed.stub()
    alice = (("authorization", "Bearer alice"),)
    wid = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec()), metadata=alice, timeout=10).id
    open_calls, refused = [], []
    for token in ["alice"] * 4 + ["bob"] * 2 + ["alice", "bob"] * 5:  # 16 watches on 8 threads
        call, err = _open_watch(stub, wid, token)
        (open_calls if call is not None else refused).append(call or (token, err))
    assert len(open_calls) == 4 and len(refused) == 12
    assert all(err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for _, err in refused)
    assert all(error_details(err).reason == "TOO_MANY_WATCHES" for _, err in refused)
    assert "max_watches_per_token" in refused[0][1].details()  # alice's 4th: her own limit
    assert "max_watches_total" in refused[1][1].details()  # bob's 2nd: the server's
    assert fed.server.streams is not None and fed.server.streams.open == 4
    # Unary calls and the health check are answered while every stream slot is taken (the watches never end
    # on their own: a call left without a thread would wait out its deadline, however generous).
    health = health_pb2_grpc.HealthStub(grpc.insecure_channel(fed.target))
    for _ in range(5):
        assert stub.ListClusters(api.ListClustersRequest(), metadata=alice, timeout=30).clusters
        assert health.Check(health_pb2.HealthCheckRequest(), timeout=30).status == \
            health_pb2.HealthCheckResponse.SERVING
    # Closing a watch frees its slot (once its handler sees the client gone: within the 1 s poll).
    open_calls[0].cancel()
    wait_for(lambda: fed.server.streams.open == 3, timeout=10, message="the cancelled watch's slot")
    call, err = _open_watch(stub, wid, "bob")
    assert err is None
    for c in [*open_calls[1:], call]:
        c.cancel()
    wait_for(lambda: fed.server.streams.open == 0, timeout=10, message="every slot to be freed")


def test_too_few_threads_for_the_watch_limit_refuse_to_start(federation) -> None:
    from global_scheduler.server import UnsafeSettingsError

    with pytest.raises(UnsafeSettingsError, match="reserved_workers"):
        federation(api={"max_workers": 8, "max_watches_total": 6, "reserved_workers": 4})


# --- ListWorkloads pages end at a byte budget ------------------------------------------------------

def test_big_workloads_page_by_bytes_and_ls_lists_them_all(federation) -> None:
    fed = federation()
    store = fed.engine.store
    regions = [f"region-{i:02d}-" + "x" * 50 for i in range(64)]
    # 120 workloads of ~60 KB each (2,000 replicas' node names): 100 of them, the CLI's default page,
    # are ~6 MB, over a gRPC client's default 4 MiB receive limit.
    nodes = [f"node-{i:05d}.zone-a.example" for i in range(2000)]
    for i in range(120):
        s = spec(name=f"big-{i}", allowed_regions=regions)
        w, _ = store.create(s, parse_requests(s.requests), "")
        store.update(w.id, nodes=nodes)
    one = store.get(w.id).ByteSize()
    assert 55_000 < one < 70_000
    stub = fed.stub()
    page = stub.ListWorkloads(api.ListWorkloadsRequest(page_size=1000), metadata=AUTH, timeout=30)
    assert page.next_page_token and page.ByteSize() <= fed.engine.settings.api.max_page_bytes + 100
    assert len(page.workloads) == fed.engine.settings.api.max_page_bytes // (one + 4)
    seen, token = [w.id for w in page.workloads], page.next_page_token
    while token:
        page = stub.ListWorkloads(api.ListWorkloadsRequest(page_size=1000, page_token=token), metadata=AUTH)
        seen += [w.id for w in page.workloads]
        token = page.next_page_token
    assert len(seen) == len(set(seen)) == 120
    env = {"MERIDIAN_API": fed.target, "MERIDIAN_TOKEN": TOKEN}
    out = CliRunner().invoke(build_app(), ["ls", "-o", "json"], env=env)  # default --limit 100
    assert out.exit_code == 0, out.output[-500:]
    assert len(json.loads(out.output)) == 100
    out = CliRunner().invoke(build_app(), ["ls", "--limit", "0", "-o", "json"], env=env)  # every page
    assert out.exit_code == 0, out.output[-500:]
    assert [w["id"] for w in json.loads(out.output)] == seen


# --- garbage bytes ---------------------------------------------------------------------------------

def test_garbage_bytes_are_invalid_argument_without_a_traceback(federation, caplog) -> None:
    fed = federation()
    caplog.set_level(logging.INFO)
    channel = grpc.insecure_channel(fed.target)
    garbage = b"\xff\xff\xff"
    submit = channel.unary_unary(f"/{SERVICE.full_name}/SubmitWorkload")  # no serializers: raw bytes
    with pytest.raises(grpc.RpcError) as err:
        submit(garbage, metadata=AUTH, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert error_details(err.value).reason == "UNDECODABLE_REQUEST"
    assert "SubmitWorkload" in err.value.details()
    lines = [r for r in caplog.records if "undecodable" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING and "3 bytes" in lines[0].getMessage()
    # The same for a stream, the open health service, and a caller without a token (refused first).
    watch = channel.unary_stream(f"/{SERVICE.full_name}/WatchWorkload")
    with pytest.raises(grpc.RpcError) as err:
        next(watch(garbage, metadata=AUTH, timeout=10))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    check = channel.unary_unary("/grpc.health.v1.Health/Check")
    with pytest.raises(grpc.RpcError) as err:
        check(garbage, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as err:
        submit(garbage, timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert fed.server.undecodable is not None and fed.server.undecodable.refused == 3
    assert not [r for r in caplog.records if r.exc_info or r.name.startswith("grpc")], \
        "a traceback or grpc error was logged"
    assert fed.server.streams is not None and fed.server.streams.open == 0
    # The server goes on serving well-formed calls.
    assert api_grpc.GlobalSchedulerStub(channel).ListClusters(api.ListClustersRequest(), metadata=AUTH,
                                                             timeout=10).clusters


def test_the_health_only_port_answers_while_every_api_thread_is_held(federation, monkeypatch) -> None:
    """grpcio gives a unary call its thread before the request arrives: calls that hold every handler
    thread (here: a store read held on purpose) starve health checks on the API port, not on
    api.health_listen's own server."""
    import threading

    fed = federation(api={"max_workers": 5, "max_watches_total": 1, "health_listen": "127.0.0.1:0"})
    assert fed.server.health_port
    release, entered = threading.Event(), threading.Semaphore(0)
    real_get = fed.engine.store.get

    def held_get(wid: str):
        entered.release()
        release.wait(30)
        return real_get(wid)

    monkeypatch.setattr(fed.engine.store, "get", held_get)
    auth = (("authorization", f"Bearer {TOKEN}"),)
    callers = [threading.Thread(target=lambda: _quietly(lambda: fed.stub().GetWorkload(
        api.GetWorkloadRequest(id="held"), metadata=auth, timeout=30))) for _ in range(5)]
    for t in callers:
        t.start()
    try:
        for _ in range(5):  # every handler thread is inside the held read
            assert entered.acquire(timeout=20)
        with grpc.insecure_channel(f"127.0.0.1:{fed.server.port}") as channel, pytest.raises(grpc.RpcError) as err:
            health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1.0)
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # the API port's probe starves
        with grpc.insecure_channel(f"127.0.0.1:{fed.server.health_port}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5.0)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        release.set()
        for t in callers:
            t.join(timeout=30)


def _quietly(call) -> None:
    with contextlib.suppress(grpc.RpcError):
        call()
