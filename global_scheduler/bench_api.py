"""``meridian bench api``: sustained SubmitWorkload load on a real server over loopback.

The global scheduler (gRPC server, router, dispatch to Redis) runs in its own process; ``clients``
processes each send an open-loop, paced stream of ``SubmitWorkload`` calls (asynchronous futures,
so a slow reply never slows the offered rate) for ``duration_s`` and record every call's latency.
Synthetic ``ClusterSummary`` entries describe ``clusters`` large clusters so the router always has
room. Afterwards every dispatch stream is read back: each accepted workload must appear exactly once.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class ApiBenchResult:
    offered_per_s: float
    accepted: int
    errors: int
    duration_s: float
    throughput_per_s: float
    latency_ms_p50: float
    latency_ms_p99: float
    latency_ms_max: float
    dispatched_entries: int
    dispatched_unique: int
    duplicates: int
    missing: int
    policy: str
    clients: int
    clusters: int
    routing_process: bool

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _server_main(redis_url: str, prefix: str, policy: str, port_q: mp.Queue, stop_ev: mp.Event,
                 stats_q: mp.Queue, gil_switch_interval_ms: float | None, routing_process: bool) -> None:
    import gc
    import sys

    import torch

    if os.environ.get("MERIDIAN_BENCH_GC") == "off":
        gc.disable()
    # Every collection's pause, to tell garbage-collection stalls from thread scheduling in the tail.
    gc_pauses: list[float] = []
    gc_by_gen: dict[int, list[float]] = {0: [], 1: [], 2: []}
    gc_start = [0.0]
    gc_full_at: list[tuple[float, float]] = []  # (seconds since the server process started, pause ms)
    t_boot = time.perf_counter()

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            gc_start[0] = time.perf_counter()
        else:
            gc_pauses.append(time.perf_counter() - gc_start[0])
            gc_by_gen[info["generation"]].append(gc_pauses[-1])
            if info["generation"] == 2:
                gc_full_at.append((round(gc_start[0] - t_boot, 2), round(gc_pauses[-1] * 1000, 1)))

    gc.callbacks.append(on_gc)

    torch.set_num_threads(1)
    from global_scheduler.scheduler import GlobalScheduler
    from global_scheduler.server import build_server
    from global_scheduler.settings import GlobalSchedulerSettings
    from meridian.bus import open_bus

    settings = GlobalSchedulerSettings(api={"listen": "127.0.0.1:0", "max_workers": 16,
                                            "gil_switch_interval_ms": gil_switch_interval_ms},
                                       bus={"url": redis_url, "key_prefix": prefix},
                                       routing={"policy": policy, "worker_process": routing_process},
                                       registry={"cluster_timeout_s": 3600.0})
    engine = GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=prefix))
    running = build_server(engine)
    port_q.put(running.port)
    stop_ev.wait()
    # Drain: wait until the router has dispatched everything accepted.
    deadline = time.time() + 120
    while time.time() < deadline:
        counts = engine.store.counts_by_state()
        if counts.get(1, 0) == 0:  # nothing PENDING
            break
        time.sleep(0.2)
    ms = np.array(engine.decision_seconds) * 1000 if engine.decision_seconds else np.zeros(1)
    lag = np.array(engine.dispatch_lag_seconds) * 1000 if engine.dispatch_lag_seconds else np.zeros(1)
    stats_q.put({"routing_worker_pid": engine.worker.pid if engine.worker else None,
                 "routing_worker_restarts": engine.worker.restarts if engine.worker else 0,
                 "stored": len(engine.store), "dispatched_total": engine.dispatched_total,
                 "pending": engine.store.counts_by_state().get(1, 0),
                 "decision_ms_p50": float(np.percentile(ms, 50)), "decision_ms_p99": float(np.percentile(ms, 99)),
                 "dispatch_lags": len(engine.dispatch_lag_seconds),
                 "dispatch_lag_ms_p50": float(np.percentile(lag, 50)),
                 "dispatch_lag_ms_p99": float(np.percentile(lag, 99)), "dispatch_lag_ms_max": float(lag.max()),
                 "switch_interval_ms": sys.getswitchinterval() * 1000, "gc_collections": len(gc_pauses),
                 "gc_pause_ms_max": max(gc_pauses, default=0.0) * 1000,
                 "gc_pause_ms_total": sum(gc_pauses) * 1000,
                 "gc_full_collections_at_s_ms": gc_full_at,
                 "gc_by_generation": {g: {"collections": len(p), "pause_ms_max": max(p, default=0.0) * 1000,
                                          "pause_ms_total": sum(p) * 1000} for g, p in gc_by_gen.items()}})
    running.stop(0.5)


def _client_main(port: int, rate: float, duration_s: float, index: int, start_at: float, out_q: mp.Queue) -> None:
    import grpc

    from protos import global_api_pb2 as api
    from protos import global_api_pb2_grpc as api_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = api_grpc.GlobalSchedulerStub(channel)
    latencies: list[float] = []
    ids: list[str] = []
    errors = 0
    lock = threading.Lock()
    inflight = threading.Semaphore(512)
    spec = api.WorkloadSpec(name="bench", tenant=f"tenant-{index}", replicas=2,
                            requests=api.ResourceQuantities(cpu="500m", memory="1Gi"))

    sent_at: list[float] = []
    error_codes: dict[str, int] = {}

    def done(fut: Any, t0: float) -> None:
        nonlocal errors
        dt = time.perf_counter() - t0
        try:
            w = fut.result()
            with lock:
                latencies.append(dt)
                sent_at.append(t0 - t_start)
                ids.append(w.id)
        except grpc.RpcError as exc:
            with lock:
                errors += 1
                code = exc.code().name if exc.code() else "UNKNOWN"
                error_codes[code] = error_codes.get(code, 0) + 1
        inflight.release()

    while time.time() < start_at:
        time.sleep(0.001)
    t_start = time.perf_counter()
    n = 0
    interval = 1.0 / rate
    while True:
        target = t_start + n * interval
        now = time.perf_counter()
        if target - t_start >= duration_s:
            break
        if target > now:
            time.sleep(target - now)
        inflight.acquire()
        t0 = time.perf_counter()
        fut = stub.SubmitWorkload.future(api.SubmitWorkloadRequest(spec=spec, idempotency_key=f"c{index}-{n}"),
                                         timeout=30)
        fut.add_done_callback(lambda f, t0=t0: done(f, t0))
        n += 1
    for _ in range(512):
        inflight.acquire()
    channel.close()
    out_q.put({"latencies": latencies, "sent_at": sent_at, "ids": ids, "errors": errors, "error_codes": error_codes,
               "sent": n,
               "elapsed": time.perf_counter() - t_start})


def publish_clusters(redis_url: str, prefix: str, clusters: int) -> None:
    from meridian.bus import SUMMARY_STREAM, open_bus
    from protos import telemetry_pb2 as tpb

    bus = open_bus(redis_url, key_prefix=prefix)
    regions = ["eu-north", "eu-central", "eu-west", "us-west", "uk-south", "sa-east"]
    for i in range(clusters):
        bus.publish(SUMMARY_STREAM, tpb.ClusterSummary(
            cluster=f"bench-{i}", region=regions[i % len(regions)], sequence=1, generated_unix_ms=int(time.time() * 1000),
            nodes_total=1000, nodes_schedulable=1000,
            allocatable=tpb.ResourceVector(milli_cpu=10**9, memory_bytes=2**60, gpu=1000),
            free=tpb.ResourceVector(milli_cpu=10**9, memory_bytes=2**60, gpu=1000), gpu_devices_idle=1000,
            max_node_free_milli_cpu=128_000, max_node_free_memory_bytes=2**40,
            carbon_g_per_kwh=20.0 + 40 * i, pue=1.2).SerializeToString())
    bus.close()


def run_api_bench(*, redis_url: str, rate: float = 1200.0, duration_s: float = 10.0, clients: int = 2,
                  clusters: int = 10, policy: str = "gnn",
                  gil_switch_interval_ms: float | None = 0.5, routing_process: bool = True) -> ApiBenchResult:
    from global_scheduler.store import WORKLOADS_KEY
    from meridian.bus import dispatch_stream, open_bus
    from protos import dispatch_pb2 as dpb

    prefix = f"bench-api-{uuid.uuid4().hex[:8]}:"
    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    stats_q: mp.Queue = ctx.Queue()
    out_q: mp.Queue = ctx.Queue()
    stop_ev = ctx.Event()
    publish_clusters(redis_url, prefix, clusters)
    # Not daemonic: a daemonic process may not start children, and the server starts its routing worker.
    server = ctx.Process(target=_server_main, args=(redis_url, prefix, policy, port_q, stop_ev, stats_q,
                                                            gil_switch_interval_ms, routing_process))
    server.start()
    try:
        port = port_q.get(timeout=120)
        time.sleep(1.5)  # the registry reads the summaries
        start_at = time.time() + 2.0
        procs = [ctx.Process(target=_client_main, args=(port, rate / clients, duration_s, i, start_at, out_q),
                             daemon=True) for i in range(clients)]
        for p in procs:
            p.start()
        results = [out_q.get(timeout=duration_s + 180) for _ in procs]
        for p in procs:
            p.join(timeout=10)
        stop_ev.set()
        stats = stats_q.get(timeout=180)
        server.join(timeout=30)
    finally:
        if server.is_alive():  # a failed run must not leave the server (and its routing worker) behind
            server.terminate()
            server.join(timeout=10)
    latencies = np.concatenate([np.array(r["latencies"]) for r in results]) * 1000
    sent_at = np.concatenate([np.array(r["sent_at"]) for r in results])
    per_second_p99 = [round(float(np.percentile(latencies[(sent_at >= s) & (sent_at < s + 1)], 99)), 1)
                      for s in range(int(duration_s)) if ((sent_at >= s) & (sent_at < s + 1)).any()]
    ids = [i for r in results for i in r["ids"]]
    errors = sum(r["errors"] for r in results)
    elapsed = max(r["elapsed"] for r in results)
    bus = open_bus(redis_url, key_prefix=prefix)
    seen: Counter[str] = Counter()
    entries = 0
    for i in range(clusters):
        for entry in bus.read_range(dispatch_stream(f"bench-{i}")):
            msg = dpb.DispatchMessage.FromString(entry.payload)
            if msg.WhichOneof("action") == "place":
                seen[msg.place.workload_id] += 1
                entries += 1
    accepted = set(ids)
    for i in range(clusters):
        bus.delete(dispatch_stream(f"bench-{i}"))
    bus.delete("meridian:summary", WORKLOADS_KEY)
    bus.close()
    lat = latencies if latencies.size else np.zeros(1)
    res = ApiBenchResult(
        offered_per_s=rate, accepted=len(accepted), errors=errors, duration_s=elapsed,
        throughput_per_s=len(ids) / elapsed if elapsed else 0.0,
        latency_ms_p50=float(np.percentile(lat, 50)), latency_ms_p99=float(np.percentile(lat, 99)),
        latency_ms_max=float(lat.max()), dispatched_entries=entries, dispatched_unique=len(seen),
        duplicates=sum(c - 1 for c in seen.values() if c > 1), missing=len(accepted - set(seen)),
        policy=policy, clients=clients, clusters=clusters, routing_process=routing_process)
    res.__dict__.update({"server_" + k: v for k, v in stats.items()})
    res.__dict__["cpu_count"] = os.cpu_count()
    res.__dict__["latency_ms_p99_per_second"] = per_second_p99
    codes: Counter[str] = Counter()
    for r in results:
        codes.update(r["error_codes"])
    res.__dict__["error_codes"] = dict(codes)
    return res
