"""A live federation on loopback for the API tests: the real gRPC server and engine, real Redis (under
the test's key prefix), and regional dispatch workers on small simulated clusters, each in a thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import RunningServer, build_server
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus import open_bus
from meridian.envtest import wait_for
from meridian.model import GIB, Node, Resources
from protos import global_api_pb2_grpc as api_grpc
from regional_scheduler.dispatch_worker import DispatchWorker, DispatchWorkerSettings, simulated_cluster
from tests.global_api_helpers import TOKEN


def nodes(prefix: str, count: int, cpu: str = "32", memory_gib: int = 128, gpus: int = 0) -> list[Node]:
    return [Node(name=f"{prefix}-n{i}", capacity=Resources(milli_cpu=cpu, memory_bytes=memory_gib * GIB, gpu=gpus))
            for i in range(count)]


@dataclass
class Federation:
    server: RunningServer
    engine: GlobalScheduler
    workers: dict[str, DispatchWorker]
    stops: dict[str, threading.Event]
    threads: list[threading.Thread] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def stub(self) -> api_grpc.GlobalSchedulerStub:
        return api_grpc.GlobalSchedulerStub(grpc.insecure_channel(self.target))

    def stop_cluster(self, name: str) -> None:
        self.stops[name].set()

    def start_cluster(self, name: str) -> None:
        """(Re)start the cluster's worker thread: its summaries resume, so the registry sees it come back."""
        stop = threading.Event()
        t = threading.Thread(target=self.workers[name].run, args=(stop,), daemon=True)
        t.start()
        self.stops[name] = stop
        self.threads.append(t)


@pytest.fixture
def federation(request: pytest.FixtureRequest, redis_url: str, key_prefix: str) -> Iterator[Callable[..., Federation]]:
    made: list[Federation] = []
    single_url = redis_url

    def make(clusters: dict[str, tuple[str, int, float]] | None = None, *, tokens: list[str] | None = None,
             policy: str = "karmada", cluster_timeout_s: float = 2.0, start_delay_s: float = 0.0,
             tls: tuple[str, str] | None = None, routing_worker: bool = False,
             api: dict[str, object] | None = None, redis_cluster: bool = False) -> Federation:
        """``redis_cluster``: every component on the session's Redis Cluster instead of the single Redis, with
        the store's writes confirmed by a replica (``store.wait_replicas`` 1)."""
        redis_url, prefix = single_url, key_prefix
        if redis_cluster:
            redis_url = request.getfixturevalue("redis_cluster_url")
            prefix = request.getfixturevalue("cluster_key_prefix")
        # Routing in-process unless asked: a worker per federation would cost each test its start-up.
        clusters = clusters or {"north-1": ("eu-north", 4, 10.0), "central-1": ("eu-central", 4, 300.0)}
        settings = GlobalSchedulerSettings(
            api={"listen": "127.0.0.1:0", "auth_tokens": [TOKEN] if tokens is None else tokens, "max_workers": 8,
                 **({"tls_cert_file": tls[0], "tls_key_file": tls[1]} if tls else {}), **(api or {})},
            bus={"url": redis_url, "key_prefix": prefix, "block_ms": 50},
            registry={"cluster_timeout_s": cluster_timeout_s, "sweep_interval_s": 0.1},
            routing={"policy": policy, "defer_recheck_s": 1.0, "worker_process": routing_worker},
            store={"wait_replicas": 1 if redis_cluster else 0})
        engine = GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=prefix))
        server = build_server(engine)
        fed = Federation(server, engine, {}, {})
        for name, (region, count, carbon) in clusters.items():
            worker = DispatchWorker(
                bus=open_bus(redis_url, key_prefix=prefix), state=simulated_cluster(nodes(name, count)),
                settings=DispatchWorkerSettings(cluster=name, region=region, summary_interval_s=0.2,
                                                carbon_g_per_kwh=carbon, bus={"block_ms": 50}, start_delay_s=start_delay_s))
            fed.workers[name] = worker
            fed.start_cluster(name)
        wait_for(lambda: len(engine.registry.names()) == len(clusters), message="clusters to report")
        made.append(fed)
        return fed

    yield make
    for fed in made:
        for stop in fed.stops.values():
            stop.set()
        fed.server.stop(0.2)
        for t in fed.threads:
            t.join(timeout=5)
