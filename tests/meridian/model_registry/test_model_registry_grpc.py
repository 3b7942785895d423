"""``ModelService`` on a real gRPC server on loopback, over a registry on the real Redis."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
import redis

from meridian.model_registry.artifacts import FilesystemArtifactStore
from meridian.model_registry.grpc_service import SERVICE_NAME, add_model_service
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import ModelVersion
from protos import models_pb2, models_pb2_grpc
from tests.redis_helpers import free_port


@pytest.fixture
def stub(registry: ModelRegistry) -> Iterator[models_pb2_grpc.ModelServiceStub]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add_model_service(server, registry)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield models_pb2_grpc.ModelServiceStub(channel)
    server.stop(grace=None)


def test_service_name() -> None:
    assert SERVICE_NAME == "meridian.v1.ModelService"


def test_list_and_get(stub: models_pb2_grpc.ModelServiceStub, register: Callable[..., ModelVersion]) -> None:
    first = register(metrics={"unschedulable_pods": 2.0, "gpu_fragmentation": 0.125})
    register("routing")
    register(parent=first.version_id)
    listed = stub.ListVersions(models_pb2.ListVersionsRequest(model="placement"), timeout=10)
    assert [v.version_id for v in listed.versions] == ["placement-v1", "placement-v2"]
    assert len(stub.ListVersions(models_pb2.ListVersionsRequest(), timeout=10).versions) == 3
    got = stub.GetVersion(models_pb2.GetVersionRequest(version_id="placement-v1"), timeout=10)
    assert (got.state, got.artifact_sha256, got.artifact_size_bytes) == (
        "candidate", first.artifact_digest, first.artifact_size_bytes)
    assert dict(got.metrics) == {"unschedulable_pods": 2.0, "gpu_fragmentation": 0.125}
    assert json.loads(got.feature_layout_json) == first.feature_layout and got.registered_by == "alice"
    assert got.data_window.start.ToDatetime().date().isoformat() == "2026-11-01" and got.data_window.digest
    child = stub.GetVersion(models_pb2.GetVersionRequest(version_id="placement-v2"), timeout=10)
    assert child.parent == "placement-v1"


def test_promote_and_rollback(stub: models_pb2_grpc.ModelServiceStub, registry: ModelRegistry,
                              register: Callable[..., ModelVersion]) -> None:
    ids = [register().version_id for _ in range(2)]
    for version_id in ids:
        for state in ("shadow", "canary", "active"):
            reply = stub.Promote(models_pb2.PromoteRequest(version_id=version_id, to_state=state, who="dana",
                                                           why=f"gate passed for {state}",
                                                           evidence_json='{"decisions": 500}'), timeout=10)
            assert reply.version.state == state
    assert [(t.version_id, t.from_state, t.to_state) for t in reply.transitions] == [
        ("placement-v1", "active", "retired"), ("placement-v2", "canary", "active")]
    assert json.loads(reply.transitions[1].evidence_json) == {"decisions": 500} and reply.transitions[1].who == "dana"
    back = stub.Rollback(models_pb2.RollbackRequest(model="placement", who="erin", why="regressed"), timeout=10)
    assert (back.active.version_id, back.active.state) == ("placement-v1", "active")
    assert (back.retired.version_id, back.retired.state) == ("placement-v2", "retired")
    assert registry.active("placement").version_id == "placement-v1"
    assert registry.audit("placement")[-1].who == "erin"


@pytest.mark.parametrize(("call", "code", "words"), [
    pytest.param(lambda s: s.GetVersion(models_pb2.GetVersionRequest(version_id="placement-v9"), timeout=10),
                 grpc.StatusCode.NOT_FOUND, "unknown model version 'placement-v9'", id="unknown-version"),
    pytest.param(lambda s: s.ListVersions(models_pb2.ListVersionsRequest(model="ranking"), timeout=10),
                 grpc.StatusCode.INVALID_ARGUMENT, "unknown model 'ranking'", id="unknown-model"),
    pytest.param(lambda s: s.Promote(models_pb2.PromoteRequest(version_id="placement-v1", to_state="active",
                                                               who="x", why="y"), timeout=10),
                 grpc.StatusCode.FAILED_PRECONDITION, "cannot go from candidate to active", id="forbidden"),
    pytest.param(lambda s: s.Promote(models_pb2.PromoteRequest(version_id="placement-v1", to_state="live",
                                                               who="x", why="y"), timeout=10),
                 grpc.StatusCode.INVALID_ARGUMENT, "'live' is not a state", id="unknown-state"),
    pytest.param(lambda s: s.Promote(models_pb2.PromoteRequest(version_id="placement-v1", to_state="shadow",
                                                               who="x", why=""), timeout=10),
                 grpc.StatusCode.INVALID_ARGUMENT, "why is required", id="no-reason"),
    pytest.param(lambda s: s.Promote(models_pb2.PromoteRequest(version_id="placement-v1", to_state="shadow",
                                                               who="x", why="y", evidence_json="[1]"), timeout=10),
                 grpc.StatusCode.INVALID_ARGUMENT, "JSON object", id="evidence-not-an-object"),
    pytest.param(lambda s: s.Rollback(models_pb2.RollbackRequest(model="placement", who="x", why="y"), timeout=10),
                 grpc.StatusCode.FAILED_PRECONDITION, "no active version", id="nothing-to-roll-back"),
])
def test_errors_have_status_codes(stub: models_pb2_grpc.ModelServiceStub, register: Callable[..., ModelVersion],
                                  call: Callable[[models_pb2_grpc.ModelServiceStub], object],
                                  code: grpc.StatusCode, words: str) -> None:
    register()
    with pytest.raises(grpc.RpcError) as caught:
        call(stub)
    assert caught.value.code() == code
    assert words in caught.value.details()


def test_unreachable_redis_is_unavailable(tmp_path: Path) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    client = redis.Redis.from_url(url, decode_responses=True, socket_connect_timeout=1)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_model_service(server, ModelRegistry(client, FilesystemArtifactStore(tmp_path), url=url))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel, pytest.raises(grpc.RpcError) as caught:
            models_pb2_grpc.ModelServiceStub(channel).ListVersions(models_pb2.ListVersionsRequest(), timeout=10)
    finally:
        server.stop(grace=None)
    assert caught.value.code() == grpc.StatusCode.UNAVAILABLE and "unreachable" in caught.value.details()
