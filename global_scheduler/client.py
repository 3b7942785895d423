"""A small client of the global API for the CLI and the benchmarks.

Workload files are YAML (or JSON) with the ``WorkloadSpec`` fields; quantities stay strings and are
parsed by the server::

    name: train-recsys
    tenant: ads
    replicas: 4
    requests: {cpu: "8", memory: 32Gi, gpu: "1"}
    allowedRegions: [eu-north, eu-west]   # or allowed_regions
    originRegion: eu-west
    latencySloMs: 80
    deferrable: true
    deadline: "2026-12-01T06:00:00Z"       # or deadline_unix_s
    weights: {performance: 0.2, energy: 0.8}
    idempotencyKey: train-recsys-2026-11-30 # optional

Connection failures fail fast and say why where the client can tell: a connection attempt gives up
after ``connect_timeout_s`` (gRPC's own default is 20 s), and an ``UNAVAILABLE`` on a plaintext
channel to a server that answers a TLS handshake becomes "it probably serves TLS; pass --ca FILE"
(:class:`UnreachableError`, still a ``grpc.RpcError``). :meth:`GlobalClient.follow` is the watch the
CLI uses: it reconnects with back-off when the stream breaks before a terminal state.
"""

from __future__ import annotations

import os
import re
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import grpc
import yaml

from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
Reply = TypeVar("Reply")
TERMINAL_STATES = frozenset({api.WORKLOAD_STATE_FAILED, api.WORKLOAD_STATE_CANCELLED})
# A watch that breaks is opened again after these delays (the last repeats); a changed state resets them.
RECONNECT_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)
# What a server restart or a cut connection looks like to a stream; other codes are the server's answer.
RECONNECT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED})


def _snake(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", key).lower()


class WorkloadFileError(ValueError):
    pass


def spec_from_mapping(doc: dict[str, Any]) -> tuple[api.WorkloadSpec, str]:
    """(spec, idempotency key) from a parsed workload file; unknown keys are an error naming them."""
    if not isinstance(doc, dict):
        raise WorkloadFileError("a workload file is a mapping of WorkloadSpec fields")
    doc = {_snake(k): v for k, v in doc.items()}
    key = str(doc.pop("idempotency_key", "") or "")
    if "deadline" in doc:
        value = doc.pop("deadline")
        try:
            doc["deadline_unix_s"] = (value if isinstance(value, datetime) else
                                      datetime.fromisoformat(str(value).replace("Z", "+00:00"))).timestamp()
        except ValueError:
            raise WorkloadFileError(f"deadline: not an ISO date-time: {value!r}") from None
    if "class" in doc:
        doc["workload_class"] = doc.pop("class")
    spec = api.WorkloadSpec()
    fields = {f.name for f in api.WorkloadSpec.DESCRIPTOR.fields}
    for name, value in doc.items():
        if name not in fields:
            raise WorkloadFileError(f"unknown field {name!r}; known: {', '.join(sorted(fields))}")
        if name == "requests":
            if not isinstance(value, dict):
                raise WorkloadFileError("requests: a mapping of cpu, memory, gpu, gpu_milli")
            for rk, rv in value.items():
                rk = _snake(rk)
                if rk not in ("cpu", "memory", "gpu", "gpu_milli"):
                    raise WorkloadFileError(f"requests.{rk}: unknown resource")
                setattr(spec.requests, rk, str(rv))
        elif name == "weights":
            for wk, wv in (value or {}).items():
                setattr(spec.weights, _snake(wk), float(wv))
        elif name == "allowed_regions":
            spec.allowed_regions.extend(str(v) for v in value)
        else:
            try:
                setattr(spec, name, value)
            except (TypeError, ValueError) as exc:
                raise WorkloadFileError(f"{name}: {exc}") from None
    return spec, key


def load_workload_file(path: Path) -> tuple[api.WorkloadSpec, str]:
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise WorkloadFileError(f"{path}: not YAML: {exc}") from None
    return spec_from_mapping(doc)


def _host_port(target: str) -> tuple[str, int] | None:
    """(host, port) of a ``host:port``, ``[v6]:port`` or ``dns:///host:port`` target; None for others."""
    target = target.removeprefix("dns:///")
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or "/" in host:
        return None
    return host.strip("[]") or "127.0.0.1", int(port)


def speaks_tls(target: str, timeout_s: float = 2.0) -> bool | None:
    """Whether the server at ``target`` completes a TLS handshake (certificate not checked: only the
    protocol is asked); None when nothing answers there."""
    where = _host_port(target)
    if where is None:
        return None
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    context.set_alpn_protocols(["h2"])
    try:
        with socket.create_connection(where, timeout=timeout_s) as sock:
            try:
                with context.wrap_socket(sock, server_hostname=where[0]):
                    return True
            except (ssl.SSLError, OSError):
                return False
    except OSError:
        return None


class UnreachableError(grpc.RpcError):
    """``UNAVAILABLE`` with the likely cause named; a ``grpc.RpcError`` so callers need no new except."""

    def __init__(self, message: str, cause: grpc.RpcError) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return self.message

    def trailing_metadata(self) -> tuple:
        return ()

    def debug_error_string(self) -> str:
        return self.cause.debug_error_string()  # type: ignore[attr-defined]


_CONNECTION_FAILURES = ("failed to connect", "socket closed", "connection reset", "handshake",
                        "timed out before receiving settings")


class GlobalClient:
    def __init__(self, target: str | None = None, *, token: str | None = None, root_certificates: bytes | None = None,
                 timeout_s: float = 10.0, connect_timeout_s: float = 3.0) -> None:
        self.target = target or os.environ.get("MERIDIAN_API", DEFAULT_TARGET)
        token = token if token is not None else os.environ.get("MERIDIAN_TOKEN")
        # A connection attempt (TCP, TLS, HTTP/2 settings) gives up after connect_timeout_s (gRPC's
        # min_reconnect_backoff_ms is its connect timeout), and a channel that lost its server tries
        # again at least every 5 s (default: up to 120 s), so a watch resumes soon after a restart.
        options = [("grpc.min_reconnect_backoff_ms", int(connect_timeout_s * 1000)),
                   ("grpc.initial_reconnect_backoff_ms", 200), ("grpc.max_reconnect_backoff_ms", 5000)]
        self.tls = root_certificates is not None
        if root_certificates is not None:
            self.channel = grpc.secure_channel(self.target, grpc.ssl_channel_credentials(root_certificates), options)
        else:
            self.channel = grpc.insecure_channel(self.target, options)
        self.stub = api_grpc.GlobalSchedulerStub(self.channel)
        self.metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s

    def explain(self, exc: grpc.RpcError) -> grpc.RpcError:
        """``exc``, or an :class:`UnreachableError` naming the likely cause of a failed connection."""
        if exc.code() != grpc.StatusCode.UNAVAILABLE:  # type: ignore[attr-defined]
            return exc
        details = (exc.details() or "").lower()  # type: ignore[attr-defined]
        if not any(marker in details for marker in _CONNECTION_FAILURES):
            return exc
        tls = speaks_tls(self.target, timeout_s=self.connect_timeout_s)
        if tls and not self.tls:
            return UnreachableError(f"the server at {self.target} closed the connection: it probably serves TLS; "
                                    "pass --ca FILE (the CA that signed its certificate)", exc)
        if tls is False and self.tls:
            return UnreachableError(f"the TLS handshake with {self.target} failed and it does not answer TLS: it "
                                    "probably serves plaintext; drop --ca", exc)
        if tls is None:
            return UnreachableError(f"nothing answers at {self.target}: is the global scheduler running there "
                                    "(--api, $MERIDIAN_API)?", exc)
        return exc

    def _unary(self, method: Callable[..., Reply], request: object) -> Reply:
        try:
            return method(request, metadata=self.metadata, timeout=self.timeout_s)
        except grpc.RpcError as exc:
            raise self.explain(exc) from None

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> GlobalClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def submit(self, spec: api.WorkloadSpec, idempotency_key: str = "") -> api.Workload:
        return self._unary(self.stub.SubmitWorkload, api.SubmitWorkloadRequest(spec=spec,
                                                                                idempotency_key=idempotency_key))

    def get(self, wid: str) -> api.Workload:
        return self._unary(self.stub.GetWorkload, api.GetWorkloadRequest(id=wid))

    def list(self, *, tenant: str = "", state: int = 0, cluster: str = "", page_size: int = 0) -> Iterator[api.Workload]:
        """Every matching workload, page after page (a page ends at its count or at the server's byte budget)."""
        token = ""
        while True:
            page = self._unary(self.stub.ListWorkloads, api.ListWorkloadsRequest(
                tenant=tenant, state=state, cluster=cluster, page_size=page_size, page_token=token))
            yield from page.workloads
            if not page.next_page_token:
                return
            token = page.next_page_token

    def watch(self, wid: str, timeout_s: float | None = None) -> Iterator[api.Workload]:
        """One WatchWorkload stream, as the server sends it (see :meth:`follow` for one that reconnects)."""
        return self.stub.WatchWorkload(api.WatchWorkloadRequest(id=wid), metadata=self.metadata, timeout=timeout_s)

    def follow(self, wid: str, *, deadline_s: float | None = None,
               on_reconnect: Callable[[str, float], None] | None = None,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[api.Workload]:
        """The workload's states until it is terminal or ``deadline_s`` has passed. A stream that breaks
        (``UNAVAILABLE``, ``CANCELLED`` or ``ABORTED``: a restart, a cut connection) or ends before a
        terminal state is opened again after ``RECONNECT_DELAYS_S``, with ``on_reconnect(why, delay_s)``
        told first. Each stream starts with the current state: a snapshot equal to the last one yielded is
        skipped, so a reconnect repeats nothing unless the workload changed. The first stream's errors are
        raised (with :meth:`explain`), as are any other code's."""
        end = None if deadline_s is None else time.monotonic() + deadline_s
        last: bytes | None = None
        failures = 0
        while True:
            remaining = None if end is None else end - time.monotonic()
            if remaining is not None and remaining <= 0:
                return
            try:
                for w in self.watch(wid, timeout_s=remaining):
                    snapshot = w.SerializeToString(deterministic=True)
                    if snapshot != last:  # news: the back-off starts again
                        last, failures = snapshot, 0
                        yield w
                    if w.state in TERMINAL_STATES:
                        return
                why = "the stream ended before a terminal state"
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    return
                if last is None or code not in RECONNECT_CODES:
                    raise self.explain(exc) from None
                why = f"{code.name}: {exc.details()}"  # type: ignore[attr-defined]
            delay = RECONNECT_DELAYS_S[min(failures, len(RECONNECT_DELAYS_S) - 1)]
            failures += 1
            if end is not None:
                delay = max(0.0, min(delay, end - time.monotonic()))
            if on_reconnect is not None:
                on_reconnect(why, delay)
            sleep(delay)

    def cancel(self, wid: str) -> api.Workload:
        return self._unary(self.stub.CancelWorkload, api.CancelWorkloadRequest(id=wid))

    def clusters(self) -> list[api.Cluster]:
        return list(self._unary(self.stub.ListClusters, api.ListClustersRequest()).clusters)


def state_name(state: int) -> str:
    return api.WorkloadState.Name(state).removeprefix("WORKLOAD_STATE_")
