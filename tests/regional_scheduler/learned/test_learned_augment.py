"""Training-data augmentation (GPU-model constraints on training lists), the GPU-model scarcity
features of layout version 2, and carrying a version-1 profile over to the new layout."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from meridian.cluster_state import ClusterState
from meridian.model import GIB, Node, Pod, Resources
from regional_scheduler.learned.augment import augmented_pod_list, constrain_gpu_models, model_capacity
from regional_scheduler.learned.checkpoint import (
    CHECKPOINT_VERSION,
    CheckpointError,
    load_checkpoint,
    upgrade_profiles,
)
from regional_scheduler.learned.features import (
    FEATURE_LAYOUT,
    IDX,
    N_NODE,
    N_POD,
    FeatureBuilder,
    model_pressure,
)
from regional_scheduler.learned.policy import PlacementNet

NEW = ("model_pressure", "model_pressure_free_pod")


def _pods(n: int = 200) -> list[Pod]:
    out = []
    for i in range(n):
        kind = i % 4
        req = (Resources(milli_cpu=2000, memory_bytes=GIB) if kind == 0 else
               Resources(milli_cpu=4000, memory_bytes=GIB, gpu_milli=300) if kind == 1 else
               Resources(milli_cpu=4000, memory_bytes=GIB, gpu=1) if kind == 2 else
               Resources(milli_cpu=8000, memory_bytes=GIB, gpu=4))
        out.append(Pod(name=f"p{i}", requests=req))
    return out


def test_augmentation_constrains_a_share_of_gpu_pods_only(small_gpu_cluster: list[Node]) -> None:
    pods = _pods()
    out = constrain_gpu_models(pods, small_gpu_cluster, share=0.3, rng=np.random.default_rng(1))
    capacity = model_capacity(small_gpu_cluster)
    gpu = [p for p in out if p.requests.gpu_milli_total > 0]
    constrained = [p for p in gpu if p.allowed_gpu_models]
    assert len(constrained) == round(0.3 * len(gpu))
    assert all(not p.allowed_gpu_models for p in out if p.requests.gpu_milli_total == 0)
    for p in constrained:  # models of the node list only, and at least one node can hold the pod
        assert set(p.allowed_gpu_models) <= set(capacity)
        assert max(capacity[m][1] for m in p.allowed_gpu_models) >= p.requests.gpu
    # resources are untouched; the original list is not modified
    assert [p.requests for p in out] == [p.requests for p in pods]
    assert not any(p.allowed_gpu_models for p in pods)


def test_augmentation_is_deterministic_per_seed(small_gpu_cluster: list[Node]) -> None:
    a, share_a = augmented_pod_list(_pods(), small_gpu_cluster, 7, p_augment=1.0)
    b, share_b = augmented_pod_list(_pods(), small_gpu_cluster, 7, p_augment=1.0)
    assert share_a == share_b and 0.05 <= share_a <= 0.35
    assert [p.allowed_gpu_models for p in a] == [p.allowed_gpu_models for p in b]
    plain, share = augmented_pod_list(_pods(), small_gpu_cluster, 7, p_augment=0.0)
    assert share == 0.0 and not any(p.allowed_gpu_models for p in plain)


def test_model_pressure_marks_the_models_constrained_pods_need(small_gpu_cluster: list[Node]) -> None:
    state = ClusterState.from_nodes(small_gpu_cluster)
    free = Pod(name="free", requests=Resources(milli_cpu=1000, memory_bytes=GIB, gpu=1))
    p100 = Pod(name="p100", requests=Resources(milli_cpu=1000, memory_bytes=GIB, gpu=1), allowed_gpu_models=("P100",))
    assert not model_pressure(state, [free, free]).any()
    pressure = model_pressure(state, [free, p100])
    index = {m: i for i, m in enumerate(state.gpu_models)}
    assert pressure[index["P100"]] > 0 and pressure[index["T4"]] == 0 and pressure[-1] == 0
    builder = FeatureBuilder()
    builder.prepare(state, [free, p100])
    nodes = np.arange(state.n_nodes)
    x_free, _ = builder.node_features(state, free, nodes)
    x_p100, _ = builder.node_features(state, p100, nodes)
    p100_node = state.gpu_model_id == index["P100"]
    assert (x_free[p100_node, IDX["model_pressure"]] > 0).all()
    np.testing.assert_array_equal(x_free[:, IDX["model_pressure_free_pod"]], x_free[:, IDX["model_pressure"]])
    assert not x_p100[:, IDX["model_pressure_free_pod"]].any()  # the pod itself is constrained


def _old_layout_checkpoint(path: Path, hidden: int = 8) -> tuple[PlacementNet, list[int]]:
    """A version-1-style checkpoint: the current layout without the scarcity features."""
    old_node = [f for f in FEATURE_LAYOUT["node"] if f not in NEW]  # type: ignore[attr-defined]
    torch.manual_seed(3)
    net = PlacementNet(n_node=len(old_node), hidden=hidden, feature_mean=np.linspace(0, 1, len(old_node)),
                       feature_std=np.linspace(1, 2, len(old_node)))
    with torch.no_grad():
        net.heuristic_head.weight.normal_()
    torch.save({"version": CHECKPOINT_VERSION,
                "feature_layout": {"version": 1, "node": old_node, "pod": FEATURE_LAYOUT["pod"]},
                "profiles": {"cpu": {"hyper_parameters": net.hyper_parameters(),
                                     "state_dict": {k: v.detach().clone() for k, v in net.state_dict().items()}}},
                "extra": {}}, path)
    keep = [i for i, f in enumerate(FEATURE_LAYOUT["node"]) if f not in NEW]  # type: ignore[arg-type]
    return net, keep


def test_old_layout_is_refused_but_can_be_carried_over(tmp_path: Path) -> None:
    path = tmp_path / "v1.pt"
    old, keep = _old_layout_checkpoint(path)
    with pytest.raises(CheckpointError, match=r"feature layout.*version 1"):
        load_checkpoint(path)
    nets, _, version = upgrade_profiles(path)
    assert version == 1 and nets["cpu"].n_node == N_NODE
    rng = np.random.default_rng(0)
    x = rng.normal(size=(9, N_NODE)).astype(np.float32)
    p = rng.normal(size=N_POD).astype(np.float32)
    # whatever the new features hold, the carried-over profile scores like the old network
    np.testing.assert_allclose(nets["cpu"].predict(x, p), old.predict(x[:, keep], p), rtol=1e-5, atol=1e-5)


def test_augmented_openb_episodes_use_the_augmented_list_as_workload(small_gpu_cluster: list[Node]) -> None:
    from regional_scheduler.learned.algorithm import openb_episodes

    make = openb_episodes([_pods()], small_gpu_cluster, node_fraction=1.0, augment_p=1.0)
    ep = make(4)
    assert any(p.allowed_gpu_models for p in ep.workload)
    assert make(4).workload == ep.workload  # deterministic per episode index
    plain = openb_episodes([_pods()], small_gpu_cluster, node_fraction=1.0)(4)
    assert not any(p.allowed_gpu_models for p in plain.workload)


def test_pod_mix_episodes_draw_every_list_to_the_mix(small_gpu_cluster: list[Node]) -> None:
    from collections import Counter

    from regional_scheduler.learned.algorithm import openb_episodes
    from regional_scheduler.learned.augment import pod_class

    cpu_heavy = [p for p in _pods() if pod_class(p) == "cpu_only"]
    gpu_only = [p for p in _pods() if pod_class(p) != "cpu_only"]
    mix = {"cpu_only": 10, "gpu_share": 20, "gpu_one": 30, "gpu_multi": 5}
    make = openb_episodes([cpu_heavy, gpu_only], small_gpu_cluster, node_fraction=1.0, mix=mix)
    for i in (0, 1):  # without the mix, episode 0 would be all CPU-only and episode 1 all GPU
        assert Counter(pod_class(p) for p in make(i).workload) == Counter(mix)
    assert [p.requests for p in make(1).workload] == [p.requests for p in make(1).workload]
