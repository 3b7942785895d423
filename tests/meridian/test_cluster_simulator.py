import pytest

from meridian.model import GIB, Node, Pod, Resources
from meridian.simulator import run_timeline, seed_cluster, seed_pods
from regional_scheduler.framework import Scheduler
from regional_scheduler.policies.registry import get_policy


def test_seed_mix_is_about_95_percent_of_cpu() -> None:
    for seed in range(10):
        pods = seed_pods(seed)
        assert len(pods) == 200
        total = sum(p.requests.milli_cpu for p in pods)
        assert 0.85 * 400_000 <= total <= 1.05 * 400_000
    assert len(seed_cluster()) == 50


def test_timeline_releases_pods() -> None:
    node = Node(name="n", capacity=Resources(milli_cpu=4000, memory_bytes=8 * GIB))
    pods = [
        Pod(name="a", requests=Resources(milli_cpu=4000), creation_time_s=0, deletion_time_s=10),
        Pod(name="b", requests=Resources(milli_cpu=4000), creation_time_s=5, deletion_time_s=20),  # fails: full
        Pod(name="c", requests=Resources(milli_cpu=4000), creation_time_s=10, deletion_time_s=30),  # a has left
    ]
    result = run_timeline(Scheduler(get_policy("best-fit")), [node], pods, seed=0)
    assert (result.n_arrived, result.n_failed) == (3, 1)


def test_timeline_needs_timestamps() -> None:
    node = Node(name="n", capacity=Resources(milli_cpu=4000))
    with pytest.raises(ValueError, match="creation times"):
        run_timeline(Scheduler(get_policy("best-fit")), [node], [Pod(name="a", requests=Resources())], seed=0)
