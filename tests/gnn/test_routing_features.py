"""Router features: the SLO-ceiling loss, the batched matrix equal to the per-workload one, and the
shield margin a checkpoint records."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from global_scheduler.routing.gnn_routing import LEGACY_SHIELD_MARGIN, GnnRouting
from gnn.features import CLUSTER_FEATURES, cluster_matrix, cluster_matrix_batch
from gnn.policy import GnnRoutingNet
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures, slo_ceiling_loss
from meridian.seeding import set_random_seed

GIB = 2**30
torch.set_num_threads(1)


def clusters() -> ClusterFeatures:
    n = 4
    regions = np.array([0, 0, 1, 1])
    rtt = np.array([[2.0, 30.0], [30.0, 2.0]])
    carbon = np.array([20.0, 300.0, 50.0, 400.0])
    return ClusterFeatures(
        region_index=regions, alloc_milli_cpu=np.full(n, 64000.0), alloc_memory_bytes=np.full(n, 256.0 * GIB),
        alloc_gpu=np.array([0.0, 8.0, 0.0, 8.0]), free_milli_cpu=np.array([60000.0, 30000.0, 10000.0, 64000.0]),
        free_memory_bytes=np.full(n, 200.0 * GIB), free_gpu=np.array([0.0, 4.0, 0.0, 8.0]),
        max_node_free_milli_cpu=np.full(n, 32000.0), max_node_free_memory_bytes=np.full(n, 64.0 * GIB),
        fragmentation=np.zeros(n), carbon_now=carbon, carbon_forecast=carbon,
        carbon_forecast_hourly=np.repeat(carbon[:, None], 24, axis=1) * np.linspace(1.0, 0.5, 24)[None, :],
        price_per_mwh=np.full(n, 100.0), pue=np.full(n, 1.2), queue_length=np.zeros(n),
        slo_violation_rate=np.zeros(n), ready=np.ones(n, dtype=bool), rtt_ms=rtt,
        bandwidth_gbps=np.full((2, 2), 100.0), tightest_slo_utilisation=np.array([1.0, 0.6, 0.95, 1.0]))


def wl(slo: float = 0.0, origin: int = -1, deferrable: bool = False, replicas: int = 2) -> WorkloadFeatures:
    return WorkloadFeatures(replicas=replicas, milli_cpu=4000.0, memory_bytes=8.0 * GIB, gpu=0.0,
                            origin_region=origin, latency_slo_ms=slo, allowed_regions=None, deferrable=deferrable,
                            deadline_hours=8.0 if deferrable else 0.0, weights=(0.4, 0.1, 0.4, 0.1))


def test_slo_ceiling_loss() -> None:
    c = clusters()
    assert not slo_ceiling_loss(c, wl()).any()  # no SLO: no ceiling to lower
    loss = slo_ceiling_loss(c, wl(slo=40.0, origin=0))
    # In region 0 (rtt 2 ms) a 40 ms SLO breaks above 1 - 5/38 = 0.868; region 1 (rtt 30 ms) above 0.5.
    assert loss[0] == pytest.approx(1.0 - (1 - 5 / 38))
    assert loss[1] == 0.0  # the cluster's ceiling (0.6) is already below 0.868
    assert loss[2] == pytest.approx(0.95 - 0.5) and loss[3] == pytest.approx(1.0 - 0.5)


def test_batched_matrix_equals_single() -> None:
    c = clusters()
    ws = [wl(), wl(slo=40.0, origin=0), wl(slo=250.0, origin=1, replicas=5), wl(deferrable=True)]
    batched = cluster_matrix_batch(c, ws)
    assert batched.shape == (len(ws), c.n, len(CLUSTER_FEATURES))
    for i, w in enumerate(ws):
        assert np.allclose(batched[i], cluster_matrix(c, w), atol=1e-6), CLUSTER_FEATURES


def test_shield_margin_comes_from_the_checkpoint(tmp_path: Path) -> None:
    set_random_seed(0)
    net = GnnRoutingNet()
    trained_with_zero = net.save(tmp_path / "zero.pt", {"shield_margin": 0.0})
    legacy = GnnRoutingNet(net.model).save(tmp_path / "legacy.pt")
    assert GnnRouting(trained_with_zero).shield_margin == 0.0
    assert GnnRouting(legacy).shield_margin == LEGACY_SHIELD_MARGIN
    assert GnnRouting(trained_with_zero, shield_margin=0.05).shield_margin == 0.05
    assert GnnRouting(trained_with_zero, shield_margin=None).shield_margin is None
    # The margin changes decisions: cluster 1 would be at 0.656 under a 0.75 ceiling, unsafe with 0.1
    # head-room, safe with none (cluster 3 is safe either way, so the shield applies).
    c = clusters()
    c.tightest_slo_utilisation = np.array([0.1, 0.75, 0.1, 1.0])
    w = wl()
    feasible = np.ones(c.n, dtype=bool)
    assert np.isfinite(GnnRouting(trained_with_zero).score(c, w, feasible)[1])
    assert GnnRouting(legacy).score(c, w, feasible)[1] == -np.inf


def test_batch_reserve_keeps_the_last_capacity_for_latency_sensitive_work(tmp_path: Path) -> None:
    from global_scheduler.routing.base import DEFER, select

    set_random_seed(0)
    path = GnnRoutingNet().save(tmp_path / "r.pt", {"shield_margin": 0.0, "batch_reserve": 0.05})
    policy = GnnRouting(path)
    assert policy.batch_reserve == 0.05
    c = clusters()
    # After a 2 × 4-CPU workload: clusters at 0.28 (memory), 0.66, 0.97, 0.28 utilisation; ceilings leave
    # cluster 1 0.04 to spare (inside the reserve) and rule the others out.
    c.tightest_slo_utilisation = np.array([0.1, 0.70, 0.1, 0.1])
    feasible = np.ones(c.n, dtype=bool)
    batch = wl(deferrable=True)
    scores = policy.score(c, batch, feasible)
    assert not np.isfinite(scores[:-1]).any() and select(scores, feasible, True) == DEFER  # waits
    # Work that cannot wait falls back to the plain (zero-margin) shield and takes cluster 1.
    scores = policy.score(c, wl(), feasible)
    assert np.isfinite(scores[1]) and np.isinf(scores[[0, 2, 3]]).all()
    # A latency-sensitive workload is not held to the reserve: cluster 3 at 0.28 under a 0.30 ceiling.
    c.tightest_slo_utilisation = np.array([0.1, 0.1, 0.1, 0.30])
    scores = policy.score(c, wl(slo=250.0, origin=1), feasible)
    assert np.isfinite(scores[3]) and np.isinf(scores[:3]).all()
    assert np.isinf(policy.score(c, batch, feasible)[:-1]).all()  # the same room is inside batch work's reserve
