"""The GATv2 router: shapes, batching, checkpoints (weights_only), seeded decisions, and a short fit."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from gnn.buffers import DecisionBuffer, DecisionSample
from gnn.features import CLUSTER_FEATURES, WORKLOAD_FEATURES
from gnn.graph import cluster_edges
from gnn.policy import DEFAULT_CHECKPOINT, GnnRoutingNet
from gnn.train import agreement, train_imitation
from meridian.routing_domain import ClusterFeatures, WorkloadFeatures
from meridian.seeding import set_random_seed

GIB = 2**30
torch.set_num_threads(1)  # the suite runs beside other workers on 2 cores


def clusters(n: int = 6, seed: int = 0) -> ClusterFeatures:
    rng = np.random.default_rng(seed)
    regions = np.arange(n) % 3
    rtt = np.array([[2.0, 20.0, 150.0], [20.0, 2.0, 140.0], [150.0, 140.0, 2.0]])
    carbon = rng.uniform(10, 400, n)
    return ClusterFeatures(
        region_index=regions, alloc_milli_cpu=np.full(n, 64000.0), alloc_memory_bytes=np.full(n, 256.0 * GIB),
        alloc_gpu=np.full(n, 8.0), free_milli_cpu=rng.uniform(0, 64000, n), free_memory_bytes=np.full(n, 100.0 * GIB),
        free_gpu=np.full(n, 4.0), max_node_free_milli_cpu=np.full(n, 32000.0),
        max_node_free_memory_bytes=np.full(n, 64.0 * GIB), fragmentation=np.zeros(n), carbon_now=carbon,
        carbon_forecast=carbon, carbon_forecast_hourly=np.repeat(carbon[:, None], 24, axis=1),
        price_per_mwh=np.full(n, 100.0), pue=np.full(n, 1.2), queue_length=np.zeros(n), slo_violation_rate=np.zeros(n),
        ready=np.ones(n, dtype=bool), rtt_ms=rtt, bandwidth_gbps=np.full((3, 3), 100.0))


def workload() -> WorkloadFeatures:
    return WorkloadFeatures(replicas=2, milli_cpu=4000.0, memory_bytes=8.0 * GIB, gpu=0.0, origin_region=0,
                            latency_slo_ms=100.0, allowed_regions=None, deferrable=True, deadline_hours=6.0,
                            weights=(0.4, 0.1, 0.4, 0.1))


def test_shapes_and_sparse_edges() -> None:
    set_random_seed(0)
    net = GnnRoutingNet()
    g = net.graph(clusters(), workload())
    assert g.x.shape == (6, len(CLUSTER_FEATURES) + len(WORKLOAD_FEATURES))
    assert net.logits(clusters(), workload()).shape == (7,)
    ei, ea = cluster_edges(np.arange(100) % 7, np.full((7, 7), 50.0), np.ones((7, 7)), neighbours=8)
    assert ei.shape == (2, 800) and ea.shape == (800, 2)
    assert not (ei[0] == ei[1]).any()


def test_batched_forward_matches_single() -> None:
    set_random_seed(1)
    net = GnnRoutingNet()
    from torch_geometric.data import Batch

    graphs = [net.graph(clusters(seed=s), workload()) for s in range(3)]
    batch = Batch.from_data_list(graphs)
    net.model.eval()
    with torch.inference_mode():
        scores, defer = net.model(batch.x, batch.edge_index, batch.edge_attr, batch.workload, batch.batch)
        for i, g in enumerate(graphs):
            s1, d1 = net.model(g.x, g.edge_index, g.edge_attr, g.workload)
            assert torch.allclose(scores[batch.batch == i], s1, atol=1e-5)
            assert torch.allclose(defer[i], d1[0], atol=1e-5)


def test_reset_parameters_and_seed_give_same_decisions(tmp_path: Path) -> None:
    set_random_seed(7)
    a = GnnRoutingNet()
    set_random_seed(7)
    b = GnnRoutingNet()
    assert np.allclose(a.logits(clusters(), workload()), b.logits(clusters(), workload()))
    before = a.logits(clusters(), workload())
    a.model.reset_parameters()
    assert not np.allclose(before, a.logits(clusters(), workload()))
    path = a.save(tmp_path / "r.pt", {"note": "test"})
    loaded = GnnRoutingNet.load(path)
    assert np.allclose(a.logits(clusters(), workload()), loaded.logits(clusters(), workload()))
    assert loaded.meta["note"] == "test"
    torch.load(path, weights_only=True)  # plain tensors and JSON only


def test_imitation_learns_a_teacher() -> None:
    set_random_seed(0)
    net = GnnRoutingNet()
    buffer = DecisionBuffer()
    rng = np.random.default_rng(0)
    for s in range(32):
        c = clusters(seed=s)
        target = np.zeros(7, dtype=np.float32)
        target[int(np.argmin(c.carbon_now))] = 1.0  # the teacher: cleanest cluster
        buffer.add(DecisionSample(net.graph(c, workload()), target, np.ones(7, dtype=bool)))
    before = agreement(net, buffer)
    losses = train_imitation(net, buffer, epochs=15, batch_size=32, lr=2e-2, seed=int(rng.integers(100)))
    assert losses[-1] < losses[0]
    assert agreement(net, buffer) > max(before, 0.8)


def test_committed_checkpoint_is_small_and_loads() -> None:
    if not DEFAULT_CHECKPOINT.exists():
        pytest.fail(f"committed checkpoint missing: {DEFAULT_CHECKPOINT}")
    assert DEFAULT_CHECKPOINT.stat().st_size <= 2 * 2**20
    net = GnnRoutingNet.load()
    assert np.isfinite(net.logits(clusters(), workload())).all()
    assert "regions" in net.meta and "uk-south" not in net.meta["regions"]


def test_batched_logits_match_one_by_one() -> None:
    set_random_seed(2)
    net = GnnRoutingNet()
    c = clusters(seed=5)
    ws = [workload(), WorkloadFeatures(replicas=1, milli_cpu=1000.0, memory_bytes=GIB, gpu=1.0, origin_region=-1,
                                       latency_slo_ms=0.0, allowed_regions=None, deferrable=False,
                                       deadline_hours=0.0, weights=(0.1, 0.1, 0.7, 0.1))]
    batched = net.logits_batch(c, ws)
    for i, w in enumerate(ws):
        assert np.allclose(batched[i], net.logits(c, w), atol=1e-5)


def test_batched_features_match_one_by_one() -> None:
    from gnn.features import cluster_matrix, cluster_matrix_batch

    c = clusters(seed=9)
    c.tightest_slo_utilisation = np.linspace(0.3, 1.0, c.n)
    ws = [workload(),
          WorkloadFeatures(replicas=3, milli_cpu=0.0, memory_bytes=2.0 * GIB, gpu=1.0, origin_region=-1,
                           latency_slo_ms=0.0, allowed_regions=None, deferrable=False, deadline_hours=0.0,
                           weights=(0.1, 0.1, 0.7, 0.1)),
          WorkloadFeatures(replicas=1, milli_cpu=90_000.0, memory_bytes=GIB, gpu=0.0, origin_region=2,
                           latency_slo_ms=40.0, allowed_regions=None, deferrable=True, deadline_hours=3.0,
                           weights=(0.7, 0.1, 0.1, 0.1))]
    batched = cluster_matrix_batch(c, ws)
    for i, w in enumerate(ws):
        assert np.allclose(batched[i], cluster_matrix(c, w), atol=1e-6)


def _torch_logits(net: GnnRoutingNet, c: ClusterFeatures, w: WorkloadFeatures) -> np.ndarray:
    g = net.graph(c, w)
    net.model.eval()
    with torch.inference_mode():
        scores, defer = net.model(g.x, g.edge_index, g.edge_attr, g.workload)
    return np.r_[scores.numpy(), float(defer[0])]


@pytest.mark.parametrize("layers", [1, 2])
def test_numpy_forward_equals_torch(layers: int) -> None:
    """Decisions run the network in numpy (gnn.numpy_router); it must be the torch forward."""
    set_random_seed(layers)
    net = GnnRoutingNet(layers=layers)
    for seed in range(5):
        c, w = clusters(n=30, seed=seed), workload()
        np.testing.assert_allclose(net.logits(c, w), _torch_logits(net, c, w), rtol=0, atol=2e-5)
    assert net._fast is not None  # the numpy path ran


def test_numpy_forward_of_the_committed_checkpoint_equals_torch() -> None:
    net = GnnRoutingNet.load()
    other = WorkloadFeatures(replicas=3, milli_cpu=2000.0, memory_bytes=4.0 * GIB, gpu=1.0, origin_region=2,
                             latency_slo_ms=40.0, allowed_regions=None, deferrable=False, deadline_hours=0.0,
                             weights=(0.7, 0.05, 0.15, 0.1))
    for seed in range(4):
        for w in (workload(), other):
            np.testing.assert_allclose(net.logits(clusters(n=40, seed=seed), w),
                                       _torch_logits(net, clusters(n=40, seed=seed), w), rtol=0, atol=2e-5)


def test_numpy_forward_follows_training() -> None:
    """Training changes the weights in place; the next decision must use the new ones."""
    set_random_seed(3)
    net = GnnRoutingNet()
    c, w = clusters(seed=4), workload()
    before = net.logits(c, w)
    buffer = DecisionBuffer()
    for s in range(8):
        cs = clusters(seed=s)
        target = np.zeros(7, dtype=np.float32)
        target[int(np.argmax(cs.carbon_now))] = 1.0
        buffer.add(DecisionSample(net.graph(cs, w), target, np.ones(7, dtype=bool)))
    train_imitation(net, buffer, epochs=3, batch_size=8, lr=2e-2, seed=0)
    after = net.logits(c, w)
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, _torch_logits(net, c, w), rtol=0, atol=2e-5)


def test_a_graph_without_self_loops_keeps_the_torch_forward() -> None:
    from gnn.gatv2_router import GATv2Router

    set_random_seed(4)
    plain = GnnRoutingNet()
    model = GATv2Router(plain.model.in_channels, plain.model.workload_channels, plain.model.edge_channels,
                        graph_self_loops=False)
    net = GnnRoutingNet(model)
    c, w = clusters(seed=1), workload()
    np.testing.assert_allclose(net.logits(c, w), _torch_logits(net, c, w), rtol=0, atol=1e-6)
    assert net._fast is None
