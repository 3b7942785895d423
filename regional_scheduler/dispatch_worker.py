"""The regional side of dispatch: consume ``meridian:{cluster}:dispatch``, place replicas, report back.

A thin stream consumer in front of the cluster's
:class:`~regional_scheduler.service.RegionalScheduler` (kopf-style: keyword-only parameters, back-off
over a sequence of delays, cleans up after itself). For each ``PlaceWorkload`` it asks the service to
decide every replica (the same filters and policy that place the cluster's Kubernetes pods) and binds
each through the service's binder, all or nothing: if one replica does not fit, the ones already
placed are released and a ``FAILED`` event says why (the filter diagnosis), so the global scheduler
reroutes. Here the binder is :class:`~regional_scheduler.binders.simulated.SimulatedBinder` (a
simulated cluster, for the demo and the benchmarks). On success it publishes ``SCHEDULED`` (with the nodes) and, on a
simulated cluster where pods start at once, ``RUNNING``. ``ReleaseWorkload`` frees the replicas
(cancel, failover, failback) and answers ``RELEASED``.

The payload contract is the proto (``protos/dispatch.proto``); this module does not import the
global scheduler. Delivery is at least once (consumer group, ack after apply, ``XAUTOCLAIM`` of a
dead consumer's pending entries), so application is idempotent per ``(workload_id, attempt)``: a
redelivered place of an attempt already applied is acknowledged without placing twice. Its events
are another matter: an entry is acknowledged only after its events are published, and when that
publish fails (Redis restarting) the entry comes back while the placement is already applied. The
events of an applied action are therefore kept until they are published and sent again on
redelivery; the global scheduler applies a phase of an attempt once, so a repeat is harmless.
A place of an attempt already applied whose events *were* published (the global scheduler's
reconciliation re-publishes a dispatch it has heard nothing of) re-emits the workload's current
event instead: ``RUNNING`` or ``SCHEDULED`` with its nodes, or ``FAILED`` with the reason, so a lost
event is healed as well as a lost dispatch; nothing when the attempt was released.

It also publishes a ``ClusterSummary`` of its (simulated) cluster to ``meridian:summary`` every
``summary_interval_s``, which is how the global registry learns about a simulated cluster. Its
``holdings`` list every workload held here (``holdings_complete``), which is what the global
reconciliation compares its dispatched workloads with.

Hazards: the placement table lives in memory, so a restarted worker forgets its placements on a
simulated cluster; malformed entries are dead-lettered. :meth:`DispatchWorker.run` waits out a bus it
cannot reach with back-off, from its first call on; the command (:func:`main`) reaches the bus once
before it serves and, when it cannot, says where it looked and exits 2, since at start a wrong URL or
password is likelier than an outage.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from meridian import observability as obs
from meridian.bus import (
    SUMMARY_STREAM,
    BusError,
    BusUnavailableError,
    StreamBus,
    dispatch_stream,
    events_stream,
)
from meridian.bus.base import StreamEntry
from meridian.bus.consumer import run_with_backoff
from meridian.bus.health import GroupGauges
from meridian.bus.settings import ConsumerSettings, StreamConsumerSettings
from meridian.cluster_state import ClusterState
from meridian.metrics import seed_fragmentation_score
from meridian.model import MILLI_GPU_PER_DEVICE, Node, Pod, Resources
from meridian.power_model import NodePowerModel
from protos import dispatch_pb2 as dpb
from protos import telemetry_pb2 as tpb
from regional_scheduler.binders.base import BindRequest
from regional_scheduler.binders.simulated import SimulatedBinder
from regional_scheduler.service import RegionalScheduler

log = logging.getLogger(__name__)
GROUP = "regional-dispatch"


DispatchBus = ConsumerSettings.tailored("DispatchBus", at_least={"block_ms": 1, "claim_idle_ms": 1000})
"""The dispatch worker's stream settings: the shared defaults; it must block (a worker that does not polls
Redis without pause) and claim only after a second (longer than any single apply)."""


class DispatchWorkerSettings(StreamConsumerSettings):
    """Environment: ``MERIDIAN_DISPATCH_*``; the stream settings ``MERIDIAN_DISPATCH_BUS__*`` (``BATCH``,
    ``BLOCK_MS``, ``CLAIM_IDLE_MS``, ``BACKOFF_S``; the flat ``MERIDIAN_DISPATCH_BLOCK_MS`` and so on still work)."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_DISPATCH_")
    flat_bus_names: ClassVar[Mapping[str, str]] = {"batch": "batch", "block_ms": "block_ms", "claim_idle_ms": "claim_idle_ms",
                      "backoff_s": "backoff_s"}

    cluster: str = Field("local", min_length=1, description="This cluster's name (selects meridian:{cluster}:dispatch).")
    bus_url: str = Field("redis://127.0.0.1:6379/0", description="Stream bus URL (redis://… or memory://).")
    publish_summaries: bool = Field(True, description="Publish ClusterSummary of the worker's own state; off when "
                                    "a telemetry consumer publishes this cluster's summaries.")
    region: str = Field("local", min_length=1, description="Region reported in the cluster summaries; the global "
                        "scheduler routes a workload here only if its allowed regions name it (or are empty).")
    policy: str = Field("best-fit", description="Placement policy name from regional_scheduler.policies.registry.")
    bus: DispatchBus = Field(default_factory=DispatchBus, description="Reading the dispatch stream: batch, "
                             "block_ms, claim_idle_ms, backoff_s (meridian.bus.settings.ConsumerSettings).")
    summary_interval_s: float = Field(5.0, gt=0, description="Seconds between summaries of a simulated cluster.")
    start_delay_s: float = Field(0.0, ge=0, description="Simulated pod start time (image pull, init): RUNNING "
                                 "follows SCHEDULED after this long; 0 = at once.")
    carbon_g_per_kwh: float | None = Field(None, ge=0, description="Grid intensity reported for a simulated "
                                           "cluster; unset: its summaries say the intensity is unknown.")
    pue: float = Field(1.2, ge=1, description="PUE reported for a simulated cluster.")
    events_maxlen: int = Field(100_000, ge=1000, description="Approximate bound of the events stream (entries).")


@dataclass
class Held:
    """A workload's replicas on this cluster: the pod uids the service counts, and each pod and node."""

    attempt: int
    uids: list[str] = field(default_factory=list)
    pods: list[tuple[Pod, str]] = field(default_factory=list)
    running: bool = False  # RUNNING was reported (a simulated pod has started)


class DispatchWorker:
    def __init__(self, *, bus: StreamBus, state: ClusterState, settings: DispatchWorkerSettings,
                 consumer: str | None = None, clock: Callable[[], float] = time.time) -> None:
        self.bus = bus
        self.settings = settings
        self.cluster = settings.cluster
        self.consumer = consumer or f"{settings.cluster}-{uuid.uuid4().hex[:6]}"
        self.clock = clock
        self.service = RegionalScheduler(cluster=settings.cluster, policy=settings.policy, state=state, clock=clock)
        self.binder = SimulatedBinder()
        self.held: dict[str, Held] = {}
        self.applied: set[tuple[str, int]] = set()
        self.failures: dict[tuple[str, int], str] = {}  # (workload, attempt) → why its place FAILED
        # Events of applied actions not yet known to be published, by (workload, attempt, action), and
        # the keys whose events are in the batch being handled (sent once per batch).
        self.unpublished: dict[tuple[str, int, str], list[bytes]] = {}
        self._in_batch: set[tuple[str, int, str]] = set()
        self.lock = threading.RLock()
        self.sequence = 0
        self.stream = dispatch_stream(self.cluster)
        self.events = events_stream(self.cluster)
        self._gauges = GroupGauges(bus, self.stream, GROUP)
        self.placed_total = 0
        self.failed_total = 0
        self.starting: list[tuple[float, str, int, list[str]]] = []  # (due, workload, attempt, nodes)

    @property
    def state(self) -> ClusterState:
        return self.service.state

    # ------------------------------------------------------------------ apply
    def _event(self, wid: str, attempt: int, phase: int, reason: str = "", nodes: Sequence[str] = ()) -> bytes:
        return dpb.PlacementEvent(workload_id=wid, attempt=attempt, cluster=self.cluster, phase=phase, reason=reason,
                                  nodes=list(nodes), time_s=self.clock()).SerializeToString()

    def _unbind(self, uids: Sequence[str]) -> None:
        for uid in uids:
            self.service.remove_pod(uid)
            self.binder.unbind(uid)

    def _release(self, wid: str) -> bool:
        held = self.held.pop(wid, None)
        if held is None:
            return False
        self._unbind(held.uids)
        return True

    def _remember(self, key: tuple[str, int, str], events: list[bytes]) -> list[bytes]:
        if events:
            self.unpublished[key] = events
            self._in_batch.add(key)
        return events

    def _replay(self, key: tuple[str, int, str]) -> list[bytes]:
        """A redelivered action already applied: its events again if their publish never succeeded."""
        events = self.unpublished.get(key)
        if events is None or key in self._in_batch:
            return []
        self._in_batch.add(key)
        return events

    def _restate(self, wid: str, attempt: int) -> list[bytes]:
        """A place of an attempt already applied: its events again if their publish never succeeded,
        otherwise the workload's current event (once per batch). The caller holds ``lock``."""
        key = (wid, attempt, "place")
        if key in self._in_batch:
            return []
        if key in self.unpublished:
            return self._replay(key)
        held = self.held.get(wid)
        if held is not None and held.attempt == attempt:
            phase = dpb.PLACEMENT_PHASE_RUNNING if held.running else dpb.PLACEMENT_PHASE_SCHEDULED
            events = [self._event(wid, attempt, phase, nodes=[node for _, node in held.pods])]
        elif (reason := self.failures.get((wid, attempt))) is not None:
            events = [self._event(wid, attempt, dpb.PLACEMENT_PHASE_FAILED, reason)]
        else:
            return []  # released, or voided by a release that came first: the global tier has moved on
        self._in_batch.add(key)
        return events

    def place(self, msg: dpb.PlaceWorkload) -> list[bytes]:
        key = (msg.workload_id, msg.attempt)
        with self.lock:
            if key in self.applied:
                return self._restate(*key)  # redelivered, or re-published by the global reconciliation
            self.applied.add(key)
            return self._remember((*key, "place"), self._place(msg))

    def _failed(self, msg: dpb.PlaceWorkload, reason: str) -> list[bytes]:
        self.failed_total += 1
        self.failures[(msg.workload_id, msg.attempt)] = reason
        return [self._event(msg.workload_id, msg.attempt, dpb.PLACEMENT_PHASE_FAILED, reason)]

    def _place(self, msg: dpb.PlaceWorkload) -> list[bytes]:
        with self.lock:
            if msg.workload_id in self.held:
                self._release(msg.workload_id)  # an older attempt routed here before
            r = msg.requests
            requests = Resources(milli_cpu=r.milli_cpu, memory_bytes=r.memory_bytes, gpu=r.gpu, gpu_milli=r.gpu_milli)
            held = Held(msg.attempt)
            for i in range(max(msg.replicas, 0)):
                pod = Pod(name=f"{msg.name}-{msg.workload_id[:8]}-{i}", requests=requests, priority=msg.priority,
                          tenant=msg.tenant or "default")
                uid = f"{msg.workload_id}/{msg.attempt}/{i}"
                try:
                    decision = self.service.decide(uid, pod)
                except Exception as exc:  # a policy bug must fail this workload, not wedge it as DISPATCHED
                    self._unbind(held.uids)
                    log.exception("dispatch worker %s: scheduling %s failed", self.cluster, pod.name)
                    obs.PLACEMENT_FAILURES.labels(component="regional-dispatch", cluster=self.cluster,
                                                  reason="scheduler error").inc()
                    return self._failed(msg, f"replica {i + 1}/{msg.replicas}: scheduler error: {exc}")
                if decision.placement is None:
                    self._unbind(held.uids)
                    why = decision.diagnosis.summary if decision.diagnosis is not None else "no node fits"
                    obs.PLACEMENT_FAILURES.labels(component="regional-dispatch", cluster=self.cluster,
                                                  reason="no node fits a replica").inc()
                    return self._failed(msg, f"replica {i + 1}/{msg.replicas}: {why}")
                node = self.service.node_name(decision)
                self.binder.bind(BindRequest(namespace=msg.tenant or "default", name=pod.name, uid=uid, node=node))
                self.service.observe_bound(uid, pod, node)  # the simulated binder is the cluster's truth
                held.uids.append(uid)
                held.pods.append((pod, node))
            self.held[msg.workload_id] = held
            self.placed_total += 1
            obs.PLACEMENTS.labels(component="regional-dispatch", cluster=self.cluster,
                                  policy=self.settings.policy).inc(len(held.pods))
            nodes = [node for _, node in held.pods]
            scheduled = self._event(msg.workload_id, msg.attempt, dpb.PLACEMENT_PHASE_SCHEDULED, nodes=nodes)
            if self.settings.start_delay_s > 0:
                self.starting.append((self.clock() + self.settings.start_delay_s, msg.workload_id, msg.attempt, nodes))
                return [scheduled]
            held.running = True
        return [scheduled, self._event(msg.workload_id, msg.attempt, dpb.PLACEMENT_PHASE_RUNNING, nodes=nodes)]

    def due_starts(self) -> list[bytes]:
        """RUNNING events of simulated pods whose start delay has passed (and that were not released)."""
        now = self.clock()
        out = []
        with self.lock:
            keep = []
            for due, wid, attempt, nodes in self.starting:
                if due > now:
                    keep.append((due, wid, attempt, nodes))
                elif (held := self.held.get(wid)) is not None and held.attempt == attempt:
                    held.running = True
                    out.append(self._event(wid, attempt, dpb.PLACEMENT_PHASE_RUNNING, nodes=nodes))
            self.starting = keep
        return out

    def release(self, msg: dpb.ReleaseWorkload) -> list[bytes]:
        key = (msg.workload_id, msg.attempt, "release")
        with self.lock:
            held = self.held.get(msg.workload_id)
            if held is None or held.attempt > msg.attempt:
                self.applied.add((msg.workload_id, msg.attempt))  # a late place of this attempt is void
                return self._replay(key)
            self._release(msg.workload_id)
            return self._remember(key, [self._event(msg.workload_id, msg.attempt, dpb.PLACEMENT_PHASE_RELEASED,
                                                    msg.reason)])

    def handle(self, entry: StreamEntry) -> list[bytes]:
        msg = dpb.DispatchMessage.FromString(entry.payload)
        kind = msg.WhichOneof("action")
        if kind == "place":
            if not msg.place.workload_id or msg.place.replicas < 1:
                raise ValueError("place without a workload id or replicas")
            return self.place(msg.place)
        if kind == "release":
            return self.release(msg.release)
        raise ValueError("dispatch message with neither place nor release")

    def poll_once(self, *, block_ms: int | None = None) -> int:
        """Read (and claim stale) entries, apply, publish events, acknowledge. Returns entries handled."""
        entries = self.bus.claim_stale(self.stream, GROUP, self.consumer, min_idle_ms=self.settings.bus.claim_idle_ms,
                                       count=self.settings.bus.batch)
        entries += self.bus.read_group(self.stream, GROUP, self.consumer, count=self.settings.bus.batch,
                                       block_ms=self.settings.bus.block_ms if block_ms is None else block_ms)
        self._gauges.maybe_update()
        if not entries:
            return 0
        out: list[bytes] = []
        self._in_batch = set()
        for entry in entries:
            try:
                out.extend(self.handle(entry))
            except Exception as exc:
                self.bus.dead_letter(self.stream, entry, reason=f"cannot apply: {exc}", group=GROUP,
                                     consumer=self.consumer)
                obs.STREAM_DEAD_LETTERS.labels(stream="meridian:dispatch", reason="apply").inc()
        if out:  # a failure here leaves the entries pending: redelivered, their events are sent again
            self.bus.publish_many(self.events, out, maxlen=self.settings.events_maxlen)
        with self.lock:
            for key in self._in_batch:
                self.unpublished.pop(key, None)
            self._in_batch = set()
        self.bus.ack(self.stream, GROUP, [e.entry_id for e in entries])
        return len(entries)

    # ------------------------------------------------------------------ summaries
    def summary(self) -> tpb.ClusterSummary:
        ci = self.settings.carbon_g_per_kwh or 0.0
        with self.lock, self.service.lock:
            st = self.state
            sched = st.schedulable
            free_cpu = np.where(sched, st.free_milli_cpu, 0)
            free_mem = np.where(sched, st.free_memory_bytes, 0)
            self.sequence += 1
            power = simulated_power_watts(st)
            idle = simulated_power_watts(st, idle=True)
            holdings = []
            for wid, held in self.held.items():
                if not held.pods:
                    continue
                reqs = [pod.requests for pod, _ in held.pods]
                holdings.append(tpb.WorkloadHolding(
                    workload=wid, tenant=held.pods[0][0].tenant, milli_cpu=sum(r.milli_cpu for r in reqs),
                    memory_bytes=sum(r.memory_bytes for r in reqs), gpu_milli=sum(r.gpu_milli_total for r in reqs)))
            return tpb.ClusterSummary(
                cluster=self.cluster, region=self.settings.region, sequence=self.sequence,
                generated_unix_ms=int(self.clock() * 1000), nodes_total=st.n_nodes,
                nodes_schedulable=int(sched.sum()), nodes_stale=0,
                allocatable=tpb.ResourceVector(milli_cpu=int(st.alloc_milli_cpu[sched].sum()),
                                               memory_bytes=int(st.alloc_memory_bytes[sched].sum()),
                                               gpu=int(st.gpu_count[sched].sum())),
                requested=tpb.ResourceVector(milli_cpu=int(st.req_milli_cpu[sched].sum()),
                                             memory_bytes=int(st.req_memory_bytes[sched].sum())),
                free=tpb.ResourceVector(milli_cpu=int(free_cpu.sum()), memory_bytes=int(free_mem.sum()),
                                        gpu=int(st.gpu_full_free[sched].sum())),
                gpu_free_milli=int(st.gpu_free_milli[sched].sum()), gpu_devices_idle=int(st.gpu_full_free[sched].sum()),
                max_node_free_milli_cpu=int(free_cpu.max(initial=0)),
                max_node_free_memory_bytes=int(free_mem.max(initial=0)),
                fragmentation_score=seed_fragmentation_score(st) if st.n_nodes else 0.0,
                power_watts=power, carbon_g_per_kwh=ci, carbon_g_per_s=power * self.settings.pue * ci / 3.6e6,
                carbon_unknown=self.settings.carbon_g_per_kwh is None,
                pue=self.settings.pue, idle_power_watts=idle, holdings=holdings, holdings_complete=True)

    def publish_summary(self) -> None:
        self.bus.publish(SUMMARY_STREAM, self.summary().SerializeToString(), maxlen=10_000)

    # ------------------------------------------------------------------ loop
    def run(self, stop: threading.Event, *, summaries: bool = True) -> None:
        next_summary = 0.0
        grouped = False

        def step() -> None:
            nonlocal next_summary, grouped
            if not grouped:  # inside the back-off: a worker started while Redis is down waits for it
                self.bus.ensure_group(self.stream, GROUP, start_id="0")
                grouped = True
            if summaries and time.monotonic() >= next_summary:
                self.publish_summary()
                next_summary = time.monotonic() + self.settings.summary_interval_s
            self.poll_once()
            started = self.due_starts()
            if started:
                self.bus.publish_many(self.events, started, maxlen=self.settings.events_maxlen)

        def say(exc: Exception, delay: float) -> None:
            log.warning("dispatch worker %s: bus unavailable (%s); retrying in %.1f s", self.cluster, exc, delay)

        run_with_backoff(stop, step, delays=self.settings.bus.backoff_s, on_failure=say)


def simulated_power_watts(st: ClusterState, *, idle: bool = False) -> float:
    """A simulated cluster's IT power from the node agents' documented model (:mod:`meridian.power_model`):
    requested CPU as host utilisation on each node's profile, allocated GPU share per device. ``idle``: the
    same nodes with nothing running (the floor that accounting shares out by requests)."""
    alloc = np.column_stack([st.alloc_milli_cpu, st.alloc_memory_bytes, st.gpu_exists.sum(axis=1)])
    model = NodePowerModel.for_nodes(alloc, [st.gpu_models[m] if m >= 0 else "" for m in st.gpu_model_id],
                                     gpu_exists=st.gpu_exists)
    cpu_util = st.req_milli_cpu / np.maximum(st.alloc_milli_cpu, 1)
    gpu_util = 1.0 - st.gpu_free_milli / MILLI_GPU_PER_DEVICE
    if idle:
        cpu_util, gpu_util = np.zeros_like(cpu_util), np.zeros_like(gpu_util)
    return float(np.where(st.schedulable, model.watts_at(cpu_util, gpu_util), 0.0).sum())


def simulated_cluster(nodes: Sequence[Node], *, start: int = 0, count: int | None = None) -> ClusterState:
    """A simulated cluster from a slice of a node list (e.g. the openb nodes)."""
    chosen = list(nodes[start:start + count] if count is not None else nodes[start:])
    if not chosen:
        raise ValueError("a simulated cluster needs at least one node")
    return ClusterState.from_nodes(chosen)


def _check_bus(bus: StreamBus, settings: DispatchWorkerSettings) -> None:
    """Reach the bus once before serving: a worker that cannot is misconfigured more often than early, and
    says so at once instead of retrying in its log. (Once started, an outage is waited out with back-off.)"""
    from meridian.bus import redact_url
    from meridian.bus.base import BusAuthenticationError
    from meridian.errors import UserError, one_line

    try:
        bus.ensure_group(dispatch_stream(settings.cluster), GROUP, start_id="0")
    except BusAuthenticationError:
        raise  # its message names the user, the URL and where credentials come from
    except BusUnavailableError as exc:
        cause = exc.__cause__ if exc.__cause__ is not None else exc
        raise UserError(f"Redis at {redact_url(settings.bus_url)} is unreachable ({one_line(cause)})",
                        hint="start Redis there (redis-server), or point --bus-url or MERIDIAN_DISPATCH_BUS_URL at a "
                             "running one") from exc
    except BusError as exc:  # NOPERM (the ACL user may not create its consumer group), a wrong key type
        raise UserError(f"Redis at {redact_url(settings.bus_url)} refused the worker's consumer group on "
                        f"{dispatch_stream(settings.cluster)}: {one_line(exc)}",
                        hint="use the meridian-regional user of deploy/redis/users.acl, or one with its rights") from exc


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m regional_scheduler.dispatch_worker``: one worker on a simulated cluster of openb nodes.

    Settings come from ``MERIDIAN_DISPATCH_*`` (:class:`DispatchWorkerSettings`); the flags override them.
    An everyday mistake at start (Redis unreachable, a bad setting, no traces) is one line on stderr,
    ``error: <what>; <what to do>``, and exit status 2, as for ``meridian`` commands (:mod:`meridian.errors`);
    ``--verbose`` shows the traceback too."""
    import argparse
    import signal
    import traceback

    from meridian.bus import open_bus
    from meridian.errors import USER_ERROR_EXIT, UserError, describe
    from meridian.traces.openb import load_nodes

    defaults = DispatchWorkerSettings.model_fields
    parser = argparse.ArgumentParser(prog="python -m regional_scheduler.dispatch_worker",
                                     description="One regional dispatch worker on a simulated cluster of openb "
                                     "nodes. Settings: MERIDIAN_DISPATCH_* (the flags override them).")
    parser.add_argument("--cluster", help="this cluster's name: it reads meridian:{CLUSTER}:dispatch "
                        f"(default $MERIDIAN_DISPATCH_CLUSTER, else {defaults['cluster'].default!r})")
    parser.add_argument("--region", help="the region its summaries report, which workloads' allowed regions name "
                        f"(default $MERIDIAN_DISPATCH_REGION, else {defaults['region'].default!r})")
    parser.add_argument("--bus-url", help="Redis URL of the stream bus "
                        f"(default $MERIDIAN_DISPATCH_BUS_URL, else {defaults['bus_url'].default})")
    parser.add_argument("--nodes", type=int, default=50, help="openb nodes in the simulated cluster")
    parser.add_argument("--node-offset", type=int, default=0, help="first openb node of the slice")
    parser.add_argument("--verbose", "-v", action="store_true", help="DEBUG logs, and the traceback of a mistake "
                        "that stops the worker from starting")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.node_offset < 0:
        parser.error("--nodes must be at least 1 and --node-offset at least 0")
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    flags = {"cluster": args.cluster, "region": args.region, "bus_url": args.bus_url}
    try:
        settings = DispatchWorkerSettings(**{k: v for k, v in flags.items() if v is not None})
        bus = open_bus(settings.bus_url)
        _check_bus(bus, settings)
        nodes = load_nodes()
        if args.node_offset >= len(nodes):
            raise UserError(f"--node-offset {args.node_offset} is past the last of the {len(nodes)} openb nodes",
                            hint=f"give one below {len(nodes)}")
        state = simulated_cluster(nodes, start=args.node_offset, count=args.nodes)
    except Exception as exc:
        mistake = describe(exc)
        if mistake is None:
            raise  # a bug: keep its traceback
        if args.verbose:
            traceback.print_exception(exc)
        print(f"error: {mistake}", file=sys.stderr)
        return USER_ERROR_EXIT
    worker = DispatchWorker(bus=bus, state=state, settings=settings)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    log.info("dispatch worker for cluster %s in region %s (%d nodes, policy %s)", settings.cluster, settings.region,
             state.n_nodes, settings.policy)
    worker.run(stop, summaries=settings.publish_summaries)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
