"""An embedded federation: regional schedulers on simulated clusters cut from the real openb node
list, the global scheduler's gRPC API on loopback, energy accounting from the summaries stream, and
workloads from the real DLRM trace — all in one process, talking over one stream bus.

Regions take their grid carbon intensity from the real hourly series (``../shared/traces/carbon``)
at a fixed hour of the held-back evaluation window, so routing sees real differences between grids.

Every Redis key of a run lives under its own prefix ``demo-<8 hex>:`` (streams, workload store,
energy ledger), so demos and tests sharing one Redis never meet; :meth:`Federation.close` stops every
thread that writes and then unlinks every key under that prefix (``meridian.bus.cleanup``), so a run
leaves nothing behind, interrupted (Ctrl-C) or not. Only a killed process leaves its keys; remove them
with ``redis-cli --scan --pattern 'demo-<id>:*' | xargs redis-cli unlink``.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import grpc
import numpy as np
import redis
import yaml

from global_scheduler.federation_sim import REGIONS, load_dlrm, load_grid
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import RunningServer, build_server
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus import StreamBus, open_bus
from meridian.traces import openb
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from regional_scheduler.dispatch_worker import DispatchWorker, DispatchWorkerSettings, simulated_cluster

log = logging.getLogger(__name__)

DEMO_REGIONS = ("eu-north", "eu-central", "eu-west", "us-west", "uk-south", "sa-east")
DEMO_HOUR = (12, 1, 12)  # month, day, hour (UTC) of the held-back window whose intensities regions report


@dataclass
class DemoConfig:
    regions: tuple[str, ...] = DEMO_REGIONS
    clusters_per_region: int = 1
    nodes_per_cluster: int = 40
    workloads: int = 60
    routing: str = "gnn"
    placement: str = "fgd"
    seed: int = 0
    summary_interval_s: float = 0.5
    timeout_s: float = 60.0


@dataclass
class PrivateRedis:
    """A throwaway redis-server for the demo when none answers at the given URL."""

    proc: subprocess.Popen[bytes]
    workdir: str
    url: str

    @classmethod
    def start(cls) -> PrivateRedis | None:
        binary = shutil.which("redis-server")
        if binary is None:
            return None
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        workdir = tempfile.mkdtemp(prefix="meridian-demo-redis-")
        proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                                 "no", "--dir", workdir], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"redis://127.0.0.1:{port}/0"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                redis.Redis.from_url(url, socket_timeout=0.5).ping()
                return cls(proc, workdir, url)
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        proc.kill()
        return None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


def redis_answers(url: str) -> bool:
    try:
        return bool(redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5).ping())
    except (redis.exceptions.RedisError, OSError, ValueError):
        return False


def region_intensity(traces_dir: Path, region: str) -> float:
    """The region's real grid intensity (gCO2/kWh) at the demo hour of its own series' year."""
    grid = load_grid(traces_dir)
    r = REGIONS[region]
    month, day, hour = DEMO_HOUR
    return grid.carbon[r.carbon_zone].at(datetime(r.carbon_year, month, day, hour, tzinfo=UTC))


@dataclass
class Federation:
    bus_url: str
    key_prefix: str
    server: RunningServer
    engine: GlobalScheduler
    workers: dict[str, DispatchWorker] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    carbon: dict[str, float] = field(default_factory=dict)
    accounting: threading.Event | None = None
    config_dir: Path | None = None  # the federation file written for this run

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.server.port}"

    def close(self) -> None:
        self.stop.set()
        if self.accounting is not None:
            self.accounting.set()
        self.server.stop(0.5)
        for t in self.threads:
            t.join(timeout=5)
        if self.config_dir is not None:
            shutil.rmtree(self.config_dir, ignore_errors=True)
        if not self.bus_url.startswith("memory:"):  # nothing writes any more: remove the run's keys
            from meridian.bus import redis_client
            from meridian.bus.cleanup import delete_key_prefix

            client = redis_client(self.bus_url)
            try:
                removed = delete_key_prefix(client, self.key_prefix)
            except redis.RedisError as exc:
                log.warning("could not remove the demo's keys under %s: %s", self.key_prefix, exc)
            else:
                log.debug("removed %d Redis keys under %s", removed, self.key_prefix)
            finally:
                client.close()


def _bus(url: str, key_prefix: str, shared: StreamBus | None) -> StreamBus:
    # The in-process bus lives in one object, so every tier must share it; Redis buses are per tier.
    return shared if shared is not None else open_bus(url, key_prefix=key_prefix)


def demo_cluster_names(cfg: DemoConfig) -> dict[str, str]:
    """The demo's simulated clusters, cluster → region."""
    return {f"{region}-{c + 1}": region for region in cfg.regions for c in range(cfg.clusters_per_region)}


def write_federation_file(cfg: DemoConfig, directory: Path) -> Path:
    """The demo's regions and clusters as a federation file (docs/federation-config.md), which its global
    scheduler reads as a production one reads the operator's: locations, PUE, price areas and carbon zones
    from the simulator's table. The simulated clusters pull their work, so no access is given."""
    regions = {name: {"location": {"lat": REGIONS[name].lat, "lon": REGIONS[name].lon}, "pue": REGIONS[name].pue,
                      "price_area": REGIONS[name].price_area, "carbon": {"zone": REGIONS[name].carbon_zone}}
               for name in cfg.regions}
    clusters = [{"name": name, "region": region} for name, region in demo_cluster_names(cfg).items()]
    path = directory / "federation.yaml"
    path.write_text(yaml.safe_dump({"regions": regions, "clusters": clusters}, sort_keys=False))
    return path


def start_federation(cfg: DemoConfig, *, bus_url: str, traces_dir: Path) -> Federation:
    key_prefix = f"demo-{uuid.uuid4().hex[:8]}:"
    shared = open_bus(bus_url) if bus_url.startswith("memory:") else None
    config_dir = Path(tempfile.mkdtemp(prefix="meridian-demo-"))
    settings = GlobalSchedulerSettings(
        api={"listen": "127.0.0.1:0", "max_workers": 16},
        bus={"url": bus_url, "key_prefix": key_prefix, "block_ms": 50},
        registry={"cluster_timeout_s": max(5.0, 10 * cfg.summary_interval_s), "sweep_interval_s": 0.2,
                  "config_file": write_federation_file(cfg, config_dir)},
        routing={"policy": cfg.routing, "defer_recheck_s": 5.0},
    )
    engine = GlobalScheduler(settings=settings, bus=_bus(bus_url, key_prefix, shared))
    extra = []
    accounting_stop = None
    accounting_threads: list[threading.Thread] = []
    if shared is None:
        from global_scheduler.accounting.consumer import SummaryAccountant, start_accounting
        from global_scheduler.accounting.ledger import RedisLedger
        from global_scheduler.accounting.service import SERVICE_NAME, add_energy_service

        ledger = RedisLedger(redis.Redis.from_url(bus_url), prefix=key_prefix + "meridian:", bucket_s=1)

        def _energy(server: grpc.Server) -> str:
            add_energy_service(server, ledger)
            return SERVICE_NAME

        extra.append(_energy)
        accountant = SummaryAccountant(bus=open_bus(bus_url, key_prefix=key_prefix), ledger=ledger,
                                       consumer="demo-accounting", price_per_mwh=lambda region, t_s: 100.0,
                                       settings={"block_ms": 100})
        accounting_thread, accounting_stop = start_accounting(accountant)
        accounting_threads.append(accounting_thread)
    server = build_server(engine, extra_services=extra)
    fed = Federation(bus_url, key_prefix, server, engine, accounting=accounting_stop, config_dir=config_dir)
    fed.threads.extend(accounting_threads)  # joined on close, before the keys go

    nodes = openb.load_nodes(traces_dir / "alibaba-gpu-v2023" / "openb_node_list_gpu_node.csv")
    order = np.random.default_rng(cfg.seed).permutation(len(nodes))
    k = 0
    for region in cfg.regions:
        fed.carbon[region] = region_intensity(traces_dir, region)
        for c in range(cfg.clusters_per_region):
            name = f"{region}-{c + 1}"
            picked = [nodes[int(i)] for i in order[k:k + cfg.nodes_per_cluster]]
            k += cfg.nodes_per_cluster
            worker = DispatchWorker(
                bus=_bus(bus_url, key_prefix, shared), state=simulated_cluster(picked),
                settings=DispatchWorkerSettings(cluster=name, region=region, policy=cfg.placement,
                                                summary_interval_s=cfg.summary_interval_s, bus={"block_ms": 50},
                                                carbon_g_per_kwh=fed.carbon[region], pue=REGIONS[region].pue))
            fed.workers[name] = worker
            t = threading.Thread(target=worker.run, args=(fed.stop,), name=f"regional-{name}", daemon=True)
            t.start()
            fed.threads.append(t)
    deadline = time.monotonic() + cfg.timeout_s
    while len(engine.registry.names()) < len(fed.workers):
        if time.monotonic() > deadline:
            fed.close()
            raise TimeoutError("clusters did not report their first summaries in time")
        time.sleep(0.05)
    return fed


def trace_workloads(cfg: DemoConfig, traces_dir: Path) -> list[api.SubmitWorkloadRequest]:
    """Workloads from the DLRM trace (its ``app_name`` is the tenant), scaled to the demo clusters."""
    trace = load_dlrm(str(traces_dir / "alibaba-dlrm-v2025" / "disaggregated_DLRM_trace.csv"))
    rng = np.random.default_rng(cfg.seed)
    picks = rng.choice(len(trace), size=min(cfg.workloads, len(trace)), replace=False)
    out = []
    for n, i in enumerate(sorted(int(p) for p in picks)):
        w = trace[i]
        origin = cfg.regions[int(rng.integers(len(cfg.regions)))]
        spec = api.WorkloadSpec(
            name=f"{w.tenant.lower().replace('_', '-')[:40]}-{n}".strip("-"), tenant=w.tenant,
            replicas=int(min(w.replicas, 4)),
            requests=api.ResourceQuantities(cpu=f"{max(w.milli_cpu // 4, 100)}m",
                                            memory=f"{max(w.memory_bytes // 4 // 2**20, 64)}Mi",
                                            gpu=str(w.gpu) if w.gpu else ""),
            origin_region=origin, latency_slo_ms=250.0, workload_class="latency-sensitive")
        out.append(api.SubmitWorkloadRequest(spec=spec, idempotency_key=f"demo-{cfg.seed}-{w.id}"))
    return out


def submit_all(target: str, requests: list[api.SubmitWorkloadRequest]) -> list[api.Workload]:
    stub = api_grpc.GlobalSchedulerStub(grpc.insecure_channel(target))
    return [stub.SubmitWorkload(req, timeout=10) for req in requests]


TERMINAL = {api.WORKLOAD_STATE_RUNNING, api.WORKLOAD_STATE_FAILED, api.WORKLOAD_STATE_CANCELLED}


def wait_settled(target: str, ids: list[str], timeout_s: float) -> list[api.Workload]:
    stub = api_grpc.GlobalSchedulerStub(grpc.insecure_channel(target))
    deadline = time.monotonic() + timeout_s
    while True:
        current = [stub.GetWorkload(api.GetWorkloadRequest(id=i), timeout=10) for i in ids]
        if all(w.state in TERMINAL for w in current) or time.monotonic() > deadline:
            return current
        time.sleep(0.2)
