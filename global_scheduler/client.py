"""A small client of the global API for the CLI and the benchmarks.

Workload files (``meridian submit FILE``) are read and checked by :mod:`global_scheduler.workload_file`.

Connection failures fail fast and say why where the client can tell: a connection attempt gives up
after ``connect_timeout_s`` (gRPC's own default is 20 s), and an ``UNAVAILABLE`` on a plaintext
channel to a server that answers a TLS handshake becomes "it probably serves TLS; pass --ca FILE"
(:class:`UnreachableError`, still a ``grpc.RpcError``). :meth:`GlobalClient.follow` is the watch the
CLI uses: it reconnects with back-off when the stream breaks before a terminal state.
:meth:`GlobalClient.resolve` finds a workload by a unique ID prefix or its name (over ListWorkloads,
as the server looks up whole IDs only); :meth:`GlobalClient.find_active_by_name` lists a tenant's
unfinished workloads of one name.
"""

from __future__ import annotations

import os
import socket
import ssl
import time
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

DEFAULT_TARGET = "127.0.0.1:50051"
Reply = TypeVar("Reply")
TERMINAL_STATES = frozenset({api.WORKLOAD_STATE_FAILED, api.WORKLOAD_STATE_CANCELLED,
                             api.WORKLOAD_STATE_SUCCEEDED})
# The steps a workload goes through before it ends; a reroute takes it back to PENDING.
PROGRESS_STATES = (api.WORKLOAD_STATE_PENDING, api.WORKLOAD_STATE_DISPATCHED, api.WORKLOAD_STATE_SCHEDULED,
                   api.WORKLOAD_STATE_RUNNING)
# A watch that breaks is opened again after these delays (the last repeats); a changed state resets them.
RECONNECT_DELAYS_S = (0.2, 0.5, 1.0, 2.0, 5.0)
# What a server restart or a cut connection looks like to a stream; other codes are the server's answer.
RECONNECT_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.ABORTED})


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


class AmbiguousWorkloadError(LookupError):
    """A workload reference (ID prefix or name) that several workloads match; ``candidates`` are they."""

    def __init__(self, ref: str, candidates: list[api.Workload], *, tenant: str = "") -> None:
        tenants = {w.spec.tenant for w in candidates}
        hint = ("give more of the ID" if all(w.id.startswith(ref) for w in candidates) else
                "give the ID, or --tenant" if len(tenants) > 1 and not tenant else "give the ID")
        super().__init__(f"{ref!r} matches {len(candidates)} workloads; {hint}")
        self.ref = ref
        self.candidates = candidates


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
            return UnreachableError(f"nothing answers at {self.target}: start the global scheduler there "
                                    "(meridian global-scheduler), or point --api or $MERIDIAN_API at a running one",
                                    exc)
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

    def resolve(self, ref: str, *, tenant: str = "") -> api.Workload:
        """The workload ``ref`` names: its ID, a unique prefix of its ID, or its name (within ``tenant``
        when given). A name carried by several workloads means the one not yet ended, if only one is.
        A prefix of several IDs, or a name still ambiguous, raises :class:`AmbiguousWorkloadError`
        listing them; nothing matching re-raises the server's ``NOT_FOUND`` for ``ref``.

        The server looks up IDs only, so prefixes and names are matched here over ListWorkloads: one
        GetWorkload for a full ID, every page of the tenant's workloads otherwise."""
        try:
            return self.get(ref)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:  # type: ignore[attr-defined]
                raise
            not_found = exc
        by_id: list[api.Workload] = []
        by_name: list[api.Workload] = []
        for w in self.list(tenant=tenant, page_size=1000):
            if w.id.startswith(ref):
                by_id.append(w)
            elif w.spec.name == ref:
                by_name.append(w)
        if not by_id and not by_name:
            raise not_found
        if len(by_id) == 1 and not by_name:
            return by_id[0]
        if not by_id:
            active = [w for w in by_name if w.state not in TERMINAL_STATES]
            if len(by_name) == 1 or len(active) == 1:
                return (active or by_name)[0]
        raise AmbiguousWorkloadError(ref, by_id + by_name, tenant=tenant)

    def find_active_by_name(self, name: str, tenant: str, *, exclude_id: str = "") -> list[api.Workload]:
        """The tenant's workloads named ``name`` that have not ended (not Failed or Cancelled), but for
        ``exclude_id``: what ``submit`` warns about, since names are how operators tell workloads apart."""
        return [w for w in self.list(tenant=tenant, page_size=1000)
                if w.spec.name == name and w.state not in TERMINAL_STATES and w.id != exclude_id]

    def clusters(self) -> list[api.Cluster]:
        return list(self._unary(self.stub.ListClusters, api.ListClustersRequest()).clusters)


def state_name(state: int) -> str:
    return api.WorkloadState.Name(state).removeprefix("WORKLOAD_STATE_")


def parse_state(name: str) -> int:
    """A WorkloadState from its short name, any case (``running``); ValueError naming the known ones."""
    known = {state_name(s).lower(): s for s in (*PROGRESS_STATES, *sorted(TERMINAL_STATES))}
    try:
        return known[name.lower().removeprefix("workload_state_")]
    except KeyError:
        raise ValueError(f"unknown state {name!r}: use one of {', '.join(known)}") from None


def state_reached(state: int, goal: int | None) -> bool:
    """Whether a watch waiting for ``goal`` is done at ``state``: ``goal`` itself or, for a step of
    :data:`PROGRESS_STATES`, a later step (a watch that opens on RUNNING has seen SCHEDULED pass);
    ``goal`` None waits for any end (Failed or Cancelled)."""
    if goal is None:
        return state in TERMINAL_STATES
    if state == goal:
        return True
    return (goal in PROGRESS_STATES and state in PROGRESS_STATES
            and PROGRESS_STATES.index(state) > PROGRESS_STATES.index(goal))
