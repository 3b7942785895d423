"""The API of a replica in high availability: served locally while it leads, forwarded to the leader otherwise.

Every replica serves ``meridian.v1.GlobalScheduler``. The leader answers from its engine (the same
``GlobalSchedulerServicer`` as a single replica). A follower forwards each call to the leader's address,
which the leader keeps next to the lock (``ha.advertise``; :mod:`global_scheduler.leadership`), with the
caller's metadata (its bearer token: the leader authenticates the call again) and the caller's deadline;
the leader's answer, or its error with the same code, message and rich details (trailing metadata), goes
back unchanged. Forwarding everything, reads included, is the simplest consistent design: a follower
holds no copy of the store that could lag behind the leader's, so a Get right after a Submit through
either replica sees the workload.

While there is no leader (an election after a leader died: up to the lease duration plus a retry
period, plus the new leader's restore) a follower waits for one, up to ``ha.forward_timeout_s`` within
the caller's deadline, then answers ``UNAVAILABLE`` (reason ``NO_LEADER``). A call is sent again to the
(new) leader only when that cannot apply it twice: reads, cancels and submissions with an
``idempotency_key`` are retried on ``UNAVAILABLE``; a submission without a key is retried only when the
leader could not have received it (the connection was refused, or the replica answered ``NOT_LEADER``),
otherwise the caller gets ``UNAVAILABLE`` and decides (with a key, a retry is always safe). A call
forwarded once is never forwarded again (``x-meridian-forwarded``): a replica that is not the leader
answers it ``UNAVAILABLE`` / ``NOT_LEADER`` and the forwarding replica tries the leader the lock names now.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import grpc

from global_scheduler.errors import error_details, rich_status
from global_scheduler.leadership import Replica
from global_scheduler.server import GlobalSchedulerServicer
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

log = logging.getLogger(__name__)

FORWARDED_HEADER = "x-meridian-forwarded"
# Not passed on: transport and gRPC's own headers (the channel sets its own).
_DROPPED = ("user-agent", "content-type", "te", "grpc-", ":")
#: Errors meaning the leader applied nothing: safe to send the call to the next leader.
NOTHING_DONE_REASONS = frozenset({"NOT_LEADER", "NO_LEADER"})


def _connection_refused(exc: grpc.RpcError) -> bool:
    text = (exc.details() or "").lower()  # type: ignore[attr-defined]
    return "failed to connect" in text or "connection refused" in text


class HaServicer(api_grpc.GlobalSchedulerServicer):
    def __init__(self, replica: Replica) -> None:
        self.replica = replica
        self._local: tuple[Any, GlobalSchedulerServicer] | None = None
        self._channels: dict[str, tuple[grpc.Channel, api_grpc.GlobalSchedulerStub]] = {}
        self._lock = threading.Lock()
        self.forwarded = 0
        self.forward_retries = 0

    # ------------------------------------------------------------------ plumbing
    def _servicer(self) -> GlobalSchedulerServicer:
        engine = self.replica.engine
        local = self._local
        if local is None or local[0] is not engine:
            local = (engine, GlobalSchedulerServicer(engine))
            self._local = local
        return local[1]

    def _stub(self, address: str) -> api_grpc.GlobalSchedulerStub:
        with self._lock:
            got = self._channels.get(address)
            if got is None:
                options = [("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                           ("grpc.max_reconnect_backoff_ms", 500)]
                creds = self.replica.forward_credentials
                if creds is not None and self.replica.forward_server_name:
                    options.append(("grpc.ssl_target_name_override", self.replica.forward_server_name))
                channel = (grpc.secure_channel(address, creds, options=options) if creds is not None
                           else grpc.insecure_channel(address, options=options))
                got = (channel, api_grpc.GlobalSchedulerStub(channel))
                self._channels[address] = got
            return got[1]

    @staticmethod
    def _metadata(context: grpc.ServicerContext) -> tuple[list[tuple[str, Any]], bool]:
        out: list[tuple[str, Any]] = []
        forwarded = False
        for key, value in context.invocation_metadata() or ():
            if key == FORWARDED_HEADER:
                forwarded = True
            elif not key.startswith(_DROPPED):
                out.append((key, value))
        return out, forwarded

    def _unavailable(self, context: grpc.ServicerContext, message: str, reason: str) -> None:
        context.abort_with_status(rich_status(grpc.StatusCode.UNAVAILABLE, message, reason=reason))

    def _relay_error(self, exc: grpc.RpcError, context: grpc.ServicerContext) -> None:
        trailing = [(k, v) for k, v in (exc.trailing_metadata() or ())  # type: ignore[attr-defined]
                    if not k.startswith(("grpc-status", ":")) or k == "grpc-status-details-bin"]
        context.set_trailing_metadata(trailing)
        context.abort(exc.code(), exc.details() or "")  # type: ignore[attr-defined]

    def _call(self, name: str, request: Any, context: grpc.ServicerContext, *, retry_safe: bool) -> Any:
        """Run ``name`` locally while leading, else on the leader (module docstring for the retries). A
        streaming call returns the leader's stream unread: its errors surface while it is read."""
        if self.replica.leading():
            return getattr(self._servicer(), name)(request, context)
        metadata, forwarded = self._metadata(context)
        if forwarded:  # one hop only: the forwarding replica looks up the leader again
            self._unavailable(context, f"{self.replica.advertise} is not the leader", "NOT_LEADER")
        remaining = context.time_remaining()
        budget = self.replica.forward_timeout_s if remaining is None else min(remaining, self.replica.forward_timeout_s)
        deadline = time.monotonic() + budget
        metadata.append((FORWARDED_HEADER, self.replica.instance))
        last = "no leader elected yet"
        while True:
            if self.replica.leading():
                return getattr(self._servicer(), name)(request, context)
            left = deadline - time.monotonic()
            if left <= 0:
                self._unavailable(context, f"no leader to forward to within {budget:.1f} s ({last}); retry",
                                  "NO_LEADER")
            leader = self.replica.leader()
            if leader is None or leader.instance == self.replica.instance or not leader.advertise:
                # No leader, or this replica won and is still restoring the store: wait for either.
                self.replica.wait_leader_change(min(left, 0.05))
                continue
            if leader.advertise == self.replica.advertise:
                self._unavailable(context, f"the leader {leader.instance} advertises this replica's own address "
                                  f"{leader.advertise}: give each replica its own ha.advertise", "NO_LEADER")
            timeout = context.time_remaining()
            timeout = left if timeout is None else min(timeout, left)
            try:
                self.forwarded += 1
                return getattr(self._stub(leader.advertise), name)(request, metadata=metadata, timeout=timeout)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                again = code == grpc.StatusCode.UNAVAILABLE and (
                    retry_safe or _connection_refused(exc) or error_details(exc).reason in NOTHING_DONE_REASONS)
                if not again:
                    self._relay_error(exc, context)
                self.forward_retries += 1
                last = f"leader {leader.advertise}: {exc.details()}"  # type: ignore[attr-defined]
                # The lock names a leader that does not answer (it died; its lease has not expired yet).
                self.replica.wait_leader_change(min(max(0.0, deadline - time.monotonic()), 0.1))

    # ------------------------------------------------------------------ the API
    def SubmitWorkload(self, request: api.SubmitWorkloadRequest, context: grpc.ServicerContext) -> api.Workload:  # noqa: N802
        return self._call("SubmitWorkload", request, context, retry_safe=bool(request.idempotency_key))

    def GetWorkload(self, request: api.GetWorkloadRequest, context: grpc.ServicerContext) -> api.Workload:  # noqa: N802
        return self._call("GetWorkload", request, context, retry_safe=True)

    def ListWorkloads(self, request: api.ListWorkloadsRequest, context: grpc.ServicerContext) -> api.ListWorkloadsResponse:  # noqa: N802
        return self._call("ListWorkloads", request, context, retry_safe=True)

    def CancelWorkload(self, request: api.CancelWorkloadRequest, context: grpc.ServicerContext) -> api.Workload:  # noqa: N802
        return self._call("CancelWorkload", request, context, retry_safe=True)

    def ListClusters(self, request: api.ListClustersRequest, context: grpc.ServicerContext) -> api.ListClustersResponse:  # noqa: N802
        return self._call("ListClusters", request, context, retry_safe=True)

    def WatchWorkload(self, request: api.WatchWorkloadRequest, context: grpc.ServicerContext) -> Iterator[api.Workload]:  # noqa: N802
        stream = self._call("WatchWorkload", request, context, retry_safe=True)
        forwarded = isinstance(stream, grpc.Call)
        if forwarded:  # the caller leaving (or its deadline) ends the leader's stream too, idle or not
            context.add_callback(stream.cancel)
        try:
            yield from stream
        except grpc.RpcError as exc:  # the leader went away mid-watch: the caller watches again
            self._relay_error(exc, context)
        finally:
            if forwarded:
                stream.cancel()

    def close(self) -> None:
        with self._lock:
            for channel, _ in self._channels.values():
                channel.close()
            self._channels.clear()


def register(server: grpc.Server, replica: Replica) -> HaServicer:
    servicer = HaServicer(replica)
    api_grpc.add_GlobalSchedulerServicer_to_server(servicer, server)
    return servicer

