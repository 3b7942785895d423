"""``ModelService`` (``protos/models.proto``): the model registry over gRPC for operators.

:func:`add_model_service` adds the servicer to a server the caller owns (the global scheduler's API server,
or any other), before ``server.start()``; authentication and TLS are that server's. Registry errors map to
status codes: an unknown model or a malformed request is ``INVALID_ARGUMENT``, an unknown version
``NOT_FOUND``, a transition the table forbids or nothing to roll back to ``FAILED_PRECONDITION``, Redis
unreachable ``UNAVAILABLE``; the details are the registry's one-line message.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import grpc

from meridian.model_registry.registry import (
    ModelRegistry,
    NothingToRollBackError,
    RegistryUnavailableError,
    TransitionResult,
)
from meridian.model_registry.versions import (
    ForbiddenTransitionError,
    ModelRegistryError,
    ModelState,
    UnknownModelError,
    UnknownVersionError,
)
from meridian.model_registry.wire import transition_to_proto, version_to_proto
from protos import models_pb2, models_pb2_grpc

SERVICE_NAME = models_pb2.DESCRIPTOR.services_by_name["ModelService"].full_name

_STATUS: list[tuple[type[Exception], grpc.StatusCode]] = [
    (UnknownModelError, grpc.StatusCode.INVALID_ARGUMENT),
    (UnknownVersionError, grpc.StatusCode.NOT_FOUND),
    (ForbiddenTransitionError, grpc.StatusCode.FAILED_PRECONDITION),
    (NothingToRollBackError, grpc.StatusCode.FAILED_PRECONDITION),
    (RegistryUnavailableError, grpc.StatusCode.UNAVAILABLE),
]


def status_for(exc: ModelRegistryError) -> grpc.StatusCode:
    return next((code for kind, code in _STATUS if isinstance(exc, kind)), grpc.StatusCode.FAILED_PRECONDITION)


@contextmanager
def _as_status(context: grpc.ServicerContext) -> Iterator[None]:
    try:
        yield
    except ModelRegistryError as exc:
        _abort(context, status_for(exc), str(exc))


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, details: str) -> NoReturn:
    context.abort(code, details)
    raise AssertionError("context.abort returns only by raising")  # pragma: no cover


def _evidence(text: str, context: grpc.ServicerContext) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"evidence_json is not valid JSON: {exc}")
    if not isinstance(value, dict):
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, "evidence_json must be a JSON object")
    return value


def _required(value: str, name: str, context: grpc.ServicerContext) -> str:
    if not value.strip():
        _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"{name} is required")
    return value


class ModelServiceServicer(models_pb2_grpc.ModelServiceServicer):
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def ListVersions(self, request: models_pb2.ListVersionsRequest,  # noqa: N802 (gRPC method name)
                     context: grpc.ServicerContext) -> models_pb2.ListVersionsResponse:
        with _as_status(context):
            versions = self.registry.versions(request.model or None)
        return models_pb2.ListVersionsResponse(versions=[version_to_proto(v) for v in versions])

    def GetVersion(self, request: models_pb2.GetVersionRequest,  # noqa: N802 (gRPC method name)
                   context: grpc.ServicerContext) -> models_pb2.ModelVersion:
        with _as_status(context):
            version = self.registry.get(_required(request.version_id, "version_id", context))
        return version_to_proto(version)

    def Promote(self, request: models_pb2.PromoteRequest,  # noqa: N802 (gRPC method name)
                context: grpc.ServicerContext) -> models_pb2.PromoteResponse:
        if request.to_state not in {s.value for s in ModelState}:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                   f"to_state {request.to_state!r} is not a state ({', '.join(s.value for s in ModelState)})")
        evidence = _evidence(request.evidence_json, context)
        with _as_status(context):
            result = self.registry.promote(_required(request.version_id, "version_id", context), request.to_state,
                                           who=_required(request.who, "who", context),
                                           why=_required(request.why, "why", context), evidence=evidence)
        return models_pb2.PromoteResponse(version=version_to_proto(result.version),
                                          transitions=_transitions(result))

    def Rollback(self, request: models_pb2.RollbackRequest,  # noqa: N802 (gRPC method name)
                 context: grpc.ServicerContext) -> models_pb2.RollbackResponse:
        evidence = _evidence(request.evidence_json, context)
        with _as_status(context):
            result = self.registry.rollback(_required(request.model, "model", context),
                                            who=_required(request.who, "who", context),
                                            why=_required(request.why, "why", context), evidence=evidence)
        retired = version_to_proto(result.retired) if result.retired else None
        return models_pb2.RollbackResponse(active=version_to_proto(result.version), retired=retired,
                                           transitions=_transitions(result))


def _transitions(result: TransitionResult) -> list[models_pb2.ModelTransition]:
    return [transition_to_proto(r) for r in result.transitions]


def add_model_service(server: grpc.Server, registry: ModelRegistry) -> ModelServiceServicer:
    """Register ``ModelService`` on ``server`` (call before ``server.start()``); returns the servicer.

    The caller adds :data:`SERVICE_NAME` to its reflection and health service names."""
    servicer = ModelServiceServicer(registry)
    models_pb2_grpc.add_ModelServiceServicer_to_server(servicer, server)
    return servicer


#: For callers that build a client: ``ModelServiceStub(channel)``.
ModelServiceStub: Callable[[grpc.Channel], Any] = models_pb2_grpc.ModelServiceStub
