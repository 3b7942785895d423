"""The Redis Cluster harness (issue 27's test bed) and the first layout it checks: the model registry keeps
every key of a model in one slot, so its WATCH/MULTI transactions run unchanged on the primary that owns that
slot of a real cluster, and any other node answers MOVED."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from meridian.local_redis_cluster import LocalRedisCluster
from meridian.model_registry.artifacts import FilesystemArtifactStore
from meridian.model_registry.keys import ModelKeys
from meridian.model_registry.registry import ModelRegistry
from tests.model_registry_helpers import placement_checkpoint, register_version
from tests.redis_cluster import start_cluster


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalRedisCluster]:
    harness = start_cluster()
    yield harness
    harness.stop()


def test_the_harness_forms_three_primaries_with_a_replica_each(cluster: LocalRedisCluster) -> None:
    nodes = cluster.node(cluster.ports[0]).cluster("nodes")
    primaries = {n["node_id"] for n in nodes.values() if "master" in n["flags"]}
    replicas_of = [n["master_id"] for n in nodes.values() if "slave" in n["flags"]]
    assert len(primaries) == 3 and sorted(replicas_of) == sorted(primaries)
    client = cluster.client()
    try:
        for i in range(200):  # keys spread over every primary
            client.set(f"k{i}", str(i))
        assert {cluster.owner_of(f"k{i}") for i in range(200)} == {
            int(n.split(":")[1].split("@")[0]) for n, v in nodes.items() if "master" in v["flags"]}
        assert [client.get(f"k{i}") for i in range(200)] == [str(i) for i in range(200)]
    finally:
        client.close()


@pytest.mark.parametrize("primaries", [1, 2])
def test_fewer_than_three_primaries_are_joined_by_hand(primaries: int) -> None:
    small = start_cluster(primaries=primaries, replicas=0)
    try:
        assert small.primary_ports() == sorted(small.ports)
        client = small.client()
        try:
            for i in range(50):
                client.set(f"k{i}", str(i))
            assert {small.owner_of(f"k{i}") for i in range(50)} == set(small.ports)
        finally:
            client.close()
    finally:
        small.stop()


def test_the_registry_runs_on_the_primary_of_its_models_slot(cluster: LocalRedisCluster, tmp_path: Path) -> None:
    keys = ModelKeys("placement")
    names = [keys.versions, keys.active, keys.history, keys.sequence, keys.audit]
    slots = {redis.cluster.key_slot(name.encode()) for name in names}
    assert len(slots) == 1, f"the registry's keys of one model span slots {slots}"
    owner = cluster.owner_of(keys.versions)
    registry = ModelRegistry(cluster.node(owner), FilesystemArtifactStore(tmp_path / "store"))
    try:
        active = register_version(registry, "placement", placement_checkpoint(tmp_path / "a.pt"),
                                  "shadow", "canary", "active")
        successor = register_version(registry, "placement", placement_checkpoint(tmp_path / "b.pt"),
                                     "shadow", "canary", "active")
        assert registry.active("placement").version_id == successor
        registry.rollback("placement", who="test", why="test")
        assert registry.active("placement").version_id == active
        assert [r.to_state for r in registry.audit("placement")][-2:] == ["retired", "active"]
    finally:
        registry.close()
    other = next(p for p in cluster.ports if p != owner and "master" in cluster.node(p).role()[0])
    with pytest.raises(redis.exceptions.MovedError, match=f"127.0.0.1:{owner}$"):
        cluster.node(other).get(keys.active)  # any other primary redirects to the slot's owner
