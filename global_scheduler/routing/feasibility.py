"""Routing's filters: the hard constraints a cluster must meet to take a workload (:func:`feasible_mask`)
and the SLO head-room shield (:func:`slo_excess`, :func:`slo_safe`), over :mod:`meridian.routing_domain`'s
types and latency model.
"""

from __future__ import annotations

import numpy as np

from meridian.routing_domain import (
    ClusterFeatures,
    WorkloadFeatures,
    available_replicas,
    crit_utilisation,
    utilisation_after,
)


def slo_excess(c: ClusterFeatures, w: WorkloadFeatures, margin: float) -> np.ndarray:
    """Utilisation by which placing ``w`` (plus ``margin``) would exceed the lowest SLO ceiling on each
    cluster — its own or a running workload's; ≤ 0 where every SLO keeps ``margin`` to spare."""
    limit = c.slo_ceiling()
    if w.latency_slo_ms > 0 and w.origin_region >= 0:
        own = crit_utilisation(c.rtt_ms[w.origin_region, c.region_index], np.full(c.n, w.latency_slo_ms), c.service_ms)
        limit = np.minimum(limit, own)
    return utilisation_after(c, w) + margin - limit


def slo_safe(c: ClusterFeatures, w: WorkloadFeatures, margin: float) -> np.ndarray:
    """Clusters where placing ``w`` keeps its own and every running workload's SLO with ``margin`` to spare."""
    return slo_excess(c, w, margin) <= 0


def feasible_mask(c: ClusterFeatures, w: WorkloadFeatures) -> tuple[np.ndarray, dict[str, int]]:
    """Hard constraints: ready, allowed region, room for every replica, RTT within the SLO.

    Returns the mask and a diagnosis: for each failed constraint, on how many clusters it failed.
    """
    reasons: dict[str, int] = {}
    mask = c.ready.copy()
    if (~c.ready).any():
        reasons["cluster not ready"] = int((~c.ready).sum())
    if w.allowed_regions is not None:
        ok = w.allowed_regions[c.region_index]
        if (mask & ~ok).any():
            reasons["region not allowed (data residency)"] = int((mask & ~ok).sum())
        mask &= ok
    if w.origin_region >= 0 and w.latency_slo_ms > 0:
        ok = c.rtt_ms[w.origin_region, c.region_index] + c.service_ms < w.latency_slo_ms
        if (mask & ~ok).any():
            reasons["round trip from origin exceeds the latency SLO"] = int((mask & ~ok).sum())
        mask &= ok
    ok = available_replicas(c, w) >= w.replicas
    if (mask & ~ok).any():
        reasons["insufficient free capacity for all replicas"] = int((mask & ~ok).sum())
    mask &= ok
    return mask, reasons
