"""Small clusters, pods and an untrained network shared by the learned-policy tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from openb_helpers import openb_slice

from meridian.model import GIB, MIB, Node, Pod, Resources
from meridian.seeding import set_random_seed
from regional_scheduler.learned.policy import PlacementNet


def gpu_node(name: str, gpus: int, model: str = "T4", cpu: int = 32_000) -> Node:
    return Node(name=name, capacity=Resources(milli_cpu=cpu, memory_bytes=128 * GIB, gpu=gpus), gpu_model=model)


SMALL_GPU_CLUSTER = [gpu_node("n0", 8, "V100M16"), gpu_node("n1", 2), gpu_node("n2", 4, "P100"), gpu_node("n3", 1),
                     Node(name="cpu0", capacity=Resources(milli_cpu=16_000, memory_bytes=64 * GIB))]
SMALL_WORKLOAD = [
    Pod(name="share", requests=Resources(milli_cpu=4000, memory_bytes=8 * GIB, gpu_milli=500)),
    Pod(name="one", requests=Resources(milli_cpu=8000, memory_bytes=16 * GIB, gpu=1)),
    Pod(name="two", requests=Resources(milli_cpu=8000, memory_bytes=16 * GIB, gpu=2)),
    Pod(name="cpu", requests=Resources(milli_cpu=2000, memory_bytes=512 * MIB)),
]


@pytest.fixture
def small_gpu_cluster() -> list[Node]:
    return list(SMALL_GPU_CLUSTER)


@pytest.fixture
def small_workload() -> list[Pod]:
    return list(SMALL_WORKLOAD)


@pytest.fixture
def untrained_nets() -> dict[str, PlacementNet]:
    set_random_seed(0)
    return {"gpu": PlacementNet(), "cpu": PlacementNet()}


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def make_openb_slice() -> Callable[..., tuple[list[Node], list[Pod], list[Pod]]]:
    return openb_slice
