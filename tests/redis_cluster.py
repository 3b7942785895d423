"""Starting a real Redis Cluster for a test: :class:`meridian.local_redis_cluster.LocalRedisCluster`, with a
missing ``redis-server`` or ``redis-cli`` failing under CI and skipping elsewhere (``tests.redis_helpers``)."""

from __future__ import annotations

from meridian.local_redis_cluster import LocalRedisCluster
from tests.redis_helpers import require


def start_cluster(*, primaries: int = 3, replicas: int = 1, node_timeout_ms: int = 2000) -> LocalRedisCluster:
    require("redis-server")
    require("redis-cli")
    return LocalRedisCluster(primaries=primaries, replicas=replicas, node_timeout_ms=node_timeout_ms).start()
