"""A real Redis Cluster on loopback for tests: 3 primaries and 3 replicas from Debian's ``redis-server``, joined
by ``redis-cli --cluster create`` (what an operator runs), each node on a free port with nothing on disk but its
cluster config. ``kill(port)`` simulates a primary's crash; Redis Cluster's own failover promotes its replica."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field

import redis
from redis.cluster import RedisCluster

from meridian import envtest
from tests.redis_helpers import require


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def cluster_port(rng: random.Random) -> int:
    """A free port whose cluster-bus port (port + 10000, Redis's rule) is free and valid too: an ephemeral port
    from the OS may be above 55535, whose bus port does not exist."""
    for _ in range(1000):
        port = rng.randrange(20_000, 45_000)
        if _bindable(port) and _bindable(port + 10_000):
            return port
    raise RuntimeError("no free port pair for a Redis Cluster node")


@dataclass
class RedisClusterHarness:
    size: int = 6  # 3 primaries + 3 replicas
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="meridian-redis-cluster-"))

    @property
    def url(self) -> str:
        """A seed node's URL; a cluster client discovers the rest."""
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def start(self) -> None:
        """Start the six nodes and join them; a failure stops whatever started (no stray servers)."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        server, cli = require("redis-server"), require("redis-cli")
        rng = random.Random()
        self.ports = []
        while len(self.ports) < self.size:
            port = cluster_port(rng)
            if port not in self.ports:
                self.ports.append(port)
        for port in self.ports:
            self.procs[port] = subprocess.Popen(
                [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
                 "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", "2000",
                 "--save", "", "--appendonly", "no", "--dir", self.workdir],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for port in self.ports:
            envtest.wait_for(lambda p=port: self._answers(p), timeout=10, interval=0.05,
                             message=f"redis-server (cluster mode) on port {port}")
        subprocess.run([cli, "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports), "--cluster-replicas",
                        "1", "--cluster-yes"], check=True, capture_output=True, timeout=60)
        envtest.wait_for(self._formed, timeout=30, interval=0.1, message="the Redis Cluster to form")

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, decode_responses=True)

    def _answers(self, port: int) -> bool:
        try:
            return bool(self.node(port).ping())
        except redis.exceptions.ConnectionError:
            return False

    def _formed(self) -> bool:
        """Every node says the cluster is ok and sees 3 primaries and 3 replicas."""
        for port in self.procs:
            info = self.node(port).cluster("info")
            if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != self.size:
                return False
        roles = [n["flags"] for n in self.node(self.ports[0]).cluster("nodes").values()]
        return sum("master" in r for r in roles) == self.size // 2 and sum("slave" in r for r in roles) == self.size // 2

    def client(self) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.ports[0], decode_responses=True)

    def owner_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot."""
        client = self.client()
        try:
            node = client.get_node_from_key(key)
            return int(node.port)
        finally:
            client.close()

    def kill(self, port: int) -> None:
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.workdir, ignore_errors=True)
