"""Federation simulator: several clusters in several regions, real carbon and prices, real workloads.

What is real and what is assumed (every assumption is a documented field of :class:`FederationConfig`):

* **Clusters** are built from the openb node list (``alibaba-gpu-v2023``): each cluster is a seeded
  sample of real node shapes; the federation's size is scaled so the workload window loads it to
  about ``target_peak_utilisation`` when spread evenly.
* **Carbon** is the real hourly series of each region's zone (:mod:`meridian.grid_data`), each zone
  from its own year (Electricity Maps 2021-2023, Let's Wait Awhile 2020): the simulated window is a
  calendar window (month, day, hour) and each region reads its series at that calendar time.
* **Prices** are the real ENTSO-E day-ahead prices (1-10 Dec 2022, the only ones shared), tiled over
  the window by hour; regions outside the ENTSO-E area use a documented proxy area.
* **Workloads** come from the DLRM trace (``alibaba-dlrm-v2025``): instances of one ``app_name``
  created in the same hour form one workload whose replicas are those instances; ``app_name`` is the
  tenant; arrival and lifetime are the trace's. The trace's requests (vCPU, GiB) are scaled by
  ``request_scale`` so instances fit openb nodes. The trace has no origin, latency SLO or deadline,
  so those are assigned per tenant from a hash of the tenant name (stable across runs): a share of
  tenants run deferrable batch work with a deadline, the others latency-sensitive services with an
  SLO from their origin region.
* **Latency**: round trip between regions from their great-circle distance (``2 + km / 66`` ms, i.e.
  fibre at 2/3 c with 1.5× route inflation) plus an M/M/1 response time ``service_ms / (1 − ρ)`` at
  the cluster's dominant-resource utilisation ρ. A latency-sensitive workload violates its SLO if,
  in any hour it runs, that sum exceeds its SLO.
* **Power**: the node agents' documented model, :mod:`meridian.power_model` (the same one the live
  simulated clusters of ``regional_scheduler.dispatch_worker`` use): the host profile of the node's
  vCPU count on Fan et al.'s curve at its requested-CPU utilisation, plus each GPU board's power from
  its openb model (a GPU held by a pod at full board power, a free one at idle). An empty node draws
  0 W when ``power_off_empty_nodes`` (default): the cluster autoscaler consolidates and powers it off,
  so where work is routed decides which nodes are on. Energy is hourly; carbon = energy × PUE × the
  hour's intensity; cost = energy × PUE × the hour's price.

Time advances in one-hour intervals (the carbon series' resolution). Arrivals of an hour are routed
in arrival order; deferred and unplaceable workloads are retried every hour. A workload that cannot
be placed within ``max_pending_hours`` (latency-sensitive) or by its deadline (deferrable) fails.
"""

from __future__ import annotations

import csv
import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

from global_scheduler.routing.base import DEFER, NO_CLUSTER, Router, RoutingPolicy
from meridian import grid_data
from meridian.power_model import NodePowerModel
from meridian.regions import Region, bandwidth_gbps_for_km, haversine_km, rtt_ms_for_km
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures, crit_utilisation, latency_ms
from meridian.traces import missing_trace, openb

GIB = 2**30


# Train and evaluation regions of the benchmark (the live scheduler reads its regions from its federation
# configuration, docs/federation-config.md). GB and BR are never seen in training.
REGIONS: dict[str, Region] = {
    "eu-north": Region("eu-north", "NO", 2023, "NO1", 1.10, 59.91, 10.75),
    "eu-central": Region("eu-central", "DE", 2020, "DE-LU", 1.30, 50.11, 8.68),
    "eu-west": Region("eu-west", "FR", 2020, "FR", 1.25, 48.86, 2.35),
    "us-west": Region("us-west", "US-CAL-CISO", 2023, "NL", 1.20, 37.34, -121.89),  # NL prices as proxy
    "uk-south": Region("uk-south", "GB", 2020, "IE(SEM)", 1.30, 51.51, -0.13),  # GB publishes none here
    "sa-east": Region("sa-east", "BR", 2023, "PT", 1.40, -23.55, -46.63),  # PT prices as proxy
}
TRAIN_REGIONS = ("eu-north", "eu-central", "eu-west", "us-west")
EVAL_REGIONS = ("eu-north", "eu-central", "eu-west", "us-west", "uk-south", "sa-east")


@dataclass
class FederationConfig:
    """One simulated run. Units are in the names; defaults explained inline."""

    regions: tuple[str, ...] = EVAL_REGIONS
    region_years: dict[str, int] = field(default_factory=dict)  # override Region.carbon_year per region
    clusters: int = 12
    start: str = "12-01"  # calendar month-day of the window start (00:00 UTC)
    days: int = 7
    trace_offset_days: float = 23.0  # DLRM trace day mapped to the window start (eval: the trace's last week)
    seed: int = 0
    target_peak_utilisation: float = 0.55  # federation sized so an even spread peaks here
    request_scale: float = 0.25  # DLRM vCPU/GiB × this (a 64 vCPU / 320 GiB instance → 16 / 80)
    batch_tenant_share: float = 0.4  # tenants whose work is deferrable batch
    deadline_hours: tuple[int, int] = (6, 24)  # deferrable: latest start after arrival, per tenant
    slo_choices_ms: tuple[float, ...] = (40.0, 80.0, 250.0)  # latency SLOs of latency-sensitive tenants
    residency_share: float = 0.2  # tenants restricted to their origin's continent
    max_pending_hours: int = 2  # latency-sensitive work not placed by then fails
    service_ms: float = 5.0  # mean per-request service time for the M/M/1 latency estimate
    # Node power is meridian.power_model's (host profile by vCPUs, GPU board by model). An empty node
    # draws 0 W: the cluster autoscaler powers it off, so routing work elsewhere saves a node's idle draw.
    power_off_empty_nodes: bool = True
    weights_latency_sensitive: tuple[float, float, float, float] = (0.7, 0.05, 0.15, 0.1)  # perf, cost, energy, fair
    weights_batch: tuple[float, float, float, float] = (0.1, 0.1, 0.7, 0.1)
    forecast_hours: int = 24
    max_reroutes: int = 3  # a cluster that cannot bind all replicas is excluded and the workload rerouted
    drain_hours: int = 48  # accounted hours after the last arrival: the longest deadline (24 h) plus a day


@dataclass
class TraceWorkload:
    id: int
    tenant: str
    arrival_h: float
    duration_h: float
    replicas: int
    milli_cpu: int
    memory_bytes: int
    gpu: int


@dataclass
class IntervalRecord:
    """What the accounting hook receives for each cluster and hour."""

    start: datetime
    seconds: float
    cluster: str
    region: str
    power_watts: float
    energy_kwh: float  # facility energy (× PUE)
    carbon_kg: float
    cost: float  # EUR
    carbon_g_per_kwh: float
    price_per_mwh: float
    tenants_energy_kwh: dict[str, float] = field(default_factory=dict)


@dataclass
class RunResult:
    policy: str
    energy_kwh: float
    carbon_kg: float
    cost: float
    slo_violations: int
    failures: int
    deadline_misses: int
    jain_fairness: float
    decision_ms_p50: float
    decision_ms_p99: float
    workloads: int
    placed: int
    deferred_decisions: int
    mean_utilisation: float
    workload_hours: float = 0.0  # replica-hours actually run (a policy that fails work emits less for less)

    @property
    def carbon_g_per_kwh(self) -> float:
        """Average intensity of the energy used: carbon per unit of energy, whatever the amount of work."""
        return 1000.0 * self.carbon_kg / self.energy_kwh if self.energy_kwh else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "carbon_g_per_kwh": self.carbon_g_per_kwh}


# ---------------------------------------------------------------------------------------------- data
def _hash_unit(text: str) -> float:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") / 2**64


def rtt_matrix(regions: list[Region]) -> tuple[np.ndarray, np.ndarray]:
    n = len(regions)
    rtt = np.zeros((n, n))
    bw = np.zeros((n, n))
    for i, a in enumerate(regions):
        for j, b in enumerate(regions):
            km = haversine_km(a, b)
            rtt[i, j] = rtt_ms_for_km(km)
            bw[i, j] = bandwidth_gbps_for_km(km)
    return rtt, bw


@lru_cache(maxsize=4)
def load_dlrm(path: str) -> tuple[TraceWorkload, ...]:
    """DLRM instances grouped into workloads by (app_name, creation hour); pre-existing ones skipped."""
    groups: dict[tuple[str, int], list[tuple[float, float, float, float, int]]] = {}
    trace_end_s = 0.0
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            if row["deletion_time"]:
                trace_end_s = max(trace_end_s, float(row["deletion_time"]))
            if not row["creation_time"]:
                continue
            created = float(row["creation_time"])
            deleted = float(row["deletion_time"]) if row["deletion_time"] else math.inf
            groups.setdefault((row["app_name"], int(created // 3600)), []).append(
                (created, deleted, float(row["cpu_request"]), float(row["memory_request"]), int(row["gpu_request"])))
    workloads = []
    for (app, _hour), members in sorted(groups.items(), key=lambda kv: min(m[0] for m in kv[1])):
        created = min(m[0] for m in members)
        lifetimes = [min(m[1], trace_end_s) - m[0] for m in members]
        workloads.append(TraceWorkload(
            id=len(workloads), tenant=app, arrival_h=created / 3600.0,
            duration_h=max(float(np.median(lifetimes)) / 3600.0, 1 / 60),
            replicas=min(len(members), 32),
            milli_cpu=int(max(m[2] for m in members) * 1000), memory_bytes=int(max(m[3] for m in members) * GIB),
            gpu=max(m[4] for m in members)))
    return tuple(workloads)


# The files of the traces folder a federation reads (with carbon/ and prices/ unless given apart).
DLRM_TRACE = "alibaba-dlrm-v2025/disaggregated_DLRM_trace.csv"
NODE_LIST = "alibaba-gpu-v2023/openb_node_list_all_node.csv"


@dataclass
class GridInputs:
    carbon: dict[str, grid_data.HourlySeries]
    prices: dict[str, grid_data.HourlySeries]


@lru_cache(maxsize=4)
def _load_grid_cached(carbon_dir: str, prices_file: str) -> GridInputs:
    return GridInputs(grid_data.load_carbon_dir(carbon_dir), grid_data.load_entsoe_prices(prices_file))


def load_grid(traces_dir: Path, carbon_dir: Path | None = None, prices_file: Path | None = None) -> GridInputs:
    """Carbon and prices: the given folder and file, else the traces folder's ``carbon/`` and ``prices/*.csv``."""
    if carbon_dir is None:
        carbon_dir = traces_dir / "carbon"
        if not carbon_dir.is_dir():
            raise missing_trace(traces_dir, "carbon/")
    if prices_file is None:
        prices_file = next(iter(sorted((traces_dir / "prices").glob("*.csv"))), None)
        if prices_file is None:
            raise missing_trace(traces_dir, "prices/*.csv")
    return _load_grid_cached(str(carbon_dir), str(prices_file))


# ---------------------------------------------------------------------------------------------- sim
@dataclass
class _Pending:
    w: TraceWorkload
    arrival_h: int
    deadline_h: float  # deferrable: latest start (hour index); else arrival + max_pending
    deferrable: bool
    origin: int
    slo_ms: float
    allowed: np.ndarray | None
    weights: tuple[float, float, float, float]


@dataclass
class _RunTally:
    """What one ``FederationSim.run`` counts as it goes: per tenant, the finished workloads (``total``) and
    those without a violation or late start (``good``); per workload, whether its outcome is already bad."""

    good: np.ndarray
    total: np.ndarray
    outcome_bad: dict[int, bool] = field(default_factory=dict)
    failures: int = 0
    deadline_misses: int = 0
    slo_violations: int = 0
    deferred_decisions: int = 0
    decision_s: list[float] = field(default_factory=list)
    energy: float = 0.0
    carbon: float = 0.0
    cost: float = 0.0
    util_acc: float = 0.0
    replica_hours: float = 0.0


class FederationSim:
    """One run of one routing policy over one window. ``run`` returns a :class:`RunResult`."""

    def __init__(self, config: FederationConfig, traces_dir: Path, *, carbon_dir: Path | None = None,
                 prices_file: Path | None = None) -> None:
        self.cfg = config
        self.regions = [REGIONS[r] for r in config.regions]
        self.n_regions = len(self.regions)
        self.rtt, self.bw = rtt_matrix(self.regions)
        grid = load_grid(traces_dir, carbon_dir, prices_file)
        for relative in (DLRM_TRACE, NODE_LIST):  # before minutes of work, not at their first read
            if not (traces_dir / relative).is_file():
                raise missing_trace(traces_dir, relative)
        self.hours = config.days * 24
        horizon = self.hours + config.drain_hours + config.forecast_hours + 48
        month, day = (int(x) for x in config.start.split("-"))
        # Regions read their own years; records are stamped with the latest of them (the evaluation year).
        self.window_start = datetime(max(config.region_years.get(r.name, r.carbon_year) for r in self.regions),
                                     month, day, tzinfo=UTC)
        self.carbon = np.zeros((self.n_regions, horizon))
        self.price = np.zeros((self.n_regions, horizon))
        for i, r in enumerate(self.regions):
            series = grid.carbon.get(r.carbon_zone)
            if series is None:
                raise KeyError(f"no carbon series for zone {r.carbon_zone!r} (region {r.name}); have {sorted(grid.carbon)}")
            year = config.region_years.get(r.name, r.carbon_year)
            start = datetime(year, month, day, tzinfo=UTC)
            # Read what the zone's series has; wrap within it for windows that run past its end.
            i0 = series.index_of(start)
            idx = (i0 + np.arange(horizon)) % len(series)
            self.carbon[i] = series.values[idx]
            p = grid.prices.get(r.price_area)
            if p is None:
                raise KeyError(f"no price series for area {r.price_area!r}")
            # Windows start at 00:00 UTC; the price file's index 1 is 00:00 UTC on 1 Dec (index 0 is 23:00
            # the day before), so tiling from index 1 keeps prices aligned with the hour of day.
            p_idx = np.arange(horizon) % (len(p) - 1) + 1
            self.price[i] = p.values[p_idx]
        self._build_workloads(traces_dir)
        self._build_clusters(traces_dir)

    # --------------------------------------------------------------------------------- construction
    def _build_workloads(self, traces_dir: Path) -> None:
        cfg = self.cfg
        trace = load_dlrm(str(traces_dir / DLRM_TRACE))
        t0 = cfg.trace_offset_days * 24
        chosen = [w for w in trace if t0 <= w.arrival_h < t0 + self.hours]
        self.workloads: list[_Pending] = []
        eu = np.array([r.lat > 35 and -15 < r.lon < 35 for r in self.regions])
        for w in chosen:
            scaled = TraceWorkload(w.id, w.tenant, w.arrival_h - t0, w.duration_h, w.replicas,
                                   int(w.milli_cpu * cfg.request_scale), int(w.memory_bytes * cfg.request_scale), w.gpu)
            u = _hash_unit(w.tenant)
            origin = int(_hash_unit(w.tenant + "/origin") * self.n_regions)
            batch = _hash_unit(w.tenant + "/class") < cfg.batch_tenant_share
            allowed = None
            if _hash_unit(w.tenant + "/residency") < cfg.residency_share:
                allowed = eu.copy() if eu[origin] else (np.arange(self.n_regions) == origin)
            arrival = int(scaled.arrival_h)
            if batch:
                lo, hi = cfg.deadline_hours
                deadline = arrival + lo + int(u * (hi - lo + 1))
                self.workloads.append(_Pending(scaled, arrival, float(deadline), True, origin, 0.0, allowed,
                                               cfg.weights_batch))
            else:
                slo = cfg.slo_choices_ms[int(u * len(cfg.slo_choices_ms)) % len(cfg.slo_choices_ms)]
                self.workloads.append(_Pending(scaled, arrival, float(arrival + cfg.max_pending_hours), False, origin,
                                               slo, allowed, cfg.weights_latency_sensitive))
        self.tenants = sorted({p.w.tenant for p in self.workloads})
        self.tenant_index = {t: i for i, t in enumerate(self.tenants)}

    def _build_clusters(self, traces_dir: Path) -> None:
        cfg = self.cfg
        rng = np.random.default_rng(cfg.seed)
        node_list = str(traces_dir / NODE_LIST)
        nodes = openb.load_node_shapes(node_list)
        shapes = nodes.alloc
        # Peak concurrent CPU demand over the window → nodes needed at the target utilisation.
        events = []
        for p in self.workloads:
            need = p.w.replicas * p.w.milli_cpu
            events.append((p.arrival_h, need))
            events.append((p.arrival_h + max(1, math.ceil(p.w.duration_h)), -need))
        events.sort()
        level = peak = 0
        for _, d in events:
            level += d
            peak = max(peak, level)
        mean_cpu = float(shapes[:, 0].mean())
        total_nodes = max(cfg.clusters * 4, math.ceil(peak / cfg.target_peak_utilisation / mean_cpu))
        per_cluster = math.ceil(total_nodes / cfg.clusters)
        self.cluster_region = np.array([i % self.n_regions for i in range(cfg.clusters)], dtype=np.int64)
        self.cluster_names = [f"{self.regions[r].name}-{i // self.n_regions + 1}" for i, r in
                              enumerate(self.cluster_region)]
        picks = rng.integers(0, len(shapes), size=cfg.clusters * per_cluster)
        models = np.array(nodes.gpu_model)
        self.set_nodes(shapes[picks].astype(np.int64), models[picks].tolist())

    def set_nodes(self, alloc: np.ndarray, gpu_models: list[str]) -> None:
        """Install the federation's nodes ((N, 3) allocatable, GPU model per node), ``N / clusters`` per
        cluster in cluster order, and look up their power coefficients once."""
        if len(alloc) % self.cfg.clusters or len(gpu_models) != len(alloc):
            raise ValueError(f"{len(alloc)} nodes / {len(gpu_models)} GPU models for {self.cfg.clusters} clusters")
        self.node_alloc = np.asarray(alloc, dtype=np.int64)  # (N, 3)
        self.per_cluster = len(alloc) // self.cfg.clusters
        self.node_cluster = np.repeat(np.arange(self.cfg.clusters), self.per_cluster)
        self.node_power = NodePowerModel.for_nodes(self.node_alloc, gpu_models)

    # --------------------------------------------------------------------------------- state views
    def _reset_state(self) -> None:
        self.outcome_bad: dict[int, bool] = {}
        self.node_used = np.zeros_like(self.node_alloc)
        n = self.cfg.clusters
        self.c_alloc = self.node_alloc.reshape(n, self.per_cluster, 3).sum(axis=1).astype(np.float64)
        self.running: list[dict[str, Any]] = []
        self.queue_len = np.zeros(n)
        self.viol_recent = np.zeros(n)

    def _cluster_used(self) -> np.ndarray:
        # Nodes of a cluster are contiguous and equal in number, so a reshape sums them.
        return self.node_used.reshape(self.cfg.clusters, self.per_cluster, 3).sum(axis=1).astype(np.float64)

    def _features(self, hour: int) -> ClusterFeatures:
        used = self._cluster_used()
        free_nodes = self.node_alloc - self.node_used
        n = self.cfg.clusters
        per_node = free_nodes.reshape(n, self.per_cluster, 3)
        max_cpu = per_node[:, :, 0].max(axis=1).astype(np.float64)
        max_mem = per_node[:, :, 1].max(axis=1).astype(np.float64)
        free = self.c_alloc - used
        # Fragmentation: free CPU on nodes whose free memory is under 10 % of a node's (stranded).
        stranded = np.where(free_nodes[:, 1] < 0.1 * self.node_alloc[:, 1], free_nodes[:, 0], 0)
        stranded = stranded.reshape(n, self.per_cluster).sum(axis=1).astype(np.float64)
        frag = np.divide(stranded, free[:, 0], out=np.zeros(n), where=free[:, 0] > 0)
        reg = self.cluster_region
        h = hour
        fc_hours = self.cfg.forecast_hours
        # Day-ahead forecast = the same hours one day earlier (seasonal naive): no future data leaks.
        fc_idx = h + np.arange(fc_hours) - 24
        fc = np.where(fc_idx[None, :] >= 0, self.carbon[reg][:, np.maximum(fc_idx, 0)], self.carbon[reg, h][:, None])
        return ClusterFeatures(
            region_index=reg, alloc_milli_cpu=self.c_alloc[:, 0], alloc_memory_bytes=self.c_alloc[:, 1],
            alloc_gpu=self.c_alloc[:, 2], free_milli_cpu=free[:, 0], free_memory_bytes=free[:, 1], free_gpu=free[:, 2],
            max_node_free_milli_cpu=max_cpu, max_node_free_memory_bytes=max_mem, fragmentation=frag,
            carbon_now=self.carbon[reg, h], carbon_forecast=fc.mean(axis=1), carbon_forecast_hourly=fc,
            price_per_mwh=self.price[reg, h], pue=np.array([self.regions[r].pue for r in reg]),
            queue_length=self.queue_len.copy(), slo_violation_rate=self.viol_recent.copy(),
            ready=np.ones(n, dtype=bool), rtt_ms=self.rtt, bandwidth_gbps=self.bw, service_ms=self.cfg.service_ms,
            tightest_slo_utilisation=self._slo_ceiling())

    def _slo_ceiling(self) -> np.ndarray:
        ceiling = np.ones(self.cfg.clusters)
        ls = [r for r in self.running if r["slo"] > 0 and not self.outcome_bad.get(r["id"], False)]
        if ls:
            clusters = np.array([r["cluster"] for r in ls])
            rtt = np.array([self.rtt[r["origin"], self.cluster_region[r["cluster"]]] for r in ls])
            crit = crit_utilisation(rtt, np.array([r["slo"] for r in ls]), self.cfg.service_ms)
            np.minimum.at(ceiling, clusters, crit)
        return ceiling

    def workload_features(self, p: _Pending, hour: int, satisfaction: float) -> WorkloadFeatures:
        return WorkloadFeatures(
            replicas=p.w.replicas, milli_cpu=float(p.w.milli_cpu), memory_bytes=float(p.w.memory_bytes),
            gpu=float(p.w.gpu), origin_region=p.origin, latency_slo_ms=p.slo_ms, allowed_regions=p.allowed,
            deferrable=p.deferrable, deadline_hours=max(0.0, p.deadline_h - hour) if p.deferrable else 0.0,
            weights=p.weights, tenant_satisfaction=satisfaction, expected_duration_h=p.w.duration_h)

    def _place(self, cluster: int, p: _Pending) -> np.ndarray | None:
        """Best-fit each replica onto the cluster's nodes; None (and nothing changed) if one does not fit."""
        nodes = np.arange(cluster * self.per_cluster, (cluster + 1) * self.per_cluster)
        free = self.node_alloc[nodes] - self.node_used[nodes]
        need = np.array([p.w.milli_cpu, p.w.memory_bytes, p.w.gpu])
        chosen = []
        for _ in range(p.w.replicas):
            fits = (free >= need).all(axis=1)
            if not fits.any():
                return None
            leftover = np.where(fits, free[:, 0] / max(self.node_alloc[:, 0].max(), 1) +
                                free[:, 1] / max(self.node_alloc[:, 1].max(), 1), np.inf)
            k = int(np.argmin(leftover))
            free[k] -= need
            chosen.append(nodes[k])
        idx = np.array(chosen)
        np.add.at(self.node_used, idx, need)
        return idx

    # --------------------------------------------------------------------------------- the run
    def run(self, policy: RoutingPolicy, *, on_interval: Callable[[list[IntervalRecord]], None] | None = None,
            on_decision: Callable[[FederationSim, _Pending, ClusterFeatures, WorkloadFeatures, np.ndarray, int], int]
            | None = None) -> RunResult:
        """Route every workload of the window with ``policy``.

        ``on_interval`` receives per-cluster power/energy/carbon/cost records for each hour (the hook for
        ``bench routing --save-run``). ``on_decision`` may override a decision (training roll-ins) and
        returns the cluster index, :data:`DEFER` or :data:`NO_CLUSTER`.
        """
        cfg = self.cfg
        policy.reset()
        router = Router(policy)
        self._reset_state()
        tally = _RunTally(good=np.zeros(len(self.tenants)), total=np.zeros(len(self.tenants)))
        self.outcome_bad = tally.outcome_bad  # read by training teachers: workload id → already violated/late
        self.tenant_good, self.tenant_total = tally.good, tally.total
        self.violation_log: list[tuple[int, int, int, float, float, float]] = []  # hour, id, cluster, ρ, ms, SLO
        arrivals = sorted(self.workloads, key=lambda p: (p.arrival_h, p.w.arrival_h))
        queue: list[_Pending] = []
        ai = 0
        pending_since: dict[int, int] = {}
        # Arrivals stop at the window's end; the run goes on for ``drain_hours`` so work a policy deferred
        # near the end is still accounted for (otherwise deferring would hide energy past the window).
        for hour in range(self.hours + cfg.drain_hours):
            self.hour = hour
            # 1. releases
            self._release_finished(hour, tally)
            # 2. arrivals join the queue
            while ai < len(arrivals) and arrivals[ai].arrival_h <= hour:
                queue.append(arrivals[ai])
                pending_since[arrivals[ai].w.id] = hour
                ai += 1
            # 3. route the queue in arrival order
            queue = self._route_queue(queue, hour, router, on_decision, pending_since, tally)
            # 4. accounting and SLO check for this hour
            util = self._account_hour(hour, on_interval, tally)
            self._check_slos(hour, util, tally)
        return self._result(policy, queue, tally)

    def _release_finished(self, hour: int, tally: _RunTally) -> None:
        """Free the nodes of the workloads that end by ``hour``; each counts for its tenant."""
        still = []
        for r in self.running:
            if r["end_h"] <= hour:
                np.subtract.at(self.node_used, r["nodes"], r["need"])
                tally.total[r["tenant"]] += 1
                tally.good[r["tenant"]] += 0 if tally.outcome_bad.get(r["id"], False) else 1
            else:
                still.append(r)
        self.running = still

    def _route_queue(self, queue: list[_Pending], hour: int, router: Router, on_decision: Callable[..., int] | None,
                     pending_since: dict[int, int], tally: _RunTally) -> list[_Pending]:
        """Route the queue in arrival order: start what is placed, fail what waited too long; the rest waits."""
        cfg = self.cfg
        next_queue: list[_Pending] = []
        self.queue_len = np.zeros(cfg.clusters)
        for p in queue:
            t_idx = self.tenant_index[p.w.tenant]
            choice, placed_nodes = self._route_one(p, hour, t_idx, router, on_decision, tally)
            if placed_nodes is not None:
                start_late = p.deferrable and hour > p.deadline_h
                tally.deadline_misses += int(start_late)
                end = hour + max(1, math.ceil(p.w.duration_h))
                self.running.append({"id": p.w.id, "cluster": choice, "nodes": placed_nodes,
                                     "need": np.array([p.w.milli_cpu, p.w.memory_bytes, p.w.gpu]),
                                     "end_h": end, "tenant": t_idx, "origin": p.origin, "slo": p.slo_ms,
                                     "gpu": p.w.gpu})
                tally.outcome_bad[p.w.id] = start_late
                continue
            if choice == DEFER:
                tally.deferred_decisions += 1
            waited = hour - pending_since[p.w.id]
            limit_passed = hour >= p.deadline_h + (cfg.max_pending_hours if p.deferrable else 0)
            if (not p.deferrable and waited >= cfg.max_pending_hours) or (p.deferrable and limit_passed):
                tally.failures += 1
                tally.deadline_misses += int(p.deferrable)
                tally.total[t_idx] += 1
                continue
            next_queue.append(p)
        return next_queue

    def _route_one(self, p: _Pending, hour: int, t_idx: int, router: Router, on_decision: Callable[..., int] | None,
                   tally: _RunTally) -> tuple[int, np.ndarray | None]:
        """One workload's decision and, when placed, its nodes. A cluster that cannot bind every replica
        rejects the workload; it is rerouted at once (failover) with that cluster excluded, up to
        ``max_reroutes`` times."""
        sat = (tally.good[t_idx] + 1) / (tally.total[t_idx] + 1)
        wf = self.workload_features(p, hour, sat)
        if p.deferrable and hour >= p.deadline_h:
            wf.deferrable = False  # the deadline has come: start now or miss it
        rejected: list[int] = []
        choice, placed_nodes = NO_CLUSTER, None
        for _attempt in range(self.cfg.max_reroutes + 1):
            feats = self._features(hour)
            if rejected:
                feats.ready[rejected] = False
            decision = router.decide(lambda feats=feats: feats, wf)
            tally.decision_s.append(decision.total_seconds - decision.stage_seconds.get("snapshot", 0.0))
            choice = decision.cluster
            if on_decision is not None:
                choice = on_decision(self, p, feats, wf, decision.feasible, choice)
            if choice < 0:
                break
            placed_nodes = self._place(choice, p)
            if placed_nodes is not None:
                break
            rejected.append(choice)
            choice = NO_CLUSTER
        return choice, placed_nodes

    def _account_hour(self, hour: int, on_interval: Callable[[list[IntervalRecord]], None] | None,
                      tally: _RunTally) -> np.ndarray:
        """The hour's utilisation, energy, carbon and cost (and its records to ``on_interval``); returns each
        cluster's utilisation."""
        cfg = self.cfg
        used = self._cluster_used()
        util = np.max(np.divide(used, self.c_alloc, out=np.zeros_like(used), where=self.c_alloc > 0), axis=1)
        tally.util_acc += float(util.mean())
        tally.replica_hours += float(sum(len(r["nodes"]) for r in self.running))
        power = self._power()
        reg = self.cluster_region
        pue = np.array([self.regions[r].pue for r in reg])
        e_kwh = power * pue / 1000.0
        c_kg = e_kwh * self.carbon[reg, hour] / 1000.0
        money = e_kwh / 1000.0 * self.price[reg, hour]
        tally.energy += float(e_kwh.sum())
        tally.carbon += float(c_kg.sum())
        tally.cost += float(money.sum())
        if on_interval is not None:
            start = self.window_start + timedelta(hours=hour)
            # Tenants' shares of each cluster's energy by requested CPU (Kepler-style attribution).
            shares: list[dict[str, float]] = [{} for _ in range(cfg.clusters)]
            for r in self.running:
                c = r["cluster"]
                if used[c, 0] > 0:
                    tenant = self.tenants[r["tenant"]]
                    part = e_kwh[c] * len(r["nodes"]) * r["need"][0] / used[c, 0]
                    shares[c][tenant] = shares[c].get(tenant, 0.0) + float(part)
            on_interval([IntervalRecord(start, 3600.0, self.cluster_names[c], self.regions[reg[c]].name,
                                        float(power[c]), float(e_kwh[c]), float(c_kg[c]), float(money[c]),
                                        float(self.carbon[reg[c], hour]), float(self.price[reg[c], hour]),
                                        shares[c])
                         for c in range(cfg.clusters)])
        return util

    def _check_slos(self, hour: int, util: np.ndarray, tally: _RunTally) -> None:
        """Mark each running latency-sensitive workload whose latency this hour breaks its SLO (once)."""
        reg = self.cluster_region
        self.viol_recent *= 0.5
        for r in self.running:
            if r["slo"] <= 0 or tally.outcome_bad.get(r["id"], False):
                continue
            c = r["cluster"]
            lat = self.rtt[r["origin"], reg[c]] + self.cfg.service_ms / max(1.0 - util[c], 0.01)
            if lat > r["slo"]:
                self.violation_log.append((hour, r["id"], c, float(util[c]), float(lat), r["slo"]))
                tally.outcome_bad[r["id"]] = True
                tally.slo_violations += 1
                self.viol_recent[c] += 0.5 / max(1, self.per_cluster)

    def _result(self, policy: RoutingPolicy, queue: list[_Pending], tally: _RunTally) -> RunResult:
        """The run's figures; workloads still running or queued at the end count with their outcome so far."""
        good, total = tally.good, tally.total
        for r in self.running:
            total[r["tenant"]] += 1
            good[r["tenant"]] += 0 if tally.outcome_bad.get(r["id"], False) else 1
        for p in queue:
            if not p.deferrable:
                tally.failures += 1
                total[self.tenant_index[p.w.tenant]] += 1
        ratio = np.divide(good, total, out=np.ones_like(good), where=total > 0)
        active = total > 0
        jain = float(ratio[active].sum() ** 2 / (active.sum() * (ratio[active] ** 2).sum())) if active.any() else 1.0
        ms = np.array(tally.decision_s) * 1000 if tally.decision_s else np.zeros(1)
        return RunResult(policy=policy.name, energy_kwh=tally.energy, carbon_kg=tally.carbon, cost=tally.cost,
                         slo_violations=tally.slo_violations, failures=tally.failures,
                         deadline_misses=tally.deadline_misses, jain_fairness=jain,
                         decision_ms_p50=float(np.percentile(ms, 50)), decision_ms_p99=float(np.percentile(ms, 99)),
                         workloads=len(self.workloads), placed=len(tally.outcome_bad),
                         deferred_decisions=tally.deferred_decisions,
                         mean_utilisation=tally.util_acc / max(self.hours + self.cfg.drain_hours, 1),
                         workload_hours=tally.replica_hours)

    def _power(self) -> np.ndarray:
        """IT watts per cluster now (:class:`NodePowerModel` summed over each cluster's nodes)."""
        node_w = self.node_power.watts(self.node_used, power_off_empty=self.cfg.power_off_empty_nodes)
        return node_w.reshape(self.cfg.clusters, self.per_cluster).sum(axis=1)


def latency_now(sim: FederationSim, feats: ClusterFeatures, wf: WorkloadFeatures, util: np.ndarray) -> np.ndarray:
    return latency_ms(feats, wf, util)
