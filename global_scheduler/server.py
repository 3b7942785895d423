"""The operators' gRPC API (``meridian.v1.GlobalScheduler``), with health and reflection.

Errors carry the right status code and say what was wrong: ``INVALID_ARGUMENT`` names the field in
the message (``spec.requests.cpu: …``), in a ``google.rpc.BadRequest`` detail and in the trailing
metadata key ``meridian-field``; ``NOT_FOUND`` (``ResourceInfo``), ``ALREADY_EXISTS`` (an idempotency key
reused with another spec; ``ResourceInfo`` and ``meridian-workload-id`` name the workload that holds it),
``RESOURCE_EXHAUSTED`` (no allowed cluster could ever fit it, or a replica larger than any node can be)
and ``UNAUTHENTICATED``. Regions are judged against the known ones, the configured regions
(``registry.regions``) and those clusters report from: allowed regions none of which is known, or a
latency SLO from an unknown origin region, are ``INVALID_ARGUMENT`` with reason ``UNKNOWN_REGION`` and
the list of known regions. Every error also
has an ``ErrorInfo`` reason (``errors.py``).

Authentication is a server interceptor: a call without ``authorization: Bearer <token>`` matching
a configured token is answered ``UNAUTHENTICATED`` by the interceptor itself and never reaches a
servicer. Health checks and reflection stay open so probes work without a secret.

One client cannot take the API down: requests over ``api.max_receive_message_bytes`` are refused by
the transport (``RESOURCE_EXHAUSTED``), every field has a bound (``validation.py``), streams are
limited so unary calls and health checks keep handler threads, bytes that are not a request message
are ``INVALID_ARGUMENT`` without a traceback (``interceptors.py``), and a ``ListWorkloads`` page ends
at ``api.max_page_bytes`` so it never passes a client's receive limit.
"""

from __future__ import annotations

import hmac
import logging
import sys
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from global_scheduler.errors import rich_status
from global_scheduler.interceptors import StreamLimiter, StreamLimitInterceptor, UndecodableRequestInterceptor
from global_scheduler.leadership import FencedError, Replica
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.settings import GlobalSchedulerSettings, unsafe_api_reason
from global_scheduler.store import IdempotencyConflictError
from global_scheduler.validation import (
    InvalidArgumentError,
    echo,
    validate_id,
    validate_list,
    validate_submit,
)
from meridian.bus import BusError, BusUnavailableError
from meridian.errors import check_listen
from meridian.model_registry.grpc_service import SERVICE_NAME as MODEL_SERVICE_NAME
from meridian.model_registry.grpc_service import add_model_service
from meridian.model_registry.registry import ModelRegistry, open_registry
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

log = logging.getLogger(__name__)

SERVICE_NAME = api.DESCRIPTOR.services_by_name["GlobalScheduler"].full_name
OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str, *, reason: str,
           field: str | None = None, workload_id: str | None = None) -> None:
    context.abort_with_status(rich_status(code, message, field=field, reason=reason, workload_id=workload_id))


class GlobalSchedulerServicer(api_grpc.GlobalSchedulerServicer):
    def __init__(self, engine: GlobalScheduler) -> None:
        self.engine = engine
        self.settings = engine.settings

    def SubmitWorkload(self, request: api.SubmitWorkloadRequest, context: grpc.ServicerContext) -> api.Workload:  # noqa: N802
        try:
            parsed = validate_submit(request, now_s=time.time())
        except InvalidArgumentError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), field=exc.field, reason="INVALID_FIELD")
        spec = request.spec
        known = set(self.engine.registry.known_regions())
        if known:  # nothing configured and nothing reported yet: nothing can be judged, accept and wait
            if spec.allowed_regions and not known.intersection(spec.allowed_regions):
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                       f"spec.allowed_regions: none of {', '.join(spec.allowed_regions)} is a known region "
                       f"(known regions: {', '.join(sorted(known))})",
                       field="spec.allowed_regions", reason="UNKNOWN_REGION")
            if spec.latency_slo_ms and spec.origin_region not in known:
                _abort(context, grpc.StatusCode.INVALID_ARGUMENT,
                       f"spec.origin_region: {spec.origin_region!r} is not a known region, so the latency SLO cannot be "
                       f"measured from it (known regions: {', '.join(sorted(known))})",
                       field="spec.origin_region", reason="UNKNOWN_REGION")
        fits = self.engine.registry.ever_fits(replicas=spec.replicas, milli_cpu=parsed.milli_cpu,
                                              memory_bytes=parsed.memory_bytes, gpu=parsed.gpu_fraction,
                                              allowed_regions=set(spec.allowed_regions) or None)
        if fits is False:
            where = f" in regions {', '.join(spec.allowed_regions)}" if spec.allowed_regions else ""
            _abort(context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                   f"no cluster{where} can ever fit {spec.replicas} replica(s) of this size, even empty",
                   field="spec.requests", reason="NO_CLUSTER_CAN_FIT")
        try:
            workload, created = self.engine.store.create(spec, parsed, request.idempotency_key)
        except FencedError as exc:  # high availability: this replica was deposed while the call ran
            _abort(context, grpc.StatusCode.UNAVAILABLE, f"this replica is no longer the leader ({exc}); nothing was "
                   "kept, retry", reason="NOT_LEADER")
        except (BusUnavailableError, BusError) as exc:
            _abort(context, grpc.StatusCode.UNAVAILABLE, f"workload store unavailable ({exc}); nothing was kept, "
                   "retry with the same idempotency_key", reason="STORE_UNAVAILABLE")
        except IdempotencyConflictError as exc:
            _abort(context, grpc.StatusCode.ALREADY_EXISTS, str(exc), field="idempotency_key",
                   reason="IDEMPOTENCY_KEY_REUSED", workload_id=exc.workload_id)
        if created:
            self.engine.enqueue(workload.id)
        return workload

    def _get_or_abort(self, wid: str, context: grpc.ServicerContext) -> api.Workload:
        try:
            validate_id(wid)
        except InvalidArgumentError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), field=exc.field, reason="INVALID_FIELD")
        w = self.engine.store.get(wid)
        if w is None:
            _abort(context, grpc.StatusCode.NOT_FOUND, f"workload {echo(wid)} not found", reason="WORKLOAD_NOT_FOUND",
                   workload_id=wid)
        return w

    def GetWorkload(self, request: api.GetWorkloadRequest, context: grpc.ServicerContext) -> api.Workload:  # noqa: N802
        return self._get_or_abort(request.id, context)

    def ListWorkloads(self, request: api.ListWorkloadsRequest, context: grpc.ServicerContext) -> api.ListWorkloadsResponse:  # noqa: N802
        api_cfg = self.settings.api
        try:
            query = validate_list(request, default_page_size=api_cfg.default_page_size,
                                  max_page_size=api_cfg.max_page_size)
        except InvalidArgumentError as exc:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, str(exc), field=exc.field, reason="INVALID_FIELD")
        items, nxt = self.engine.store.list(tenant=request.tenant, state=request.state, cluster=request.cluster,
                                            offset=query.offset, limit=query.limit, max_bytes=api_cfg.max_page_bytes)
        return api.ListWorkloadsResponse(workloads=items, next_page_token="" if nxt is None else str(nxt))

    def WatchWorkload(self, request: api.WatchWorkloadRequest, context: grpc.ServicerContext):  # noqa: N802
        self._get_or_abort(request.id, context)
        yield from self.engine.store.watch(request.id, is_active=context.is_active)

    def CancelWorkload(self, request: api.CancelWorkloadRequest, context: grpc.ServicerContext) -> api.Workload:  # noqa: N802
        self._get_or_abort(request.id, context)
        w = self.engine.cancel(request.id)
        if w is None:
            _abort(context, grpc.StatusCode.NOT_FOUND, f"workload {request.id!r} not found",
                   reason="WORKLOAD_NOT_FOUND", workload_id=request.id)
        if w.state == api.WORKLOAD_STATE_FAILED:
            _abort(context, grpc.StatusCode.FAILED_PRECONDITION, f"workload {request.id} already failed: {w.message}",
                   reason="WORKLOAD_FAILED", workload_id=request.id)
        return w

    def ListClusters(self, request: api.ListClustersRequest, context: grpc.ServicerContext) -> api.ListClustersResponse:  # noqa: N802
        return api.ListClustersResponse(clusters=self.engine.registry.cluster_messages())


def _deny(handler: grpc.RpcMethodHandler | None, message: str, reason: str) -> grpc.RpcMethodHandler:
    status = rich_status(grpc.StatusCode.UNAUTHENTICATED, message, reason=reason)

    def abort(request: object, context: grpc.ServicerContext) -> None:
        context.abort_with_status(status)

    def abort_stream(request: object, context: grpc.ServicerContext):
        context.abort_with_status(status)
        yield  # pragma: no cover

    kw = {}
    if handler is not None:
        kw = {"request_deserializer": handler.request_deserializer, "response_serializer": handler.response_serializer}
    if handler is not None and handler.response_streaming and not handler.request_streaming:
        return grpc.unary_stream_rpc_method_handler(abort_stream, **kw)
    return grpc.unary_unary_rpc_method_handler(abort, **kw)


class BearerTokenInterceptor(grpc.ServerInterceptor):
    """Rejects calls without a valid ``authorization: Bearer <token>`` before any servicer runs."""

    def __init__(self, tokens: Sequence[str]) -> None:
        self._tokens = [t.encode() for t in tokens if t]
        self.rejected = 0

    def intercept_service(self, continuation: Callable, handler_call_details: grpc.HandlerCallDetails):
        method = handler_call_details.method or ""
        if method.startswith(OPEN_PREFIXES):
            return continuation(handler_call_details)
        header = ""
        for key, value in handler_call_details.invocation_metadata or ():
            if key == "authorization":
                header = value if isinstance(value, str) else value.decode()
                break
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            self.rejected += 1
            return _deny(continuation(handler_call_details), "missing bearer token (authorization: Bearer <token>)",
                         "MISSING_TOKEN")
        if not any(hmac.compare_digest(token.encode(), t) for t in self._tokens):
            self.rejected += 1
            return _deny(continuation(handler_call_details), "invalid bearer token", "INVALID_TOKEN")
        return continuation(handler_call_details)


ServiceHook = Callable[[grpc.Server], str]
"""Registers an extra service on the server (e.g. the energy reports) and returns its full name."""


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    engine: GlobalScheduler
    health: health.HealthServicer
    interceptor: BearerTokenInterceptor | None
    streams: StreamLimiter | None = None
    undecodable: UndecodableRequestInterceptor | None = None
    health_server: grpc.Server | None = None
    health_port: int | None = None  # the health-only server's port (api.health_listen), if any
    replica: Replica | None = None  # high availability (ha.enabled): elects, and swaps engines per term
    model_registry: ModelRegistry | None = None  # behind ModelService (models.serve with a Redis bus)

    def stop(self, grace_s: float = 1.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait(grace_s + 1)
        if self.health_server is not None:
            self.health_server.stop(0).wait(1)
        if self.model_registry is not None:
            self.model_registry.close()
        if self.replica is not None:
            self.replica.close()  # stops routing, then hands the lock over
        else:
            self.engine.stop()


class UnsafeSettingsError(ValueError):
    """The API settings would expose it without protection; the message says what to set."""


def build_server(engine: GlobalScheduler | None, settings: GlobalSchedulerSettings | None = None, *,
                 extra_services: Sequence[ServiceHook] = (), replica: Replica | None = None) -> RunningServer:
    """Create, bind and start the server (and the engine's workers). ``listen`` port 0 picks a free one.

    With ``replica`` (high availability, global_scheduler/leadership.py) ``engine`` is ignored: the replica's
    elector starts, the engine runs only while this replica leads, and calls are forwarded to the leader
    otherwise (global_scheduler/leader_forwarding.py)."""
    if replica is not None:
        engine = replica.engine
    assert engine is not None
    settings = settings or engine.settings
    reason = unsafe_api_reason(settings.api)
    if reason is not None:
        raise UnsafeSettingsError(reason)
    if settings.api.insecure and not settings.api.auth_tokens:
        log.warning("serving the API without authentication on %s (--insecure)", settings.api.listen)
    if settings.api.gil_switch_interval_ms is not None:
        sys.setswitchinterval(settings.api.gil_switch_interval_ms / 1000.0)
    interceptor = BearerTokenInterceptor(settings.api.auth_tokens) if settings.api.auth_tokens else None
    streams = StreamLimiter(total=settings.api.watch_limit, per_client=settings.api.max_watches_per_token)
    undecodable = UndecodableRequestInterceptor()
    # Outermost first: an unauthenticated call is refused before it takes a stream slot.
    interceptors: list[grpc.ServerInterceptor] = [*([interceptor] if interceptor else []),
                                                  StreamLimitInterceptor(streams, by_token=interceptor is not None),
                                                  undecodable]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=settings.api.max_workers),
                         interceptors=interceptors,
                         options=[("grpc.so_reuseport", 0),
                                  ("grpc.max_receive_message_length", settings.api.max_receive_message_bytes)])
    if replica is not None:
        from global_scheduler.leader_forwarding import register

        register(server, replica)
    else:
        api_grpc.add_GlobalSchedulerServicer_to_server(GlobalSchedulerServicer(engine), server)
    names = [SERVICE_NAME]
    model_registry = model_registry_for(settings)
    if model_registry is not None:
        add_model_service(server, model_registry)
        names.append(MODEL_SERVICE_NAME)
    for hook in extra_services:
        names.append(hook(server))
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    for name in ["", *names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    reflection.enable_server_reflection([*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    api_cfg = settings.api
    # gRPC's own refusal is "Failed to bind" and a C-level log line; a socket of our own says why first.
    check_listen(api_cfg.listen, what="the global API", setting="--listen or MERIDIAN_GLOBAL_API__LISTEN")
    if api_cfg.tls_cert_file and api_cfg.tls_key_file:
        creds = grpc.ssl_server_credentials([(api_cfg.tls_key_file.read_bytes(), api_cfg.tls_cert_file.read_bytes())])
        port = server.add_secure_port(api_cfg.listen, creds)
    else:
        port = server.add_insecure_port(api_cfg.listen)
    if port == 0:
        raise RuntimeError(f"could not bind the gRPC API to {api_cfg.listen}")
    health_server, health_port = (_health_only_server(api_cfg.health_listen, health_servicer)
                                  if api_cfg.health_listen else (None, None))
    if replica is not None:
        if api_cfg.tls_cert_file and api_cfg.tls_key_file:  # followers forward to the leader over TLS too
            ca = settings.ha.forward_ca_file or api_cfg.tls_cert_file
            replica.forward_credentials = grpc.ssl_channel_credentials(root_certificates=ca.read_bytes())
            replica.forward_server_name = settings.ha.forward_server_name
        host = api_cfg.listen.rpartition(":")[0]
        replica.start(advertise=None if host.strip("[]") in ("", "0.0.0.0", "::") else f"{host}:{port}")
    else:
        engine.start()
    server.start()
    if health_server is not None:
        health_server.start()
    log.info("global scheduler API on port %d (%s, auth %s)%s", port, "TLS" if api_cfg.tls_cert_file else "plaintext",
             "on" if interceptor else "off", f"; health also on port {health_port}" if health_port else "")
    return RunningServer(server, port, engine, health_servicer, interceptor, streams, undecodable,
                         health_server, health_port, replica, model_registry)


def model_registry_for(settings: GlobalSchedulerSettings) -> ModelRegistry | None:
    """The model registry ModelService serves: on the bus's Redis under its key prefix (where `meridian models`
    and the tiers find it), or None when ``models.serve`` is off or the bus is in-process (no Redis to hold it).
    Nothing connects here: a Redis that is down makes each call UNAVAILABLE, never the API's start."""
    if not settings.models.serve or settings.bus.url.startswith("memory:"):
        return None
    if settings.bus.url.split("://", 1)[0].endswith("+cluster"):
        # Each model's keys share a slot, but the registry's client is one Redis (docs/redis-cluster.md).
        log.warning("ModelService not served: the model registry needs one Redis, and the bus is a Redis Cluster")
        return None
    return open_registry(settings.bus.url, artifacts_dir=settings.models.artifacts,
                         key_prefix=settings.bus.key_prefix)


def _health_only_server(listen: str, servicer: health.HealthServicer) -> tuple[grpc.Server, int]:
    """The same health servicer (so graceful shutdown shows on both) on a server of its own: two threads
    no API call can take, and requests capped at 4 KiB (a health Check is a few bytes)."""
    check_listen(listen, what="the health server", setting="MERIDIAN_GLOBAL_API__HEALTH_LISTEN")
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"),
                         options=[("grpc.so_reuseport", 0), ("grpc.max_receive_message_length", 4096)])
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port(listen)
    if port == 0:
        raise RuntimeError(f"could not bind the health server to {listen}")
    return server, port
