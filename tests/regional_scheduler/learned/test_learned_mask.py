"""The learned policy never picks an infeasible node: random clusters, random pods (property-based)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meridian.cluster_state import ClusterState
from meridian.model import GIB, MIB, Node, Pod, Resources, Taint, TaintEffect, Toleration
from regional_scheduler.filters import run_filters
from regional_scheduler.framework import Scheduler
from regional_scheduler.learned.env import Episode, PlacementEnv
from regional_scheduler.learned.policy import PlacementNet
from regional_scheduler.learned.serving import LearnedScorer
from regional_scheduler.policies.learned import LearnedPolicy

MODELS = ("T4", "P100", "V100M16")


@st.composite
def nodes(draw: st.DrawFn) -> list[Node]:
    n = draw(st.integers(1, 12))
    out = []
    for i in range(n):
        gpus = draw(st.sampled_from([0, 1, 2, 4, 8]))
        taints = (Taint(key="dedicated", value="ml", effect=TaintEffect.NO_SCHEDULE),) if draw(st.booleans()) else ()
        out.append(Node(
            name=f"n{i}",
            capacity=Resources(milli_cpu=draw(st.integers(1, 64)) * 1000, memory_bytes=draw(st.integers(1, 256)) * GIB,
                               gpu=gpus),
            gpu_model=draw(st.sampled_from(MODELS)) if gpus else "",
            labels={"zone": draw(st.sampled_from(["a", "b"]))},
            taints=taints,
        ))
    return out


@st.composite
def pods(draw: st.DrawFn) -> list[Pod]:
    out = []
    for i in range(draw(st.integers(1, 30))):
        kind = draw(st.sampled_from(["cpu", "share", "whole"]))
        gpu = draw(st.sampled_from([1, 2, 4, 8])) if kind == "whole" else 0
        share = draw(st.integers(1, 999)) if kind == "share" else 0
        out.append(Pod(
            name=f"p{i}",
            requests=Resources(milli_cpu=draw(st.integers(0, 16_000)), memory_bytes=draw(st.integers(0, 32_768)) * MIB,
                               gpu=gpu, gpu_milli=share),
            node_selector={"zone": "a"} if draw(st.booleans()) else {},
            tolerations=(Toleration(key="dedicated", operator="Exists"),) if draw(st.booleans()) else (),
            allowed_gpu_models=tuple(draw(st.lists(st.sampled_from(MODELS), max_size=2, unique=True))) if gpu or share
            else (),
        ))
    return out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=nodes(), arrivals=pods(), seed=st.integers(0, 2**16))
def test_learned_placements_respect_the_filter(cluster: list[Node], arrivals: list[Pod], seed: int) -> None:
    import torch

    torch.manual_seed(seed)  # a random (untrained) network: any scores at all must stay feasible
    scorer = LearnedScorer({"gpu": PlacementNet(), "cpu": PlacementNet()})
    scheduler = Scheduler(LearnedPolicy(scorer=scorer))
    state = ClusterState.from_nodes(cluster)
    scheduler.prepare(state, arrivals)
    for pod in arrivals:
        mask, _ = run_filters(state, pod)
        placement = scheduler.place(state, pod)
        if placement is None:
            assert not mask.any()
            continue
        assert mask[placement.node], f"pod {pod.name} placed on infeasible node {placement.node}"
        state.allocate(pod, placement)  # raises if the devices or resources do not fit


@pytest.mark.parametrize("pick", [pytest.param("infeasible", id="masked-node"),
                                  pytest.param("out-of-range", id="no-such-node")])
def test_env_refuses_a_masked_action(pick: str, small_gpu_cluster: list[Node], small_workload: list[Pod]) -> None:
    whole8 = Pod(name="eight", requests=Resources(milli_cpu=1000, gpu=8))
    env = PlacementEnv(Episode(small_gpu_cluster, [whole8], small_workload))
    obs, _ = env.reset(seed=0)
    assert obs["action_mask"].tolist() == [True, False, False, False, False]  # only n0 has 8 GPUs
    action = 1 if pick == "infeasible" else len(small_gpu_cluster)
    with pytest.raises(ValueError, match="masked"):
        env.step(action)


def test_env_observation_zeroes_infeasible_rows(small_gpu_cluster: list[Node], small_workload: list[Pod]) -> None:
    env = PlacementEnv(Episode(small_gpu_cluster, small_workload, small_workload))
    obs, _ = env.reset(seed=0)
    assert obs["node_features"].shape == env.observation_space["node_features"].shape
    assert np.all(obs["node_features"][~obs["action_mask"]] == 0)
