"""Federated averaging with secure aggregation: Flower's SecAgg+ protocol, so the server learns only the sum.

With plain federated averaging (:mod:`meridian.federated.engine`) the server sees each region's model update,
and a model update can leak facts about the data it was trained on. Under SecAgg+ each region masks its
(weighted, quantised) update with pairwise masks that cancel in the sum and a private mask whose seed the other
regions hold in secret shares; the server adds the masked vectors, collects just enough shares to remove the
private masks of the sum, and never holds one region's update in the clear. What stays visible to the server:
each region's example count and its declared scalar metrics (Flower's ``FitRes``), and evaluation losses.

Everything on both sides is Flower's own, unchanged: the server runs Flower's ``FedAvg`` strategy inside
``DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(...))`` (as in Flower's secure-aggregation example) and
each region is a Flower ``ClientApp`` with ``secaggplus_mod`` around a ``NumPyClient`` whose every reply goes
through the same :class:`~meridian.federated.engine.BoundaryGuard` as in the plain engine, so the guard checks
the update before it enters SecAgg+.

SecAgg+ exists only on Flower's Message API (a ``Grid`` between a ``ServerApp`` and ``ClientApp``\\ s), not
on the legacy ``start_server``. Flower's deployment engine (``flower-superlink`` + one ``flower-supernode``
per region + ``flwr run``) does run it on loopback, but starts a fresh ``flwr-clientapp`` process for every
message, and a SecAgg+ round is five messages per region (four SecAgg+ stages and the evaluation): over a
minute for one round of a three-region toy on a two-core machine. Its simulation engine needs Ray. So the transport here is :class:`LoopbackGrid`, an implementation of Flower's
public ``Grid`` interface in which each region's ``ClientApp`` runs in its own thread, with its own
``Context`` (the state ``secaggplus_mod`` keeps between stages), and every message in both directions is
serialised to Flower's wire format (``flwr.proto`` ``Message``) and parsed back, so that nothing is shared
between server and regions but bytes, and the bytes of a round are counted, not estimated.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.serverapp import Grid

from meridian.federated.engine import (
    Arrays,
    BoundaryError,
    BoundaryGuard,
    FederatedResult,
    LocalTask,
    RoundStats,
    numpy_client,
)

log = logging.getLogger(__name__)

_MODULUS_RANGE = 2**32  # Flower's default and largest: the masks are uniform below it


@dataclass(frozen=True)
class SecAggSettings:
    """SecAgg+ parameters (Flower's names and meaning), checked before anything starts.

    ``num_shares``: regions (itself included) among which each region secret-shares its mask keys;
    ``reconstruction_threshold``: shares needed to rebuild a key, so up to ``reconstruction_threshold - 1``
    colluding neighbours learn nothing, and up to ``num_shares - reconstruction_threshold`` can drop out;
    each region's update times ``examples / max_weight`` is clipped to ``±clipping_range`` and quantised to
    ``quantization_range`` levels."""

    num_shares: int
    reconstruction_threshold: int
    clipping_range: float
    quantization_range: int
    max_weight: float

    def check(self, regions: int) -> None:
        if regions < 3:
            raise ValueError(f"SecAgg+ needs at least 3 regions, got {regions}: with 2, each one could "
                             "subtract its own update from the aggregate and read the other's")
        if not 3 <= self.num_shares <= regions:
            raise ValueError(f"num_shares must be between 3 and the number of regions ({regions}), "
                             f"got {self.num_shares}")
        if not 2 <= self.reconstruction_threshold < self.num_shares:
            raise ValueError(f"reconstruction_threshold must be at least 2 and below num_shares "
                             f"({self.num_shares}), got {self.reconstruction_threshold}")
        if not self.clipping_range > 0:
            raise ValueError(f"clipping_range must be positive, got {self.clipping_range}")
        if not 0 < self.quantization_range < _MODULUS_RANGE // regions:
            raise ValueError(f"quantization_range must be positive and below 2**32 / regions "
                             f"({_MODULUS_RANGE // regions}) so the masked sum cannot overflow, "
                             f"got {self.quantization_range}")
        if not self.max_weight > 0:
            raise ValueError(f"max_weight must be positive, got {self.max_weight}")

    def quantisation_step(self) -> float:
        """The width of one quantisation level of a weighted update (before dividing by the total weight)."""
        return 2 * self.clipping_range / self.quantization_range


class LoopbackGrid(Grid):  # type: ignore[misc]
    """Flower's ``Grid`` with each region's ``ClientApp`` in a thread of this process.

    A message to a region is serialised to Flower's wire format, parsed back in the region's thread, handled
    by its ``ClientApp`` (one message at a time, in order, as a SuperNode does), and the reply travels back
    the same way. ``received`` keeps every reply as the server parsed it (what the server could see), and
    ``bytes_down`` / ``bytes_up`` count the serialised bytes per message group (Flower's workflows use the
    round number as the group)."""

    def __init__(self, apps: Mapping[str, Any], *, run_id: int = 1) -> None:
        from flwr.app import Context, RecordDict
        from flwr.supercore.run import Run

        self._run = Run.create_empty(run_id)
        self.regions = {i + 1: name for i, name in enumerate(sorted(apps))}
        self._apps = {nid: apps[name] for nid, name in self.regions.items()}
        self._contexts = {nid: Context(run_id=run_id, node_id=nid, node_config={"region": name},
                                       state=RecordDict(), run_config={})
                          for nid, name in self.regions.items()}
        self._workers = {nid: ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"region-{name}")
                         for nid, name in self.regions.items()}
        self._pending: dict[str, Future[bytes]] = {}
        self._lock = threading.Lock()
        self.received: list[tuple[str, Any]] = []
        self.client_errors: list[str] = []
        self.bytes_down: dict[str, int] = defaultdict(int)
        self.bytes_up: dict[str, int] = defaultdict(int)

    def close(self) -> None:
        for worker in self._workers.values():
            worker.shutdown(wait=True, cancel_futures=True)

    # --- flwr.serverapp.Grid -------------------------------------------------------------------------------

    def set_run(self, run: Any) -> None:
        self._run = run

    @property
    def run(self) -> Any:
        return self._run

    def create_message(self, content: Any, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Any:
        from flwr.app import Message

        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        return list(self.regions)

    def push_messages(self, messages: Iterable[Any]) -> Iterable[str]:
        ids = []
        for msg in messages:
            if msg.metadata.dst_node_id not in self._workers:
                raise ValueError(f"no region has node id {msg.metadata.dst_node_id}")
            msg_id = uuid.uuid4().hex
            # Flower's own grids set the id this way: the server's runtime, not the sender, names a message.
            msg.metadata.__dict__["_message_id"] = msg_id
            wire = _to_wire(msg)
            with self._lock:
                self.bytes_down[msg.metadata.group_id] += len(wire)
            self._pending[msg_id] = self._workers[msg.metadata.dst_node_id].submit(
                self._handle, msg.metadata.dst_node_id, wire)
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Any]:
        replies = []
        for msg_id in list(message_ids):
            future = self._pending.get(msg_id)
            if future is None or not future.done():
                continue
            del self._pending[msg_id]
            reply = _from_wire(future.result())
            reply.metadata.__dict__["_message_id"] = uuid.uuid4().hex
            self.received.append((self.regions[reply.metadata.src_node_id], reply))
            replies.append(reply)
        return replies

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> Iterable[Any]:
        ids = list(self.push_messages(messages))
        wait_futures([self._pending[i] for i in ids], timeout=timeout)
        return self.pull_messages(ids)

    # --- the region's side ---------------------------------------------------------------------------------

    def _handle(self, node_id: int, wire: bytes) -> bytes:
        from flwr.app import Error, Message
        from flwr.common.constant import ErrorCode

        msg = _from_wire(wire)
        try:
            reply = self._apps[node_id](msg, self._contexts[node_id])
        except Exception as exc:  # a SuperNode answers a failing ClientApp with an error reply, so does this
            text = f"{self.regions[node_id]}: {type(exc).__name__}: {exc}"
            log.warning("region client failed: %s", text)
            with self._lock:
                self.client_errors.append(text)
            reply = Message(Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=text), reply_to=msg)
        out = _to_wire(reply)
        with self._lock:
            self.bytes_up[msg.metadata.group_id] += len(out)
        return out


def _to_wire(msg: Any) -> bytes:
    from flwr.common.serde import message_to_proto

    return bytes(message_to_proto(msg).SerializeToString())


def _from_wire(data: bytes) -> Any:
    from flwr.common.serde import message_from_proto
    from flwr.proto.message_pb2 import Message as ProtoMessage

    return message_from_proto(ProtoMessage.FromString(data))


def _client_app(task: LocalTask, guard: BoundaryGuard, settings: SecAggSettings, *, epochs: int, seed: int) -> Any:
    """A region's ``ClientApp``: ``secaggplus_mod`` around the engine's guarded ``NumPyClient``.

    SecAgg+ clips what it cannot represent; a clipped update would silently corrupt the sum, so an update
    outside the range refuses to leave the region instead."""
    from flwr.client import ClientApp
    from flwr.client.mod import secaggplus_mod

    def in_range(arrays: Arrays, n: int, metrics: dict[str, float]) -> tuple[Arrays, int, dict[str, float]]:
        weight = n / settings.max_weight
        largest = max((float(np.max(np.abs(a))) for a in arrays if a.size), default=0.0) * weight
        if weight > 1 or largest > settings.clipping_range:
            raise BoundaryError(f"{guard.region} fit: update × examples/max_weight reaches {largest:.4g} "
                                f"(weight {weight:.4g}); SecAgg+ represents only ±{settings.clipping_range:g} "
                                "with weight ≤ 1: raise clipping_range or max_weight")
        return arrays, n, metrics

    class InRangeGuard(BoundaryGuard):
        def fit_result(self, arrays: Arrays, n: int, metrics: dict[str, float]) -> tuple[Arrays, int, dict[str, float]]:
            # The guard's own checks first (on a scratch guard, which records nothing), so that the range check
            # sees float arrays of the model's shapes, and only an update that is sent is recorded as sent.
            BoundaryGuard(self.region, self.shapes, self.metric_names).fit_result(arrays, n, metrics)
            return super().fit_result(*in_range(arrays, n, metrics))

    checked = InRangeGuard(guard.region, guard.shapes, guard.metric_names, guard.sent)

    def client_fn(context: Any) -> Any:
        return numpy_client(task, checked, epochs=epochs, seed=seed).to_client()

    return ClientApp(client_fn=client_fn, mods=[secaggplus_mod])


def run_secure_federated(tasks: Mapping[str, LocalTask], *, rounds: int, seed: int = 0, epochs: int = 1,
                         num_shares: int | None = None, reconstruction_threshold: int | None = None,
                         clipping_range: float = 8.0, quantization_range: int = 2**22, max_weight: float = 1000.0,
                         on_round: Callable[[RoundStats], None] | None = None,
                         timeout_s: float = 600.0, grid_out: list[LoopbackGrid] | None = None) -> FederatedResult:
    """FedAvg over ``tasks`` (region → task) for ``rounds`` rounds, each round's average computed by SecAgg+.

    ``num_shares`` defaults to every region and ``reconstruction_threshold`` to a majority of the shares.
    Raises ``ValueError`` for settings SecAgg+ cannot run with, and ``RuntimeError`` when a round's secure
    aggregation does not complete (a region's client failed, or too few shares came back). ``RoundStats``
    carries each round's wall time and the serialised bytes of all its messages (SecAgg+'s key exchange
    included). ``grid_out``, when given, receives the grid, so a caller can inspect what the server saw."""
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # Flower reports usage over the network unless told not to
    names = sorted(tasks)
    shares = len(names) if num_shares is None else num_shares
    settings = SecAggSettings(num_shares=shares,
                              reconstruction_threshold=shares // 2 + 1 if reconstruction_threshold is None
                              else reconstruction_threshold,
                              clipping_range=clipping_range, quantization_range=quantization_range,
                              max_weight=max_weight)
    settings.check(len(names))
    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    shapes = [a.shape for a in tasks[names[0]].initial_parameters()]
    guards = {n: BoundaryGuard(n, shapes, tasks[n].metric_names) for n in names}
    grid = LoopbackGrid({n: _client_app(tasks[n], guards[n], settings, epochs=epochs, seed=seed) for n in names})
    if grid_out is not None:
        grid_out.append(grid)
    try:
        final, stats = _serve(grid, tasks[names[0]].initial_parameters(), settings, rounds=rounds,
                              on_round=on_round, timeout_s=timeout_s)
    finally:
        grid.close()
    return FederatedResult(parameters=final, rounds=stats, refused_updates=[],
                           sent={n: g.sent for n, g in guards.items()})


def _serve(grid: LoopbackGrid, initial: Arrays, settings: SecAggSettings, *, rounds: int,
           on_round: Callable[[RoundStats], None] | None, timeout_s: float) -> tuple[Arrays, list[RoundStats]]:
    """Flower's server side: ``FedAvg`` in ``DefaultWorkflow`` with ``SecAggPlusWorkflow`` for fitting."""
    from flwr.app import Context, RecordDict
    from flwr.common import ndarrays_to_parameters, parameters_to_ndarrays
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.server import LegacyContext, ServerConfig
    from flwr.server.strategy import FedAvg
    from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow

    regions = len(grid.regions)
    stats: list[RoundStats] = []
    aggregated: dict[int, Arrays] = {}
    clock = {"t": time.perf_counter()}

    class Reporting(FedAvg):  # type: ignore[misc]
        def aggregate_fit(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
            out = super().aggregate_fit(server_round, results, failures)
            if out[0] is not None:
                aggregated[server_round] = parameters_to_ndarrays(out[0])
            return out

        def aggregate_evaluate(self, server_round: int, results: list[Any], failures: list[Any]) -> Any:
            out = super().aggregate_evaluate(server_round, results, failures)
            now = time.perf_counter()
            group = str(server_round)
            s = RoundStats(server_round, now - clock["t"], bytes_to_server=grid.bytes_up[group],
                           bytes_from_server=grid.bytes_down[group], loss=None if out[0] is None else float(out[0]))
            clock["t"] = now
            stats.append(s)
            if on_round is not None:
                on_round(s)
            return out

    strategy = Reporting(fraction_fit=1.0, fraction_evaluate=1.0, min_fit_clients=regions,
                         min_evaluate_clients=regions, min_available_clients=regions,
                         initial_parameters=ndarrays_to_parameters(initial),
                         on_fit_config_fn=lambda r: {"server_round": r},
                         evaluate_metrics_aggregation_fn=lambda results: {})
    context = LegacyContext(context=Context(run_id=grid.run.run_id, node_id=SUPERLINK_NODE_ID, node_config={},
                                            state=RecordDict(), run_config={}),
                            config=ServerConfig(num_rounds=rounds, round_timeout=timeout_s), strategy=strategy)
    workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
        num_shares=settings.num_shares, reconstruction_threshold=settings.reconstruction_threshold,
        max_weight=settings.max_weight, clipping_range=settings.clipping_range,
        quantization_range=settings.quantization_range, modulus_range=_MODULUS_RANGE, timeout=timeout_s))
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    flwr_log.setLevel(logging.ERROR)  # Flower logs every stage of every round at INFO; the run reports its own
    try:
        with _server_identity(grid.run.run_id):
            workflow(grid, context)
    finally:
        flwr_log.setLevel(level)
    missing = [r for r in range(1, rounds + 1) if r not in aggregated]
    if missing or grid.client_errors:
        raise RuntimeError(f"secure aggregation did not complete in round(s) {missing}: "
                           f"{'; '.join(grid.client_errors) or 'too few regions answered'}")
    return aggregated[rounds], stats


@contextmanager
def _server_identity(run_id: int) -> Iterator[None]:
    """Flower's messages take their sender from ``TaskIdentity``, which a Flower runtime sets once per process
    (the ``ServerApp``'s, in a SuperLink's server process). Here server and regions share the caller's process,
    so the server's identity is set for the run and the caller's put back after it; a region's replies take
    theirs from the message they answer."""
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    saved = {key: vars(TaskIdentity)[key] for key in ("_task_id", "_run_id", "_node_id")}
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, run_id, SUPERLINK_NODE_ID
    try:
        yield
    finally:
        for key, value in saved.items():
            setattr(TaskIdentity, key, value)
