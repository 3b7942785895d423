"""A real Redis Cluster on loopback, from Debian's ``redis-server`` and ``redis-cli``: for the tests, ``.ci/run``
and ``meridian bench telemetry --cluster-primaries`` (what one machine can show of sharding).

Each node runs on a free port with nothing on disk but its cluster configuration. With three or more
primaries the nodes are joined by ``redis-cli --cluster create`` (what an operator runs); that tool refuses
fewer than three primaries, so one or two primaries (the capacity benchmark's baselines) are joined by the
same steps by hand: ``CLUSTER ADDSLOTSRANGE`` over an even split of the 16,384 slots, ``CLUSTER MEET``, and
``CLUSTER REPLICATE`` for replicas. ``kill(port)`` is a primary's crash (``SIGKILL``); Redis Cluster's own
failover then promotes its replica after ``node_timeout_ms``.

``python -m meridian.local_redis_cluster up`` starts one and prints its ``redis+cluster://`` URL, leaving the
nodes running (``.ci/run`` exports it for the tests as ``MERIDIAN_TEST_REDIS_CLUSTER_URL``).
"""

from __future__ import annotations

import argparse
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.cluster import RedisCluster

SLOTS = 16_384


class RedisClusterError(RuntimeError):
    """The local cluster could not be started (a binary missing, a node that did not answer, no free ports)."""


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
    raise RedisClusterError("no free port pair for a Redis Cluster node")


def _wait(predicate: Callable[[], Any], *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except (redis.exceptions.RedisError, OSError):
            pass
        time.sleep(0.05)
    raise RedisClusterError(f"timed out after {timeout:g} s waiting for {what}")


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise RedisClusterError(f"{name} is not installed (Debian: apt-get install redis-server)")
    return path


@dataclass
class LocalRedisCluster:
    """``primaries`` primaries with ``replicas`` replicas each; ``start()``, then ``url``; ``stop()`` ends them."""

    primaries: int = 3
    replicas: int = 1
    node_timeout_ms: int = 2000
    ports: list[int] = field(default_factory=list)
    procs: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="meridian-redis-cluster-"))
    #: Start nodes in their own session, so a Ctrl-C in the shell that ran ``up`` does not stop them.
    detach: bool = False

    @property
    def size(self) -> int:
        return self.primaries * (1 + self.replicas)

    @property
    def url(self) -> str:
        """A seed node as a ``redis+cluster://`` URL: the bus (``open_bus``) discovers the rest."""
        return f"redis+cluster://127.0.0.1:{self.ports[0]}"

    def start(self) -> LocalRedisCluster:
        """Start the nodes and join them; a failure stops whatever started (no stray servers)."""
        if self.primaries < 1 or self.replicas < 0:
            raise ValueError(f"need >= 1 primary and >= 0 replicas, not {self.primaries} and {self.replicas}")
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        server = binary("redis-server")
        rng = random.Random()
        while len(self.ports) < self.size:
            port = cluster_port(rng)
            if port not in self.ports:
                self.ports.append(port)
        for port in self.ports:
            self._spawn(server, port)
        for port in self.ports:
            _wait(lambda p=port: self.node(p).ping(), timeout=10, what=f"redis-server (cluster mode) on port {port}")
        if self.primaries >= 3:
            subprocess.run([binary("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
                            "--cluster-replicas", str(self.replicas), "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
        else:
            self._join_by_hand()
        _wait(self._formed, timeout=30, what="the Redis Cluster to form")

    def _spawn(self, server: str, port: int) -> None:
        self.procs[port] = subprocess.Popen(
            [server, "--port", str(port), "--bind", "127.0.0.1", "--cluster-enabled", "yes",
             "--cluster-config-file", f"nodes-{port}.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
             "--save", "", "--appendonly", "no", "--dir", self.workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=self.detach)

    def restart(self, port: int) -> None:
        """Start a killed node again on its port with its cluster configuration (what a restarted pod does): it
        rejoins, as a replica of whichever node took over its slots, with an empty data set it then syncs."""
        self._spawn(binary("redis-server"), port)
        _wait(lambda: self.node(port).ping(), timeout=10, what=f"redis-server on port {port} to restart")

    def _join_by_hand(self) -> None:
        """What ``redis-cli --cluster create`` does, for the one- and two-primary clusters it refuses."""
        primaries, others = self.ports[:self.primaries], self.ports[self.primaries:]
        bounds = [round(i * SLOTS / self.primaries) for i in range(self.primaries + 1)]
        for i, port in enumerate(primaries):
            self.node(port).execute_command("CLUSTER", "ADDSLOTSRANGE", bounds[i], bounds[i + 1] - 1)
        for port in self.ports[1:]:
            self.node(port).execute_command("CLUSTER", "MEET", "127.0.0.1", self.ports[0])
        _wait(lambda: all(int(self.node(p).cluster("info")["cluster_known_nodes"]) == self.size for p in self.ports),
              timeout=20, what="the nodes to meet")
        for j, port in enumerate(others):
            owner = primaries[j % self.primaries]
            owner_id = self.node(owner).execute_command("CLUSTER", "MYID")
            _wait(lambda p=port, o=owner_id: self.node(p).execute_command("CLUSTER", "REPLICATE", o),
                  timeout=20, what=f"node {port} to replicate {owner}")

    def node(self, port: int) -> redis.Redis:
        return redis.Redis(port=port, socket_timeout=2, decode_responses=True)

    def _formed(self) -> bool:
        """Every node says the cluster is ok and sees every node, with the right number of primaries, and every
        primary's replicas are online (synchronised: before that a ``WAIT`` counts none of them)."""
        for port in self.procs:
            info = self.node(port).cluster("info")
            if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) != self.size:
                return False
        roles = [n["flags"] for n in self.node(self.ports[0]).cluster("nodes").values()]
        if sum("master" in r for r in roles) != self.primaries or \
                sum("slave" in r for r in roles) != self.primaries * self.replicas:
            return False
        for port in self.primary_ports():
            info = self.node(port).info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)
                      and v.get("state") == "online"]
            if len(online) != self.replicas:
                return False
        return True

    def client(self, **kwargs: Any) -> RedisCluster:
        return RedisCluster(host="127.0.0.1", port=self.ports[0], **{"decode_responses": True, **kwargs})

    def owner_of(self, key: str) -> int:
        """The port of the primary serving ``key``'s slot."""
        client = self.client()
        try:
            return int(client.get_node_from_key(key).port)
        finally:
            client.close()

    def primary_ports(self) -> list[int]:
        """The ports of the nodes that are primaries now (after a failover, a former replica's)."""
        for port in self.procs:
            try:
                nodes = self.node(port).cluster("nodes")
            except (redis.exceptions.RedisError, OSError):
                continue
            return sorted(int(addr.split(":")[1].split("@")[0]) for addr, n in nodes.items()
                          if "master" in n["flags"] and "fail" not in n["flags"])
        return []

    def kill(self, port: int) -> None:
        """SIGKILL one node (a crash: no shutdown, no last replication)."""
        proc = self.procs.pop(port)
        proc.kill()
        proc.wait(timeout=10)

    def stop(self) -> None:
        for port in list(self.procs):
            self.kill(port)
        shutil.rmtree(self.workdir, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meridian.local_redis_cluster",
                                     description="Start a Redis Cluster on loopback and print its URL.")
    parser.add_argument("command", choices=["up"])
    parser.add_argument("--primaries", type=int, default=3)
    parser.add_argument("--replicas", type=int, default=1)
    args = parser.parse_args(argv)
    try:
        cluster = LocalRedisCluster(primaries=args.primaries, replicas=args.replicas, detach=True).start()
    except (RedisClusterError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(cluster.url)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
