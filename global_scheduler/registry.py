"""The cluster registry: the global tier's view of every cluster, built from ``ClusterSummary``.

Summaries arrive on ``meridian:summary`` (newest per cluster wins, by sequence and time). A cluster
whose summaries stop for ``cluster_timeout_s`` is marked down; the scheduler then reroutes its
workloads. Silence is judged only on time the bus was readable: while the scheduler cannot read the
bus (:meth:`ClusterRegistry.bus_unreachable`) no cluster is judged, and once it can again
(:meth:`ClusterRegistry.bus_readable`) every cluster gets a whole timeout to be heard from, since its
summaries of the outage were never written. A Redis restart is not a cluster outage. The timeout is
also never shorter than twice the interval a cluster's summaries actually arrive at (measured from
their generation times), so a timeout set at or below the regional summary interval cannot make a
healthy cluster flap. A cluster down and silent for ``forget_after_s`` (``registry.forget_after_s``,
an hour by default) leaves the registry, and its region with it when no other cluster reports from there,
so a decommissioned cluster is not listed or waited for forever. Between summaries the router *reserves* what it dispatched so a burst of submissions does
not all land on the cluster that looked emptiest at the last summary; a newer summary (which already
counts those placements) clears the reservations made before it was generated.
:meth:`ClusterRegistry.holdings_view` gives the scheduler's reconciliation what a cluster's latest summary
says it holds.

Regions and clusters come from the federation configuration when one is given (``registry.config_file``,
:mod:`global_scheduler.federation_config`; :meth:`ClusterRegistry.from_settings`): its regions are the
configured regions, round trips between regions come from its locations (:mod:`meridian.regions`) with its
link overrides winning, its PUE (where given) is the region's PUE, and a cluster's region is the one the file
gives it. A summary from a cluster the file places in another region is applied in the file's region (logged
once as an error); a summary from a cluster the file does not list is ignored (logged once, counted in
``meridian_registry_unconfigured_summaries_total``): the file is the source of truth, and a cluster is added by
adding it there. Without a file, regions are ``registry.regions`` and those the summaries name, and every round
trip between two regions is ``default_rtt_ms``.

A summary with ``carbon_unknown`` (no node reports a carbon source) is listed with its intensity
unknown (``Cluster.carbon_unknown``), is not recorded in the carbon history, and routes as the mean
intensity of the clusters that know theirs, neither the cleanest grid (0) nor the dirtiest.

:meth:`ClusterRegistry.features` gives the routing snapshot as
:class:`meridian.routing_domain.ClusterFeatures`, vectorised over clusters.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from global_scheduler.carbon_history import HourlyCarbonHistory
from global_scheduler.federation_config import FederationConfig, FederationConfigError, load_federation_config
from meridian import observability as obs
from meridian.regions import Location, bandwidth_gbps_for_km, haversine_km, rtt_ms_for_km
from meridian.routing_domain import ClusterFeatures
from meridian.telemetry import MAX_NODE_MEMORY_BYTES, MAX_NODE_MILLI_CPU
from protos import global_api_pb2 as api
from protos import telemetry_pb2 as tpb

if TYPE_CHECKING:
    from global_scheduler.settings import RegistrySettings

FORECAST_HOURS = 24
log = logging.getLogger(__name__)
UNCONFIGURED_SUMMARIES = obs.counter(
    "meridian_registry_unconfigured_summaries_total", "Cluster summaries ignored because the federation "
    "configuration (registry.config_file) does not list their cluster.")
REGION_MISMATCHES = obs.counter(
    "meridian_registry_region_mismatches_total", "Cluster summaries naming another region than the federation "
    "configuration gives their cluster (applied in the configured region).")
_WARN_ONCE_MAX = 10_000  # clusters (or cluster, region pairs) remembered as already logged


@dataclass
class ClusterRecord:
    name: str
    region: str
    summary: tpb.ClusterSummary
    last_seen_s: float
    ready: bool = True
    reserved: np.ndarray = field(default_factory=lambda: np.zeros(3))  # milli-CPU, bytes, GPUs
    max_node_alloc_cpu: float = 0.0  # largest single-node free CPU ever seen (≈ largest node)
    max_node_alloc_mem: float = 0.0
    queued: int = 0
    interval_s: float = 0.0  # measured period of its summaries (moving average); 0 until two arrived


class Fit(enum.Enum):
    """Whether a workload can run on the federation (:meth:`ClusterRegistry.fit_outlook`)."""

    NOW = "now"  # a reporting cluster could hold it (were it empty)
    LATER = "later"  # no reporting cluster can, but a cluster may yet report from a region it allows
    NEVER = "never"  # nowhere it may run, now or later


@dataclass(frozen=True)
class FitOutlook:
    fit: Fit
    reason: str = ""  # why not NOW, for the workload's message
    waiting_for: tuple[str, ...] = ()  # LATER: the regions a cluster that could hold it may report from


@dataclass(frozen=True)
class HoldingsView:
    """What a cluster's latest summary says it holds (for reconciliation)."""

    ready: bool
    generated_s: float  # when that summary was made (unix s)
    workloads: frozenset[str] | None  # every workload held there; None: the summary does not list them all


class ClusterRegistry:
    def __init__(self, *, cluster_timeout_s: float = 15.0, default_rtt_ms: float = 80.0,
                 prices_per_mwh: dict[str, float] | None = None, configured_regions: Sequence[str] = (),
                 forget_after_s: float = 3600.0, federation: FederationConfig | None = None) -> None:
        if federation is not None and configured_regions:
            raise ValueError("give configured_regions or a federation configuration, not both: the "
                             "configuration's regions are the configured ones")
        self.timeout_s = cluster_timeout_s
        self.forget_after_s = forget_after_s
        self.federation = federation
        self.configured_regions = federation.region_names if federation is not None else tuple(configured_regions)
        self._regions_setting = (f"registry.config_file {federation.source}" if federation is not None and
                                 federation.source else "the federation configuration" if federation is not None
                                 else "registry.regions")
        self._locations: dict[str, Location] = federation.locations() if federation is not None else {}
        self._links: dict[frozenset[str], float] = federation.link_overrides() if federation is not None else {}
        self._cluster_region: dict[str, str] | None = federation.cluster_regions() if federation is not None else None
        self._region_pue: dict[str, float] = {r.name: float(r.pue) for r in federation.regions
                                              if r.pue is not None} if federation is not None else {}
        self._warned: set[tuple[str, str]] = set()
        self.default_rtt_ms = default_rtt_ms
        self.prices = prices_per_mwh or {}
        self._lock = threading.Lock()
        self._clusters: dict[str, ClusterRecord] = {}
        self._regions: list[str] = []
        self.carbon_history = HourlyCarbonHistory()
        self._bus_down_since: float | None = None
        self._bus_back_s = float("-inf")

    @classmethod
    def from_settings(cls, settings: RegistrySettings) -> ClusterRegistry:
        """The registry ``settings`` (``GlobalSchedulerSettings.registry``) describe, with the federation file of
        ``registry.config_file`` read and checked (:class:`~global_scheduler.federation_config.FederationConfigError`
        when it cannot be used)."""
        if settings.config_file is not None and settings.regions:
            raise FederationConfigError(
                f"registry.regions ({', '.join(settings.regions)}) and registry.config_file ({settings.config_file}) "
                "are both set", hint="the configuration file lists the regions: unset MERIDIAN_GLOBAL_REGISTRY__REGIONS")
        federation = load_federation_config(settings.config_file) if settings.config_file is not None else None
        return cls(cluster_timeout_s=settings.cluster_timeout_s, forget_after_s=settings.forget_after_s,
                   default_rtt_ms=settings.default_rtt_ms, configured_regions=settings.regions,
                   federation=federation)

    def _region_for(self, summary: tpb.ClusterSummary) -> str | None:
        """The region a summary counts in: the configured one of its cluster (None: the configuration does not
        list it, ignore the summary), or, with no configuration, the one it names. Called under the lock."""
        if self._cluster_region is None:
            return summary.region
        region = self._cluster_region.get(summary.cluster)
        if region is None:
            UNCONFIGURED_SUMMARIES.inc()
            if self._warn_once(summary.cluster, ""):
                log.warning("summary from cluster %r ignored: %s does not list it (add it under clusters: to "
                            "route to it)", summary.cluster, self._regions_setting)
            return None
        if summary.region != region:
            REGION_MISMATCHES.inc()
            if self._warn_once(summary.cluster, summary.region):
                log.error("cluster %s reports region %r but %s puts it in %r: counted in %r (fix the cluster's "
                          "region setting or the configuration)", summary.cluster, summary.region,
                          self._regions_setting, region, region)
        return region

    def _warn_once(self, cluster: str, region: str) -> bool:
        key = (cluster, region)
        if key in self._warned or len(self._warned) >= _WARN_ONCE_MAX:
            return False
        self._warned.add(key)
        return True

    # ------------------------------------------------------------------ the bus itself
    def bus_unreachable(self, now_s: float) -> None:
        """The summary stream cannot be read: stop judging clusters until it can."""
        with self._lock:
            if self._bus_down_since is None:
                self._bus_down_since = now_s

    def bus_readable(self, now_s: float) -> None:
        """A read of the summary stream succeeded."""
        with self._lock:
            if self._bus_down_since is not None:
                self._bus_down_since = None
                self._bus_back_s = now_s

    def readable_since(self) -> float | None:
        """Since when the summary stream has been readable without a break (-inf: never lost); None while
        it cannot be read."""
        with self._lock:
            return None if self._bus_down_since is not None else self._bus_back_s

    def timeout_for(self, rec: ClusterRecord) -> float:
        return max(self.timeout_s, 2.0 * rec.interval_s)

    # ------------------------------------------------------------------ updates
    def apply(self, summary: tpb.ClusterSummary, now_s: float | None = None) -> bool:
        """Apply a summary; returns True if the cluster was down (or unknown) and is now up."""
        now_s = time.time() if now_s is None else now_s
        with self._lock:
            region = self._region_for(summary)
            if region is None:
                return False
            rec = self._clusters.get(summary.cluster)
            if rec is not None and summary.sequence and summary.sequence <= rec.summary.sequence and \
                    summary.generated_unix_ms <= rec.summary.generated_unix_ms:
                return False
            came_up = rec is None or not rec.ready
            if rec is not None and summary.generated_unix_ms > rec.summary.generated_unix_ms > 0:
                gap_s = (summary.generated_unix_ms - rec.summary.generated_unix_ms) / 1000.0
                rec.interval_s = gap_s if rec.interval_s == 0 else 0.8 * rec.interval_s + 0.2 * gap_s
            if rec is None:
                rec = ClusterRecord(summary.cluster, region, summary, now_s)
                self._clusters[summary.cluster] = rec
                if region not in self._regions:
                    self._regions.append(region)
            rec.summary = summary
            rec.region = region
            if not summary.carbon_unknown:
                self.carbon_history.observe(region, summary.generated_unix_ms / 1000.0 or now_s,
                                            summary.carbon_g_per_kwh)
            rec.last_seen_s = now_s
            rec.ready = summary.nodes_schedulable > 0
            rec.reserved = np.zeros(3)
            rec.max_node_alloc_cpu = max(rec.max_node_alloc_cpu, float(summary.max_node_free_milli_cpu))
            rec.max_node_alloc_mem = max(rec.max_node_alloc_mem, float(summary.max_node_free_memory_bytes))
            if region not in self._regions:
                self._regions.append(region)
            return came_up and rec.ready

    def sweep(self, now_s: float | None = None) -> list[str]:
        """Mark clusters without a recent summary down; returns the ones that just went down. Nothing is
        judged while the bus is unreachable, and silence counts from when it became readable again.

        A cluster already down (never in the sweep that marks it down, so its workloads are rerouted first)
        and silent for ``forget_after_s`` (at least its timeout) is forgotten: removed, with its region
        when no other cluster reports from there."""
        now_s = time.time() if now_s is None else now_s
        down, forgotten = [], []
        with self._lock:
            if self._bus_down_since is not None:
                return []
            for rec in self._clusters.values():
                heard_s = max(rec.last_seen_s, self._bus_back_s)
                if rec.ready and now_s - heard_s > self.timeout_for(rec):
                    rec.ready = False
                    down.append(rec.name)
                elif not rec.ready and now_s - heard_s > max(self.forget_after_s, self.timeout_for(rec)):
                    forgotten.append((rec.name, now_s - rec.last_seen_s))
            for name, silent_s in forgotten:
                region = self._clusters.pop(name).region
                if all(r.region != region for r in self._clusters.values()):
                    self._regions.remove(region)
                log.info("cluster %s forgotten: silent for %.0f s (registry.forget_after_s %.0f s)", name,
                         silent_s, self.forget_after_s)
        return down

    def reserve(self, cluster: str, milli_cpu: float, memory_bytes: float, gpu: float) -> None:
        with self._lock:
            rec = self._clusters.get(cluster)
            if rec is not None:
                rec.reserved += (milli_cpu, memory_bytes, gpu)

    # ------------------------------------------------------------------ views
    def names(self) -> list[str]:
        with self._lock:
            return list(self._clusters)

    def region_of(self, cluster: str) -> str | None:
        with self._lock:
            rec = self._clusters.get(cluster)
            return rec.region if rec else None

    def regions(self) -> list[str]:
        with self._lock:
            return list(self._regions)

    def known_regions(self) -> list[str]:
        """Regions a request may name: the configured ones and any a cluster has reported from."""
        with self._lock:
            return list(dict.fromkeys((*self.configured_regions, *self._regions)))

    def is_ready(self, cluster: str) -> bool:
        with self._lock:
            rec = self._clusters.get(cluster)
            return bool(rec and rec.ready)

    def holdings_view(self, cluster: str) -> HoldingsView | None:
        """None for a cluster never heard of."""
        with self._lock:
            rec = self._clusters.get(cluster)
            if rec is None:
                return None
            s = rec.summary
            held = frozenset(h.workload for h in s.holdings) if s.holdings_complete else None
            return HoldingsView(rec.ready, s.generated_unix_ms / 1000.0 if s.generated_unix_ms else rec.last_seen_s,
                                held)

    def rtt_matrix(self, regions: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Round trip (ms) and bandwidth (Gb/s) between each pair of ``regions``: a configured link's round trip
        where one is given, else from the configured locations (:mod:`meridian.regions`), else
        ``default_rtt_ms`` and 40 Gb/s; 2 ms and 100 Gb/s inside a region."""
        n = len(regions)
        rtt = np.full((n, n), self.default_rtt_ms)
        bw = np.full((n, n), 40.0)
        for i, a in enumerate(regions):
            for j, b in enumerate(regions):
                if i == j:
                    rtt[i, j], bw[i, j] = rtt_ms_for_km(0.0), bandwidth_gbps_for_km(0.0)
                    continue
                where_a, where_b = self._locations.get(a), self._locations.get(b)
                if where_a is not None and where_b is not None:
                    km = haversine_km(where_a, where_b)
                    rtt[i, j], bw[i, j] = rtt_ms_for_km(km), bandwidth_gbps_for_km(km)
                override = self._links.get(frozenset((a, b)))
                if override is not None:
                    rtt[i, j] = override
        return rtt, bw

    def fit_outlook(self, *, replicas: int, milli_cpu: int, memory_bytes: int, gpu: float,
                    allowed_regions: set[str] | None) -> FitOutlook:
        """Whether this workload (``replicas`` of the given per-replica requests) can ever run: the one rule
        that SubmitWorkload (refuse) and the router (FAILED or PENDING) both apply.

        * ``NOW``: a reporting cluster in an allowed region (any region when none are given) could hold it,
          were it empty. Clusters that are down count: they may come back.
        * ``NEVER``: a replica is larger than any node a report may describe (:mod:`meridian.telemetry`'s
          physical limits), known clusters or not; or no reporting cluster can hold it and no region it may
          use can still gain a cluster.
        * ``LATER``: no reporting cluster can hold it, but a region it may use has no reporting cluster yet,
          and one there could. With configured regions (``registry.regions``, or the regions of
          ``registry.config_file``) those are the configured
          regions it allows that no cluster reports from. With none configured, nothing bounds where a
          cluster may appear, so every allowed region that no cluster reports from counts (and, with no
          allowed regions, only the case where no cluster has reported at all).

        An allowed region without a reporting cluster is waited for whichever other clusters happen to
        report: a workload accepted before the first report is not failed because the first cluster to
        report is in another region."""
        if milli_cpu > MAX_NODE_MILLI_CPU or memory_bytes > MAX_NODE_MEMORY_BYTES:
            return FitOutlook(Fit.NEVER, "a replica asks for more than any node can have")
        with self._lock:
            records = list(self._clusters.values())
        reporting = {rec.region for rec in records}
        candidates = [rec for rec in records if not allowed_regions or rec.region in allowed_regions]
        for rec in candidates:
            a = rec.summary.allocatable
            if replicas * milli_cpu <= a.milli_cpu and replicas * memory_bytes <= a.memory_bytes and \
                    replicas * gpu <= a.gpu + 1e-9 and milli_cpu <= max(rec.max_node_alloc_cpu, 1) and \
                    memory_bytes <= max(rec.max_node_alloc_mem, 1):
                return FitOutlook(Fit.NOW)
        if self.configured_regions:
            may_come = [r for r in self.configured_regions if not allowed_regions or r in allowed_regions]
        elif allowed_regions:
            may_come = sorted(allowed_regions)
        elif not records:
            return FitOutlook(Fit.LATER, "no cluster has reported yet")
        else:
            may_come = []
        waiting = tuple(r for r in may_come if r not in reporting)
        where = f" in {', '.join(sorted(allowed_regions))}" if allowed_regions else ""
        held = f"none of the {len(candidates)} reporting cluster(s){where} can hold it, even empty"
        if waiting:
            regions = ", ".join(waiting)
            return FitOutlook(Fit.LATER, f"{held}; a cluster in {regions}, where none reports yet, may" if candidates
                              else f"no cluster in {regions} has reported yet (one there may hold it)", waiting)
        if candidates:
            return FitOutlook(Fit.NEVER, held)
        return FitOutlook(Fit.NEVER, f"no cluster{where} reports, and none of those regions is configured "
                          f"({self._regions_setting}: {', '.join(self.configured_regions)})")

    def ever_fits(self, *, replicas: int, milli_cpu: int, memory_bytes: int, gpu: float,
                  allowed_regions: set[str] | None) -> bool | None:
        """:meth:`fit_outlook` as True (a reporting cluster could hold it), False (never) or None (not a
        reporting cluster, but one may yet come that could)."""
        fit = self.fit_outlook(replicas=replicas, milli_cpu=milli_cpu, memory_bytes=memory_bytes, gpu=gpu,
                               allowed_regions=allowed_regions).fit
        return {Fit.NOW: True, Fit.NEVER: False, Fit.LATER: None}[fit]

    def features(self, now_s: float | None = None) -> tuple[list[str], list[str], ClusterFeatures]:
        """(cluster names, region names, features) for routing, vectorised over clusters."""
        with self._lock:
            records = list(self._clusters.values())
            regions = list(self._regions)
        n = len(records)
        region_index = np.array([regions.index(r.region) for r in records], dtype=np.int64)
        s = [r.summary for r in records]
        reserved = np.array([r.reserved for r in records]).reshape(n, 3)
        f = np.array([[x.free.milli_cpu, x.free.memory_bytes, x.gpu_devices_idle] for x in s],
                     dtype=np.float64).reshape(n, 3) - reserved
        alloc = np.array([[x.allocatable.milli_cpu, x.allocatable.memory_bytes, x.allocatable.gpu] for x in s],
                         dtype=np.float64).reshape(n, 3)
        carbon = np.array([x.carbon_g_per_kwh for x in s], dtype=np.float64)
        unknown = np.array([x.carbon_unknown for x in s], dtype=bool)
        if unknown.any() and not unknown.all():  # neutral, not the cleanest grid (module docstring)
            carbon[unknown] = carbon[~unknown].mean()
        rtt, bw = self.rtt_matrix(regions)
        # One forecast per region (the region's current intensity where a day-old hour is missing).
        region_now = np.zeros(len(regions))
        region_now[region_index] = carbon
        forecast = self.carbon_history.day_ahead(regions, time.time() if now_s is None else now_s, region_now,
                                                 FORECAST_HOURS)[region_index].reshape(n, FORECAST_HOURS)
        return [r.name for r in records], regions, ClusterFeatures(
            region_index=region_index, alloc_milli_cpu=alloc[:, 0], alloc_memory_bytes=alloc[:, 1],
            alloc_gpu=alloc[:, 2], free_milli_cpu=np.maximum(f[:, 0], 0), free_memory_bytes=np.maximum(f[:, 1], 0),
            free_gpu=np.maximum(f[:, 2], 0),
            max_node_free_milli_cpu=np.array([x.max_node_free_milli_cpu for x in s], dtype=np.float64),
            max_node_free_memory_bytes=np.array([x.max_node_free_memory_bytes for x in s], dtype=np.float64),
            fragmentation=np.array([x.fragmentation_score / 100.0 for x in s], dtype=np.float64),
            carbon_now=carbon, carbon_forecast=forecast.mean(axis=1), carbon_forecast_hourly=forecast,
            price_per_mwh=np.array([self.prices.get(r.region, 0.0) for r in records], dtype=np.float64),
            pue=np.array([self._region_pue.get(r.region, x.pue if x.pue >= 1 else 1.0)
                          for r, x in zip(records, s, strict=True)], dtype=np.float64),
            queue_length=np.array([r.queued for r in records], dtype=np.float64),
            slo_violation_rate=np.zeros(n), ready=np.array([r.ready for r in records], dtype=bool),
            rtt_ms=rtt, bandwidth_gbps=bw)

    def cluster_messages(self) -> list[api.Cluster]:
        with self._lock:
            records = list(self._clusters.values())
        out = []
        for r in records:
            s = r.summary
            out.append(api.Cluster(
                name=r.name, region=r.region, ready=r.ready, last_seen_unix_s=r.last_seen_s,
                allocatable_milli_cpu=s.allocatable.milli_cpu, free_milli_cpu=s.free.milli_cpu,
                allocatable_memory_bytes=s.allocatable.memory_bytes, free_memory_bytes=s.free.memory_bytes,
                gpus=s.allocatable.gpu, free_gpus=s.gpu_devices_idle, nodes=s.nodes_total,
                carbon_g_per_kwh=s.carbon_g_per_kwh, carbon_unknown=s.carbon_unknown,
                price_per_mwh=self.prices.get(r.region, 0.0), queued_workloads=r.queued))
        return out
