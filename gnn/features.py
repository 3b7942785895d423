"""What the routing GNN sees: routing's domain (:mod:`meridian.routing_domain`) encoded as per-cluster
features, per-workload features and the link features.

The domain types are the core's, so a model trained on the federation simulator's snapshots runs
unchanged against live summaries. Everything is a float32 numpy array over clusters; the tensors
are built with one ``torch.from_numpy`` per block (no Python loop over clusters).

Normalisation constants are part of the contract (a checkpoint records ``FEATURE_VERSION``).
"""

from __future__ import annotations

import numpy as np

from meridian.routing_domain import (
    ClusterFeatures,
    WorkloadFeatures,
    available_replicas,
    latency_ms,
    safe_div,
    slo_ceiling_loss,
    utilisation_after,
)

FEATURE_VERSION = 3  # 3: + slo_ceiling_loss

# Scales that bring raw units to roughly [0, 1].
CARBON_SCALE_G_PER_KWH = 400.0
PRICE_SCALE_PER_MWH = 300.0
RTT_SCALE_MS = 200.0
BANDWIDTH_SCALE_GBPS = 100.0
DEADLINE_SCALE_H = 24.0

CLUSTER_FEATURES = (
    "free_cpu_fraction", "free_memory_fraction", "free_gpu_fraction", "utilisation_after",
    "fragmentation", "carbon_now", "carbon_forecast", "carbon_min_until_deadline", "carbon_rank",
    "price", "pue_excess", "queue_length", "slo_violation_rate", "fits_fraction", "rtt_over_slo",
    "latency_margin", "capacity_share", "is_origin_region", "slo_headroom", "slo_ceiling_loss",
)
WORKLOAD_FEATURES = (
    "cpu_share", "memory_share", "gpu_per_replica", "replicas", "deferrable", "deadline_hours",
    "latency_slo", "w_performance", "w_cost", "w_energy", "w_fairness", "tenant_satisfaction",
    "expected_duration",
)
EDGE_FEATURES = ("rtt", "bandwidth")


def carbon_min_until_deadline(c: ClusterFeatures, w: WorkloadFeatures) -> np.ndarray:
    if not w.deferrable:
        return c.carbon_now
    horizon = int(max(1, min(np.floor(w.deadline_hours) + 1, c.carbon_forecast_hourly.shape[1])))
    return np.minimum(c.carbon_now, c.carbon_forecast_hourly[:, :horizon].min(axis=1))


def cluster_matrix(c: ClusterFeatures, w: WorkloadFeatures) -> np.ndarray:
    """(n, len(CLUSTER_FEATURES)) float32, the workload-dependent columns included."""
    util_after = utilisation_after(c, w)
    fits = available_replicas(c, w)
    slo = w.latency_slo_ms if w.latency_slo_ms > 0 else 1e4
    rtt = c.rtt_ms[w.origin_region, c.region_index] if w.origin_region >= 0 else np.zeros(c.n)
    lat = latency_ms(c, w, util_after)
    lo, hi = float(c.carbon_now.min()), float(c.carbon_now.max())
    total_cpu = float(c.alloc_milli_cpu.sum()) or 1.0
    cols = [
        safe_div(c.free_milli_cpu, c.alloc_milli_cpu),
        safe_div(c.free_memory_bytes, c.alloc_memory_bytes),
        safe_div(c.free_gpu, c.alloc_gpu),
        util_after,
        c.fragmentation,
        c.carbon_now / CARBON_SCALE_G_PER_KWH,
        c.carbon_forecast / CARBON_SCALE_G_PER_KWH,
        carbon_min_until_deadline(c, w) / CARBON_SCALE_G_PER_KWH,
        (c.carbon_now - lo) / (hi - lo) if hi > lo else np.zeros(c.n),
        c.price_per_mwh / PRICE_SCALE_PER_MWH,
        c.pue - 1.0,
        np.minimum(c.queue_length / 10.0, 1.0),
        c.slo_violation_rate,
        np.minimum(fits / max(w.replicas, 1), 1.0),
        np.minimum(rtt / slo, 2.0),
        np.clip((slo - lat) / slo, -1.0, 1.0),
        c.alloc_milli_cpu / total_cpu * c.n,
        (c.region_index == w.origin_region).astype(np.float64),
        np.clip(c.slo_ceiling() - util_after, -1.0, 1.0),
        slo_ceiling_loss(c, w),
    ]
    return np.stack(cols, axis=1).astype(np.float32)


def cluster_matrix_batch(c: ClusterFeatures, ws: list[WorkloadFeatures]) -> np.ndarray:
    """(B, n, len(CLUSTER_FEATURES)) float32 for many workloads at once: :func:`cluster_matrix` with the
    workload's numbers as (B, 1) columns broadcast against the clusters (the API router's batch path)."""
    n, b = c.n, len(ws)
    col = lambda values: np.array(values, dtype=np.float64).reshape(b, 1)  # noqa: E731
    reps, cpu, mem, gpu = col([w.replicas for w in ws]), col([w.milli_cpu for w in ws]), \
        col([w.memory_bytes for w in ws]), col([w.gpu for w in ws])
    origin = np.array([w.origin_region for w in ws], dtype=np.int64)
    slo_raw = col([w.latency_slo_ms for w in ws])
    slo = np.where(slo_raw > 0, slo_raw, 1e4)
    rtt = np.where((origin >= 0)[:, None], c.rtt_ms[np.maximum(origin, 0)][:, c.region_index], 0.0)
    # utilisation after (B, n)
    u_cpu = 1 - safe_div(c.free_milli_cpu[None, :] - reps * cpu, np.broadcast_to(c.alloc_milli_cpu, (b, n)))
    u_mem = 1 - safe_div(c.free_memory_bytes[None, :] - reps * mem, np.broadcast_to(c.alloc_memory_bytes, (b, n)))
    u_gpu = np.where(c.alloc_gpu[None, :] > 0,
                     1 - safe_div(c.free_gpu[None, :] - reps * gpu, np.broadcast_to(c.alloc_gpu, (b, n))), 0.0)
    util_after = np.clip(np.maximum(np.maximum(u_cpu, u_mem), u_gpu), 0.0, 1.0)
    # available replicas (B, n)
    big = 1e9
    by_cpu = np.where(cpu > 0, np.floor(c.free_milli_cpu[None, :] / np.where(cpu > 0, cpu, 1.0)), big)
    by_mem = np.where(mem > 0, np.floor(c.free_memory_bytes[None, :] / np.where(mem > 0, mem, 1.0)), big)
    by_gpu = np.where(gpu > 0, np.floor((c.free_gpu[None, :] + 1e-9) / np.where(gpu > 0, gpu, 1.0)), big)
    fits_one = (c.max_node_free_milli_cpu[None, :] >= cpu) & (c.max_node_free_memory_bytes[None, :] >= mem) & c.ready
    fits = np.where(fits_one, np.minimum(np.minimum(by_cpu, by_mem), by_gpu), 0.0)
    lat = rtt + c.service_ms / np.maximum(1.0 - util_after, 0.01)
    own_crit = 1.0 - c.service_ms / np.maximum(slo_raw - rtt, 1e-3)
    ceiling = c.slo_ceiling()[None, :]
    has_slo = (slo_raw > 0) & (origin >= 0)[:, None]
    ceiling_loss = np.where(has_slo, np.clip(ceiling - np.minimum(ceiling, own_crit), 0.0, 1.0), 0.0)
    carbon_min = np.broadcast_to(c.carbon_now, (b, n)).copy()
    for i, w in enumerate(ws):
        if w.deferrable:
            carbon_min[i] = carbon_min_until_deadline(c, w)
    lo, hi = float(c.carbon_now.min()), float(c.carbon_now.max())
    total_cpu = float(c.alloc_milli_cpu.sum()) or 1.0
    per_cluster = lambda v: np.broadcast_to(np.asarray(v, dtype=np.float64), (b, n))  # noqa: E731
    cols = [
        per_cluster(safe_div(c.free_milli_cpu, c.alloc_milli_cpu)),
        per_cluster(safe_div(c.free_memory_bytes, c.alloc_memory_bytes)),
        per_cluster(safe_div(c.free_gpu, c.alloc_gpu)),
        util_after,
        per_cluster(c.fragmentation),
        per_cluster(c.carbon_now / CARBON_SCALE_G_PER_KWH),
        per_cluster(c.carbon_forecast / CARBON_SCALE_G_PER_KWH),
        carbon_min / CARBON_SCALE_G_PER_KWH,
        per_cluster((c.carbon_now - lo) / (hi - lo) if hi > lo else np.zeros(n)),
        per_cluster(c.price_per_mwh / PRICE_SCALE_PER_MWH),
        per_cluster(c.pue - 1.0),
        per_cluster(np.minimum(c.queue_length / 10.0, 1.0)),
        per_cluster(c.slo_violation_rate),
        np.minimum(fits / np.maximum(reps, 1), 1.0),
        np.minimum(rtt / slo, 2.0),
        np.clip((slo - lat) / slo, -1.0, 1.0),
        per_cluster(c.alloc_milli_cpu / total_cpu * n),
        (c.region_index[None, :] == origin[:, None]).astype(np.float64),
        np.clip(c.slo_ceiling()[None, :] - util_after, -1.0, 1.0),
        ceiling_loss,
    ]
    return np.stack(cols, axis=2).astype(np.float32)


def workload_vector(c: ClusterFeatures, w: WorkloadFeatures) -> np.ndarray:
    mean_cpu = float(c.alloc_milli_cpu.mean()) or 1.0
    mean_mem = float(c.alloc_memory_bytes.mean()) or 1.0
    return np.array([
        w.replicas * w.milli_cpu / mean_cpu * 10,
        w.replicas * w.memory_bytes / mean_mem * 10,
        w.gpu,
        np.log1p(w.replicas) / 3,
        float(w.deferrable),
        min(w.deadline_hours, 48.0) / DEADLINE_SCALE_H,
        min(w.latency_slo_ms, 1000.0) / RTT_SCALE_MS,
        *w.weights,
        w.tenant_satisfaction,
        np.log1p(w.expected_duration_h) / 5,
    ], dtype=np.float32)
