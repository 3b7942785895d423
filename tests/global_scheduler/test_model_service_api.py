"""Operators reach the model registry over the global API: ``ModelService`` on the global scheduler's own gRPC
port (real server on loopback, real Redis under the test's key prefix), behind the API's tokens, and off when
``models.serve`` is off."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import RunningServer, build_server
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus import open_bus
from meridian.model_registry.artifacts import FilesystemArtifactStore
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import MODEL_NAMES, DataWindow
from protos import models_pb2, models_pb2_grpc

TOKEN = "models-t0ken"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
LAYOUT = {"layout": "test"}


class AnyJsonValidator:
    """Stand-in for the tiers' validators (tested beside each tier): any JSON file, its layout recorded."""

    def validate(self, path: Path) -> dict[str, Any]:
        json.loads(Path(path).read_text())
        return LAYOUT


@pytest.fixture
def registry(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[ModelRegistry]:
    """The operator's side: `meridian models register` writes here, under the global scheduler's key prefix."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    yield ModelRegistry(client, FilesystemArtifactStore(tmp_path / "artifacts"), key_prefix=key_prefix,
                        validators=dict.fromkeys(MODEL_NAMES, AnyJsonValidator()), url=redis_url)
    client.close()


@pytest.fixture
def global_api(redis_url: str, key_prefix: str, tmp_path: Path) -> Iterator[Callable[..., tuple[RunningServer,
                                                                                                    grpc.Channel]]]:
    running: list[tuple[RunningServer, grpc.Channel]] = []

    def make(**models: object) -> tuple[RunningServer, grpc.Channel]:
        settings = GlobalSchedulerSettings(
            api={"listen": "127.0.0.1:0", "auth_tokens": [TOKEN], "max_workers": 8},
            bus={"url": redis_url, "key_prefix": key_prefix, "block_ms": 50},
            routing={"policy": "karmada", "worker_process": False},
            models={"artifacts": tmp_path / "artifacts", **models})
        server = build_server(GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix)))
        channel = grpc.insecure_channel(f"127.0.0.1:{server.port}")
        running.append((server, channel))
        return server, channel

    yield make
    for server, channel in running:
        channel.close()
        server.stop(0.1)


def _register(registry: ModelRegistry, model: str, tmp_path: Path) -> str:
    checkpoint = tmp_path / f"{model}-{uuid.uuid4().hex[:8]}.json"
    checkpoint.write_text(json.dumps({"weights": uuid.uuid4().hex}))
    window = DataWindow(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 8, tzinfo=UTC),
                        digest="cd" * 32)
    version = registry.register(model, checkpoint, data_window=window, train_command=f"meridian train {model}",
                                metrics={}, who="alice", why="nightly")
    return version.version_id


def test_list_versions_over_the_global_api_port(global_api: Callable[..., tuple[RunningServer, grpc.Channel]],
                                                registry: ModelRegistry, tmp_path: Path) -> None:
    first, second = (_register(registry, "placement", tmp_path) for _ in range(2))
    routing = _register(registry, "routing", tmp_path)
    server, channel = global_api()
    assert server.model_registry is not None
    stub = models_pb2_grpc.ModelServiceStub(channel)

    listed = stub.ListVersions(models_pb2.ListVersionsRequest(model="placement"), metadata=AUTH, timeout=10)
    assert [v.version_id for v in listed.versions] == [first, second]
    everything = stub.ListVersions(models_pb2.ListVersionsRequest(), metadata=AUTH, timeout=10)
    assert {v.version_id for v in everything.versions} == {first, second, routing}
    # A change made over the API is the registry's: audited with who and why.
    stub.Promote(models_pb2.PromoteRequest(version_id=first, to_state="shadow", who="dana", why="try it"),
                 metadata=AUTH, timeout=10)
    assert registry.get(first).state.value == "shadow"
    assert registry.audit("placement")[-1].who == "dana"


def test_the_model_service_is_behind_the_api_tokens_and_announced(
        global_api: Callable[..., tuple[RunningServer, grpc.Channel]]) -> None:
    _, channel = global_api()
    stub = models_pb2_grpc.ModelServiceStub(channel)
    with pytest.raises(grpc.RpcError) as refused:
        stub.ListVersions(models_pb2.ListVersionsRequest(), timeout=10)
    assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(grpc.RpcError) as unknown:
        stub.ListVersions(models_pb2.ListVersionsRequest(model="nope"), metadata=AUTH, timeout=10)
    assert unknown.value.code() is grpc.StatusCode.INVALID_ARGUMENT and "unknown model" in unknown.value.details()
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(service="meridian.v1.ModelService"), timeout=10).status == \
        health_pb2.HealthCheckResponse.SERVING
    refl = reflection_pb2_grpc.ServerReflectionStub(channel)
    reply = next(iter(refl.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))))
    assert "meridian.v1.ModelService" in {s.name for s in reply.list_services_response.service}


def test_not_served_when_turned_off(global_api: Callable[..., tuple[RunningServer, grpc.Channel]]) -> None:
    server, channel = global_api(serve=False)
    assert server.model_registry is None
    with pytest.raises(grpc.RpcError) as missing:
        models_pb2_grpc.ModelServiceStub(channel).ListVersions(models_pb2.ListVersionsRequest(), metadata=AUTH,
                                                               timeout=10)
    assert missing.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_not_served_on_an_in_process_bus() -> None:
    from global_scheduler.server import model_registry_for

    assert model_registry_for(GlobalSchedulerSettings(bus={"url": "memory://"})) is None
