"""The cluster summary a regional scheduler publishes for the global tier, at a fixed interval.

:func:`build_summary` reduces the telemetry-fed :class:`~regional_scheduler.telemetry_state.TelemetryState`
to one ``ClusterSummary`` with numpy reductions over all nodes: capacity sums over *schedulable*
nodes (stale and cordoned ones cannot take work), the largest single-node free CPU and memory (what
the biggest pod could get), measured usage, power and energy over nodes with a fresh report,
fragmentation (:func:`meridian.metrics.seed_fragmentation_score`), and carbon:

    carbon_g_per_s = Σ_nodes power_W · PUE · intensity_g/kWh / 3.6e6      (W·g/kWh → g/s)
    carbon_g_per_kwh = Σ power · intensity / Σ power                      (power-weighted mean)

both over the fresh nodes whose intensity is known (a node reporting ``CARBON_SOURCE_NONE`` has NaN);
with none, ``carbon_unknown`` is set and both are 0, which the global tier shows as "unknown".

:class:`SummaryPublisher` is the worker (kopf-like: keyword-only parameters, back-off over delays)
that appends one summary per interval to ``meridian:summary``, trimmed to ``maxlen``.

Hazard: every cluster shares the summary stream; readers take the newest entry per cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from meridian import observability
from meridian.bus import SUMMARY_STREAM, StreamBus, open_bus
from meridian.bus.consumer import run_with_backoff
from meridian.bus.settings import BackoffDelays
from meridian.cluster_state import ClusterState
from meridian.metrics import seed_fragmentation_score
from protos import telemetry_pb2 as pb
from regional_scheduler.service import RegionalScheduler
from regional_scheduler.telemetry_state import TelemetryConsumer, TelemetryConsumerSettings, TelemetryState

log = logging.getLogger(__name__)
JOULES_PER_KWH = 3.6e6


class SummarySettings(BaseSettings):
    """The regional summary publisher (environment: ``MERIDIAN_SUMMARY_*``)."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_SUMMARY_")

    region: str = Field("local", description="Region of this cluster, copied into each summary.")
    interval_s: float = Field(10.0, gt=0, description="Seconds between summaries: the global tier routes on "
                              "minutes-scale capacity and carbon, so 10 s is fresh and costs nothing.")
    maxlen: int = Field(10_000, ge=100, description="Approximate length bound of meridian:summary (entries); "
                        "100 clusters every 10 s keep about 17 minutes of history.")
    backoff_s: BackoffDelays = Field((0.5, 1.0, 2.0, 5.0), description="Delays (s) between retries while the "
                                     "bus is unreachable; the last repeats. A summary every 10 s need not retry "
                                     "sooner than 0.5 s.")


class SummarySource(Protocol):
    """What a summary is built from: a telemetry-fed state (:class:`TelemetryState`), or the regional
    scheduler's own (:class:`~regional_scheduler.service.RegionalScheduler`, allocation from the API
    server's informers and telemetry from the agents). Read under ``lock``."""

    cluster: str
    lock: Any
    applied_total: int

    @property
    def state(self) -> ClusterState: ...

    @property
    def stale(self) -> np.ndarray: ...

    @property
    def pue(self) -> np.ndarray: ...


class DispatchedObjects(Protocol):
    """What a cluster's dispatch side adds to its summaries when it creates objects in the API server
    (:class:`~regional_scheduler.kube_dispatch.KubeDispatchWorker`): whether that API server answers (a
    cluster that cannot reach its own stops reporting, so the global tier fails its workloads over) and the
    workloads it holds (the global reconciliation's evidence of stale copies)."""

    def answering(self) -> bool: ...

    def holdings(self) -> list[pb.WorkloadHolding] | None: ...


def build_summary(tstate: SummarySource, *, region: str, sequence: int, now_s: float) -> pb.ClusterSummary:
    """One ``ClusterSummary`` of the current state (caller holds no lock; this takes it)."""
    with tstate.lock:
        st = tstate.state
        sched = st.schedulable
        fresh = ~tstate.stale & ~np.isnan(st.last_seen_s)
        free_cpu = np.where(sched, st.free_milli_cpu, 0)
        free_mem = np.where(sched, st.free_memory_bytes, 0)
        power = np.where(fresh, np.nan_to_num(st.power_watts), 0.0)
        carbon_known = fresh & ~np.isnan(st.carbon_g_per_kwh)
        intensity = np.where(carbon_known, st.carbon_g_per_kwh, 0.0)
        pue = np.where(np.isnan(tstate.pue), 1.0, tstate.pue)
        total_power = float(power.sum())
        weighted = (lambda v: float((power * v).sum() / total_power)) if total_power > 0 else (lambda v: 0.0)
        known_power = float(power[carbon_known].sum())
        if known_power > 0:
            carbon = float((power * intensity).sum() / known_power)
        else:  # known intensities but no power drawn: their plain mean, still a grid figure
            carbon = float(intensity[carbon_known].mean()) if carbon_known.any() else 0.0
        return pb.ClusterSummary(
            cluster=tstate.cluster, region=region, sequence=sequence, generated_unix_ms=int(now_s * 1000),
            nodes_total=st.n_nodes, nodes_schedulable=int(sched.sum()), nodes_stale=int(tstate.stale.sum()),
            allocatable=pb.ResourceVector(milli_cpu=int(st.alloc_milli_cpu[sched].sum()),
                                          memory_bytes=int(st.alloc_memory_bytes[sched].sum()),
                                          gpu=int(st.gpu_count[sched].sum())),
            requested=pb.ResourceVector(milli_cpu=int(st.req_milli_cpu[sched].sum()),
                                        memory_bytes=int(st.req_memory_bytes[sched].sum())),
            free=pb.ResourceVector(milli_cpu=int(free_cpu.sum()), memory_bytes=int(free_mem.sum()),
                                   gpu=int(st.gpu_full_free[sched].sum())),
            used=pb.ResourceVector(milli_cpu=int(np.nansum(np.where(fresh, st.used_milli_cpu, 0.0))),
                                   memory_bytes=int(np.nansum(np.where(fresh, st.used_memory_bytes, 0.0)))),
            gpu_free_milli=int(st.gpu_free_milli[sched].sum()),
            gpu_devices_idle=int(st.gpu_full_free[sched].sum()),
            max_node_free_milli_cpu=int(free_cpu.max(initial=0)),
            max_node_free_memory_bytes=int(free_mem.max(initial=0)),
            fragmentation_score=seed_fragmentation_score(st) if st.n_nodes else 0.0,
            power_watts=total_power,
            energy_joules=float(np.nansum(st.energy_joules)),
            carbon_g_per_kwh=carbon, carbon_unknown=not carbon_known.any(),
            carbon_g_per_s=float((power * pue * intensity).sum() / JOULES_PER_KWH),
            pue=weighted(pue),
            reports_applied=tstate.applied_total,
        )


class SummaryPublisher:
    """Publishes a summary of one cluster every ``interval_s`` until stopped."""

    def __init__(self, *, bus: StreamBus, state: SummarySource, settings: SummarySettings,
                 clock: Callable[[], float] = time.time, objects: DispatchedObjects | None = None) -> None:
        self.bus, self.state, self.settings, self.clock = bus, state, settings, clock
        self.objects = objects
        self.sequence = 0
        self.withheld_total = 0

    def publish_once(self) -> pb.ClusterSummary | None:
        """Publish one summary; None (nothing published) while the cluster's API server does not answer."""
        if self.objects is not None and not self.objects.answering():
            if self.withheld_total % 30 == 0:
                log.warning("cluster %s: its API server does not answer; summaries withheld, so the global tier "
                            "moves its workloads elsewhere", self.state.cluster)
            self.withheld_total += 1
            return None
        self.sequence += 1
        summary = build_summary(self.state, region=self.settings.region, sequence=self.sequence, now_s=self.clock())
        if self.objects is not None and (held := self.objects.holdings()) is not None:
            summary.holdings.extend(held)
            summary.holdings_complete = True
        self.bus.publish(SUMMARY_STREAM, summary.SerializeToString(), maxlen=self.settings.maxlen)
        observability.CLUSTER_POWER.labels(region=self.settings.region, cluster=self.state.cluster).set(
            summary.power_watts)
        return summary

    def run(self, stop: threading.Event) -> None:
        def step() -> None:
            self.publish_once()
            stop.wait(self.settings.interval_s)

        def say(exc: Exception, delay: float) -> None:
            log.warning("cluster %s: summary not published (%s); retrying in %.1f s", self.state.cluster, exc, delay)

        run_with_backoff(stop, step, delays=self.settings.backoff_s, on_failure=say)


class RegionalTelemetry:
    """A cluster's telemetry side, running: the consumer and the summary publisher, one thread each.

    What ``meridian regional-telemetry`` runs alone, and what ``meridian regional-scheduler`` embeds
    with its :class:`~regional_scheduler.service.RegionalScheduler` as ``scheduler``: then the reports'
    measurements (usage, power, carbon) go onto the scheduler's own cluster state, whose allocation
    comes from the API server, and the summaries are built from that state.
    """

    def __init__(self, *, settings: TelemetryConsumerSettings, summary: SummarySettings,
                 bus: StreamBus | None = None, scheduler: RegionalScheduler | None = None,
                 objects: DispatchedObjects | None = None) -> None:
        self.settings, self.summary_settings = settings, summary
        self._owns_bus = bus is None
        self.bus = bus if bus is not None else open_bus(settings.bus_url, key_prefix=settings.key_prefix)
        self.state = TelemetryState(cluster=settings.cluster, stale_after_s=settings.stale_after_s,
                                    max_nodes=settings.max_nodes,
                                    requests_from_reports=settings.requests_from_reports and scheduler is None)
        if scheduler is not None:
            scheduler.stale_after_s = settings.stale_after_s
        self.consumer = TelemetryConsumer(bus=self.bus, state=self.state, settings=settings,
                                          on_applied=scheduler.apply_telemetry if scheduler is not None else None)
        self.publisher = SummaryPublisher(bus=self.bus, state=scheduler if scheduler is not None else self.state,
                                          settings=summary, objects=objects)
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=worker.run, args=(self.stop,), name=name, daemon=True)
                        for name, worker in (("telemetry-consumer", self.consumer),
                                             ("summary-publisher", self.publisher))]

    def start(self) -> RegionalTelemetry:
        for thread in self.threads:
            thread.start()
        return self

    def close(self, timeout_s: float = 10.0) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=timeout_s)
        if self._owns_bus:
            self.bus.close()
