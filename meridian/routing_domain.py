"""Routing's domain: the state of every cluster at one decision (:class:`ClusterFeatures`), the workload
being routed (:class:`WorkloadFeatures`) and the latency model (round trip plus an M/M/1 response time,
and the SLO ceilings it implies).

Why in the core: the global scheduler owns routing (its policies and feasibility filter live in
:mod:`global_scheduler.routing`), but the GNN package reads these same types to encode its input
(:mod:`gnn.features`), and ``gnn`` may not import ``global_scheduler`` (ARCHITECTURE.md: dependencies
point one way, ``global_scheduler`` → ``gnn``). The shared types and the model both sides compute with
therefore live here, below both; the filters that only routing applies (the hard constraints and the
SLO shield, :mod:`global_scheduler.routing.feasibility`) live in the routing package.

The global scheduler (live, from the cluster registry) and the federation simulator fill the same
:class:`ClusterFeatures` and :class:`WorkloadFeatures`, so a model trained in simulation runs unchanged
against live summaries. Everything is a numpy array over clusters, in raw units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class ClusterFeatures:
    """State of every cluster at one decision, raw units (encoded for the GNN by
    :func:`gnn.features.cluster_matrix`)."""

    region_index: np.ndarray  # int64 (n,)
    alloc_milli_cpu: np.ndarray  # float (n,)
    alloc_memory_bytes: np.ndarray
    alloc_gpu: np.ndarray
    free_milli_cpu: np.ndarray
    free_memory_bytes: np.ndarray
    free_gpu: np.ndarray
    max_node_free_milli_cpu: np.ndarray
    max_node_free_memory_bytes: np.ndarray
    fragmentation: np.ndarray  # 0..1
    carbon_now: np.ndarray  # gCO2/kWh
    carbon_forecast: np.ndarray  # gCO2/kWh, mean of the next hours' forecast
    carbon_forecast_hourly: np.ndarray  # (n, H) forecast for the next H hours (H >= 1)
    price_per_mwh: np.ndarray
    pue: np.ndarray
    queue_length: np.ndarray
    slo_violation_rate: np.ndarray  # 0..1, recent
    ready: np.ndarray  # bool
    rtt_ms: np.ndarray  # (n_regions, n_regions)
    bandwidth_gbps: np.ndarray  # (n_regions, n_regions)
    service_ms: float = 5.0  # per-request service time used by the M/M/1 latency estimate
    # Per cluster, the utilisation at which the tightest latency SLO among the workloads already running
    # there would break (M/M/1 at its round trip); 1 = no latency-sensitive work there. Known to the
    # global tier from what it dispatched, so it is decision-time information.
    tightest_slo_utilisation: np.ndarray | None = None

    def slo_ceiling(self) -> np.ndarray:
        return np.ones(self.n) if self.tightest_slo_utilisation is None else self.tightest_slo_utilisation

    @property
    def n(self) -> int:
        return int(self.region_index.shape[0])


@dataclass
class WorkloadFeatures:
    replicas: int
    milli_cpu: float
    memory_bytes: float
    gpu: float  # whole GPUs per replica (a share counts as its fraction)
    origin_region: int  # -1 = none
    latency_slo_ms: float  # 0 = none
    allowed_regions: np.ndarray | None  # bool (n_regions,), None = all
    deferrable: bool
    deadline_hours: float  # hours left until the latest start (0 if not deferrable)
    weights: tuple[float, float, float, float]  # perf, cost, energy, fairness
    tenant_satisfaction: float = 1.0  # share of the tenant's workloads served well so far
    expected_duration_h: float = 1.0


def safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a / b, and 0 where b ≤ 0 (one division, no temporary 'out' array)."""
    return np.asarray(a, dtype=np.float64) / np.where(b > 0, b, np.inf)


def available_replicas(c: ClusterFeatures, w: WorkloadFeatures) -> np.ndarray:
    """How many replicas of ``w`` each cluster can still take (Karmada's estimator, aggregate form)."""
    big = np.full(c.n, 1e9)
    by_cpu = np.floor(safe_div(c.free_milli_cpu, np.full(c.n, w.milli_cpu))) if w.milli_cpu > 0 else big
    by_mem = np.floor(safe_div(c.free_memory_bytes, np.full(c.n, w.memory_bytes))) if w.memory_bytes > 0 else big
    by_gpu = np.floor(safe_div(c.free_gpu + 1e-9, np.full(c.n, w.gpu))) if w.gpu > 0 else big
    fits_one = (c.max_node_free_milli_cpu >= w.milli_cpu) & (c.max_node_free_memory_bytes >= w.memory_bytes)
    return np.where(fits_one & c.ready, np.minimum(np.minimum(by_cpu, by_mem), by_gpu), 0.0)


def utilisation_after(c: ClusterFeatures, w: WorkloadFeatures) -> np.ndarray:
    """Dominant-resource utilisation of each cluster if the workload went there."""
    add = float(w.replicas)
    cpu = 1 - safe_div(c.free_milli_cpu - add * w.milli_cpu, c.alloc_milli_cpu)
    mem = 1 - safe_div(c.free_memory_bytes - add * w.memory_bytes, c.alloc_memory_bytes)
    gpu = np.where(c.alloc_gpu > 0, 1 - safe_div(c.free_gpu - add * w.gpu, c.alloc_gpu), 0.0)
    return np.clip(np.maximum(np.maximum(cpu, mem), gpu), 0.0, 1.0)


def latency_ms(c: ClusterFeatures, w: WorkloadFeatures, utilisation: np.ndarray) -> np.ndarray:
    """Round trip from the workload's origin plus an M/M/1 response time at that utilisation."""
    rtt = c.rtt_ms[w.origin_region, c.region_index] if w.origin_region >= 0 else np.zeros(c.n)
    return rtt + c.service_ms / np.maximum(1.0 - utilisation, 0.01)


def crit_utilisation(rtt_ms: np.ndarray, slo_ms: np.ndarray, service_ms: float) -> np.ndarray:
    """Utilisation above which ``rtt + service / (1 − ρ)`` exceeds the SLO (M/M/1)."""
    return 1.0 - service_ms / np.maximum(slo_ms - rtt_ms, 1e-3)


def slo_ceiling_loss(c: ClusterFeatures, w: WorkloadFeatures) -> np.ndarray:
    """Share of each cluster's capacity a latency-sensitive workload would take away from everyone by
    lowering the cluster's SLO ceiling to its own critical utilisation (0 for work without an SLO).

    A 40 ms workload from a nearby origin caps a cluster at ~0.8: the last fifth of a clean cluster can
    then no longer take batch work either, which then runs on a dirtier grid.
    """
    if w.latency_slo_ms <= 0 or w.origin_region < 0:
        return np.zeros(c.n)
    own = crit_utilisation(c.rtt_ms[w.origin_region, c.region_index], np.full(c.n, w.latency_slo_ms), c.service_ms)
    ceiling = c.slo_ceiling()
    return np.clip(ceiling - np.minimum(ceiling, own), 0.0, 1.0)
