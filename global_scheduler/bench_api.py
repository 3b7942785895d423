"""``meridian bench api``: sustained SubmitWorkload load on a real server over loopback.

The global scheduler (gRPC server, router, dispatch to Redis) runs in its own process; ``clients``
processes each send an open-loop, paced stream of ``SubmitWorkload`` calls (asynchronous futures,
so a slow reply never slows the offered rate) for ``duration_s`` and record every call's latency.
Synthetic ``ClusterSummary`` entries describe ``clusters`` large clusters so the router always has
room. Afterwards every dispatch stream is read back: each accepted workload must appear exactly once.

``--hostile`` (:func:`run_hostile_api_bench`) measures, against one server in one run, the same paced
load twice: alone, then beside a hostile process that keeps ``watches`` idle watches open over several
tokens (re-opening each refused one every second), sends requests over the server's receive limit and
garbage bytes at fixed rates. A health check every 100 ms runs throughout and records misses and
latency. The headline is hostile throughput over clean throughput (target ≥ 0.90) with every health
check answered: hostile clients may cost CPU, but must not take the API's threads or stop it.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import redis as redis_py

    from global_scheduler.leadership import LeaderRecord


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
                 stats_q: mp.Queue, gil_switch_interval_ms: float | None, routing_process: bool,
                 api_extra: dict[str, Any] | None = None) -> None:
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

    settings = GlobalSchedulerSettings(api={"listen": "127.0.0.1:0", "max_workers": 16, "health_listen": "127.0.0.1:0",
                                            "gil_switch_interval_ms": gil_switch_interval_ms, **(api_extra or {})},
                                       bus={"url": redis_url, "key_prefix": prefix},
                                       routing={"policy": policy, "worker_process": routing_process},
                                       registry={"cluster_timeout_s": 3600.0, "forget_after_s": 7200.0})
    engine = GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=prefix))
    running = build_server(engine)
    port_q.put((running.port, running.health_port))
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
                 "watch_limit": settings.api.watch_limit, "max_watches_per_token": settings.api.max_watches_per_token,
                 "max_workers": settings.api.max_workers,
                 "streams_refused": running.streams.refused if running.streams else 0,
                 "undecodable_refused": running.undecodable.refused if running.undecodable else 0,
                 "switch_interval_ms": sys.getswitchinterval() * 1000, "gc_collections": len(gc_pauses),
                 "gc_pause_ms_max": max(gc_pauses, default=0.0) * 1000,
                 "gc_pause_ms_total": sum(gc_pauses) * 1000,
                 "gc_full_collections_at_s_ms": gc_full_at,
                 "gc_by_generation": {g: {"collections": len(p), "pause_ms_max": max(p, default=0.0) * 1000,
                                          "pause_ms_total": sum(p) * 1000} for g, p in gc_by_gen.items()}})
    running.stop(0.5)


class Pacer:
    """Open-loop pacing of a benchmark client: iterating waits until ``start_at`` (wall clock, so clients in
    several processes start together), then yields 0, 1, 2 … at ``n / rate`` seconds after :attr:`t_start`
    (``perf_counter``) for ``duration_s``, never waiting for answers; :attr:`sent` counts what it yielded."""

    def __init__(self, start_at: float, rate: float, duration_s: float) -> None:
        self.start_at, self.interval, self.duration_s = start_at, 1.0 / rate, duration_s
        self.t_start = time.perf_counter()
        self.sent = 0

    def __iter__(self) -> Iterator[int]:
        while time.time() < self.start_at:
            time.sleep(0.001)
        self.t_start = time.perf_counter()
        while (offset := self.sent * self.interval) < self.duration_s:
            delay = self.t_start + offset - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            yield self.sent
            self.sent += 1


def _client_main(port: int, rate: float, duration_s: float, index: int, start_at: float, out_q: mp.Queue,
                 token: str | None = None, phase: str = "") -> None:
    import grpc

    from protos import global_api_pb2 as api
    from protos import global_api_pb2_grpc as api_grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    stub = api_grpc.GlobalSchedulerStub(channel)
    metadata = (("authorization", f"Bearer {token}"),) if token else None
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
                sent_at.append(t0 - pacer.t_start)
                ids.append(w.id)
        except grpc.RpcError as exc:
            with lock:
                errors += 1
                code = exc.code().name if exc.code() else "UNKNOWN"
                error_codes[code] = error_codes.get(code, 0) + 1
        inflight.release()

    pacer = Pacer(start_at, rate, duration_s)
    for n in pacer:
        inflight.acquire()
        t0 = time.perf_counter()
        fut = stub.SubmitWorkload.future(api.SubmitWorkloadRequest(spec=spec, idempotency_key=f"{phase}c{index}-{n}"),
                                         timeout=30, metadata=metadata)
        fut.add_done_callback(lambda f, t0=t0: done(f, t0))
    for _ in range(512):
        inflight.acquire()
    channel.close()
    out_q.put({"latencies": latencies, "sent_at": sent_at, "ids": ids, "errors": errors, "error_codes": error_codes,
               "sent": pacer.sent, "elapsed": time.perf_counter() - pacer.t_start})


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


def remove_run_keys(redis_url: str, prefix: str) -> None:
    """Every key the run left under its private prefix (streams, events, workload store), and no other."""
    from meridian.bus.cleanup import delete_key_prefix
    from meridian.bus.connection import keyspace_client

    client = keyspace_client(redis_url)
    try:
        delete_key_prefix(client, prefix)
    finally:
        client.close()


def run_api_bench(*, redis_url: str, rate: float = 1200.0, duration_s: float = 10.0, clients: int = 2,
                  clusters: int = 10, policy: str = "gnn",
                  gil_switch_interval_ms: float | None = 0.5, routing_process: bool = True) -> ApiBenchResult:
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
        port, _health_port = port_q.get(timeout=120)
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
    bus.close()
    remove_run_keys(redis_url, prefix)
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
    res.__dict__["redis_key_prefix"] = prefix  # removed: nothing is left under it
    res.__dict__["latency_ms_p99_per_second"] = per_second_p99
    codes: Counter[str] = Counter()
    for r in results:
        codes.update(r["error_codes"])
    res.__dict__["error_codes"] = dict(codes)
    return res


# --- hostile mode ------------------------------------------------------------------------------------

CLEAN_TOKEN = "bench-clean"
TARGET_RATIO = 0.90


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    import psutil

    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def run_api_bench_on_primaries(sizes: Sequence[int], *, redis_url: str, progress: Callable[[str], object] = print,
                               **kwargs: Any) -> dict[str, dict[str, Any]]:
    """The same API load against the single Redis at ``redis_url``, then against local Redis Clusters of each size
    in ``sizes`` (no replicas), one after the other: where the API's ceiling is, and whether Redis is it. Each
    cluster run adds ``redis_cpu_pct``: each primary's CPU over the run, in % of one core."""
    from meridian.local_redis_cluster import LocalRedisCluster

    runs: dict[str, dict[str, Any]] = {}
    progress("one Redis …")
    runs["redis"] = run_api_bench(redis_url=redis_url, **kwargs).as_dict()
    for n in sizes:
        progress(f"Redis Cluster, {n} primar{'y' if n == 1 else 'ies'} …")
        cluster = LocalRedisCluster(primaries=n, replicas=0).start()
        try:
            pids = [p.pid for p in cluster.procs.values()]
            before, t0 = [_cpu_seconds(pid) for pid in pids], time.monotonic()
            d = run_api_bench(redis_url=cluster.url, **kwargs).as_dict()
            wall = time.monotonic() - t0
            d["redis_cpu_pct"] = [round(100 * (_cpu_seconds(pid) - b) / wall, 1) for pid, b in zip(pids, before,
                                                                                                   strict=True)]
            runs[f"cluster-{n}"] = d
        finally:
            cluster.stop()
    return runs


def _hostile_main(port: int, wid: str, watches: int, tokens: list[str], oversized_per_s: float,
                  garbage_per_s: float, oversized_bytes: int, ready_q: mp.Queue, stop_ev: mp.Event,
                  out_q: mp.Queue) -> None:
    """Idle watches (each refused one re-opened every second), oversized requests and garbage bytes."""
    client = _HostileClient(port, tokens, stop_ev)
    send_oversized = client.oversized_sender(oversized_bytes)
    threads = [threading.Thread(target=client.watch, args=(i, wid), daemon=True) for i in range(watches)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    for _ in range(watches):  # every watch tried once: the open ones hold their slots
        client.tried.acquire(timeout=max(0.0, deadline - time.monotonic()))
    senders = [threading.Thread(target=client.paced, args=(oversized_per_s, send_oversized), daemon=True),
               threading.Thread(target=client.paced, args=(garbage_per_s, client.send_garbage), daemon=True)]
    for t in senders:
        t.start()
    with client.lock:
        ready_q.put({"watches_open": client.stats["watches_open"]})
    stop_ev.wait()
    for t in senders:
        t.join(timeout=5)
    for call in list(client.calls.values()):
        call.cancel()
    for t in threads:
        t.join(timeout=5)
    until = time.monotonic() + 10
    while client.inflight > 0 and time.monotonic() < until:  # every answer counted, none cancelled by close()
        time.sleep(0.05)
    client.channel.close()
    with client.lock:
        client.stats["cpu_s"] = time.process_time()  # what the attack cost the machine the server shares
        out_q.put({k: (dict(v) if isinstance(v, Counter) else v) for k, v in client.stats.items()})


class _HostileClient:
    """The hostile process's channel to the server and the tally of what the server answered each attack."""

    def __init__(self, port: int, tokens: list[str], stop_ev: mp.Event) -> None:
        import grpc

        from protos import global_api_pb2 as api
        from protos import global_api_pb2_grpc as api_grpc

        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}",
                                             options=[("grpc.max_send_message_length", 64 * 2**20)])
        self.stub = api_grpc.GlobalSchedulerStub(self.channel)
        self.tokens = tokens
        self.stop_ev = stop_ev
        self.lock = threading.Lock()
        self.stats: dict[str, Any] = {"watches_open": 0, "watches_open_max": 0, "watch_attempts": 0,
                                      "watch_refusals": 0, "watch_codes": Counter(), "oversized_sent": 0,
                                      "oversized_codes": Counter(), "garbage_sent": 0, "garbage_codes": Counter()}
        self.calls: dict[int, Any] = {}
        self.tried = threading.Semaphore(0)  # released once per watch, after its first attempt
        self.inflight = 0  # oversized and garbage calls not answered yet
        service = api.DESCRIPTOR.services_by_name["GlobalScheduler"].full_name
        self.raw_submit = self.channel.unary_unary(f"/{service}/SubmitWorkload")
        self.clean_metadata = (("authorization", f"Bearer {tokens[0]}"),)

    def watch(self, i: int, wid: str) -> None:
        """Watch ``wid`` with token ``i`` (round robin), holding the watch open; re-open a refused or
        ended one every second until stopped."""
        import grpc

        from protos import global_api_pb2 as api

        metadata = (("authorization", f"Bearer {self.tokens[i % len(self.tokens)]}"),)
        first_try = True
        while not self.stop_ev.is_set():
            call = self.stub.WatchWorkload(api.WatchWorkloadRequest(id=wid), metadata=metadata)
            self.calls[i] = call
            opened = False
            try:
                for _ in call:
                    if not opened:
                        opened = True
                        self._opened()
                        if first_try:
                            first_try = False
                            self.tried.release()
            except grpc.RpcError as exc:
                self._refused(exc.code().name if exc.code() else "UNKNOWN", opened=opened)
            finally:
                if opened:
                    with self.lock:
                        self.stats["watches_open"] -= 1
            if first_try:
                first_try = False
                self.tried.release()
            self.stop_ev.wait(1.0)

    def _opened(self) -> None:
        with self.lock:
            self.stats["watch_attempts"] += 1
            self.stats["watches_open"] += 1
            self.stats["watches_open_max"] = max(self.stats["watches_open_max"], self.stats["watches_open"])

    def _refused(self, code: str, *, opened: bool) -> None:
        with self.lock:
            if not opened:
                self.stats["watch_attempts"] += 1
            self.stats["watch_codes"][code] += 1
            if code == "RESOURCE_EXHAUSTED":
                self.stats["watch_refusals"] += 1

    def paced(self, rate: float, send: Callable[[], None]) -> None:
        """``send()`` ``rate`` times a second until stopped; nothing at a rate of 0."""
        if rate <= 0:
            return
        t0, n = time.perf_counter(), 0
        while not self.stop_ev.is_set():
            delay = t0 + n / rate - time.perf_counter()
            if delay > 0:
                self.stop_ev.wait(delay)
            send()
            n += 1

    def _counted(self, key: str) -> Callable[[Any], None]:
        def done(fut: Any) -> None:
            exc = fut.exception()
            code = "OK" if exc is None else (exc.code().name if exc.code() else "UNKNOWN")
            with self.lock:
                self.stats[key][code] += 1
                self.inflight -= 1
        return done

    def _send_raw(self, payload: bytes, kind: str) -> None:
        with self.lock:
            self.stats[f"{kind}_sent"] += 1
            self.inflight += 1
        self.raw_submit.future(payload, metadata=self.clean_metadata, timeout=10).add_done_callback(
            self._counted(f"{kind}_codes"))

    def oversized_sender(self, oversized_bytes: int) -> Callable[[], None]:
        """What sends one request over the receive limit (refused by the transport), as raw bytes built once:
        a spec padded with a field the schema does not know (field 1000, length-delimited), inside
        SubmitWorkloadRequest.spec (1)."""
        from protos import global_api_pb2 as api

        spec = api.WorkloadSpec(name="x", tenant="t", replicas=1, requests=api.ResourceQuantities(cpu="1"))
        spec_bytes = spec.SerializeToString() + length_delimited_field(1000, b"x" * oversized_bytes)
        oversized_payload = length_delimited_field(1, spec_bytes)
        return lambda: self._send_raw(oversized_payload, "oversized")

    def send_garbage(self) -> None:
        self._send_raw(b"\xff\xff\xff", "garbage")


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def length_delimited_field(number: int, payload: bytes) -> bytes:
    """Field ``number`` holding ``payload`` on the wire, whether or not the schema knows it (a newer or
    hostile client's unknown field; no message class builds one of any size)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


class HealthProber:
    """A health Check every ``interval_s`` on its own channel, each recorded (latency, or None for a miss:
    an error, a timeout or not SERVING) under the phase set when it was sent; no phase, no probe."""

    def __init__(self, target: str, *, interval_s: float = 0.1, timeout_s: float = 1.0) -> None:
        self.target = target
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.phase: str | None = None
        self.records: dict[str, list[float | None]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="health-prober", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        import grpc
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        channel = grpc.insecure_channel(self.target)
        stub = health_pb2_grpc.HealthStub(channel)
        next_at = time.monotonic()
        while not self._stop.is_set():
            phase = self.phase
            if phase is not None:
                t0 = time.perf_counter()
                try:
                    ok = stub.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout_s).status == \
                        health_pb2.HealthCheckResponse.SERVING
                except grpc.RpcError:
                    ok = False
                self.records.setdefault(phase, []).append((time.perf_counter() - t0) * 1000 if ok else None)
            next_at = max(next_at + self.interval_s, time.monotonic())
            self._stop.wait(next_at - time.monotonic())
        channel.close()

    def summary(self, phase: str) -> dict[str, Any]:
        records = self.records.get(phase, [])
        answered = np.array([r for r in records if r is not None]) if records else np.zeros(0)
        lat = answered if answered.size else np.zeros(1)
        return {"probes": len(records), "answered": int(answered.size), "missed": len(records) - int(answered.size),
                "latency_ms_p50": float(np.percentile(lat, 50)), "latency_ms_p99": float(np.percentile(lat, 99)),
                "latency_ms_max": float(lat.max())}


def _run_phase(ctx: Any, port: int, *, rate: float, duration_s: float, clients: int, phase: str,
               prober: HealthProber) -> dict[str, Any]:
    """The paced SubmitWorkload load of ``run_api_bench`` with the clean token; its figures and accepted ids."""
    out_q: mp.Queue = ctx.Queue()
    start_at = time.time() + 2.0
    procs = [ctx.Process(target=_client_main, args=(port, rate / clients, duration_s, i, start_at, out_q,
                                                    CLEAN_TOKEN, f"{phase}-"), daemon=True)
             for i in range(clients)]
    for p in procs:
        p.start()
    time.sleep(max(0.0, start_at - time.time()))
    prober.phase = phase
    results = [out_q.get(timeout=duration_s + 180) for _ in procs]
    prober.phase = None
    for p in procs:
        p.join(timeout=10)
    latencies = np.concatenate([np.array(r["latencies"]) for r in results]) * 1000
    lat = latencies if latencies.size else np.zeros(1)
    elapsed = max(r["elapsed"] for r in results)
    ids = [i for r in results for i in r["ids"]]
    codes: Counter[str] = Counter()
    for r in results:
        codes.update(r["error_codes"])
    return {"sent": sum(r["sent"] for r in results), "accepted": len(ids), "errors": sum(r["errors"] for r in results),
            "error_codes": dict(codes), "elapsed_s": elapsed, "throughput_per_s": len(ids) / elapsed if elapsed else 0.0,
            "latency_ms_p50": float(np.percentile(lat, 50)), "latency_ms_p99": float(np.percentile(lat, 99)),
            "latency_ms_max": float(lat.max()), "ids": ids}


def run_hostile_api_bench(*, redis_url: str, rate: float = 1000.0, duration_s: float = 10.0, clients: int = 2,
                          clusters: int = 10, policy: str = "gnn", watches: int = 100, watch_tokens: int = 10,
                          oversized_per_s: float = 20.0, garbage_per_s: float = 100.0, probe_interval_s: float = 0.1,
                          gil_switch_interval_ms: float | None = 0.5, routing_process: bool = True) -> dict[str, Any]:
    """Clean, then hostile, paced load on one server (module docstring); a JSON-ready result."""
    from global_scheduler.settings import ApiSettings

    prefix = f"bench-api-{uuid.uuid4().hex[:8]}:"
    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    stats_q: mp.Queue = ctx.Queue()
    ready_q: mp.Queue = ctx.Queue()
    mix_q: mp.Queue = ctx.Queue()
    stop_ev, hostile_stop = ctx.Event(), ctx.Event()
    hostile_tokens = [f"bench-hostile-{i}" for i in range(watch_tokens)]
    oversized_bytes = ApiSettings().max_receive_message_bytes + 64 * 1024
    publish_clusters(redis_url, prefix, clusters)
    server = ctx.Process(target=_server_main, args=(redis_url, prefix, policy, port_q, stop_ev, stats_q,
                                                    gil_switch_interval_ms, routing_process,
                                                    {"auth_tokens": [CLEAN_TOKEN, *hostile_tokens]}))
    server.start()
    hostile: Any = None
    try:
        port, health_port = port_q.get(timeout=120)
        time.sleep(1.5)  # the registry reads the summaries
        watched = _submit_watched(port)
        # The kubelet's view: the health-only port (api.health_listen), as deploy/ configures its probes.
        prober = HealthProber(f"127.0.0.1:{health_port}", interval_s=probe_interval_s)
        prober.start()
        clean = _run_phase(ctx, port, rate=rate, duration_s=duration_s, clients=clients, phase="clean", prober=prober)
        hostile = ctx.Process(target=_hostile_main, args=(port, watched, watches, hostile_tokens, oversized_per_s,
                                                          garbage_per_s, oversized_bytes, ready_q, hostile_stop,
                                                          mix_q), daemon=True)
        hostile.start()
        ready = ready_q.get(timeout=120)
        attacked = _run_phase(ctx, port, rate=rate, duration_s=duration_s, clients=clients, phase="hostile",
                              prober=prober)
        hostile_stop.set()
        mix = mix_q.get(timeout=120)
        hostile.join(timeout=10)
        prober.stop()
        stop_ev.set()
        stats = stats_q.get(timeout=180)
        server.join(timeout=30)
    finally:
        for proc in (hostile, server):
            if proc is not None and proc.is_alive():
                proc.terminate()
                proc.join(timeout=10)
    seen = _places_per_workload(redis_url, prefix, clusters)
    remove_run_keys(redis_url, prefix)
    accepted = {*clean.pop("ids"), *attacked.pop("ids"), watched}
    ratio = attacked["throughput_per_s"] / clean["throughput_per_s"] if clean["throughput_per_s"] else 0.0
    return {
        "mode": "hostile", "offered_per_s": rate, "duration_s": duration_s, "clients": clients, "clusters": clusters,
        "policy": policy, "routing_process": routing_process, "cpu_count": os.cpu_count(),
        "clean": clean, "hostile": attacked, "ratio": ratio, "target_ratio": TARGET_RATIO,
        "ratio_met": ratio >= TARGET_RATIO,
        "health": {"interval_ms": probe_interval_s * 1000, "clean": prober.summary("clean"),
                   "hostile": prober.summary("hostile")},
        "hostile_mix": {"watches": watches, "watch_tokens": watch_tokens, "oversized_bytes": oversized_bytes,
                        "oversized_per_s": oversized_per_s, "garbage_per_s": garbage_per_s,
                        "watches_open_when_load_started": ready["watches_open"], **mix},
        "server": {k: stats[k] for k in ("max_workers", "watch_limit", "max_watches_per_token", "streams_refused",
                                         "undecodable_refused", "pending")},
        "dispatch": {"accepted": len(accepted), "dispatched_unique": len(seen),
                     "duplicates": sum(c - 1 for c in seen.values() if c > 1), "missing": len(accepted - set(seen))},
    }


def _submit_watched(port: int) -> str:
    """The workload the hostile watches follow: dispatched to a synthetic cluster, never terminal; its id."""
    import grpc

    from protos import global_api_pb2 as api
    from protos import global_api_pb2_grpc as api_grpc

    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        return api_grpc.GlobalSchedulerStub(channel).SubmitWorkload(
            api.SubmitWorkloadRequest(spec=api.WorkloadSpec(name="watched", tenant="bench", replicas=1,
                                                            requests=api.ResourceQuantities(cpu="1"))),
            metadata=(("authorization", f"Bearer {CLEAN_TOKEN}"),), timeout=30).id


def _places_per_workload(redis_url: str, prefix: str, clusters: int) -> Counter[str]:
    """How many place messages each workload has in the run's dispatch streams."""
    from meridian.bus import dispatch_stream, open_bus
    from protos import dispatch_pb2 as dpb

    bus = open_bus(redis_url, key_prefix=prefix)
    seen: Counter[str] = Counter()
    for i in range(clusters):
        for entry in bus.read_range(dispatch_stream(f"bench-{i}")):
            msg = dpb.DispatchMessage.FromString(entry.payload)
            if msg.WhichOneof("action") == "place":
                seen[msg.place.workload_id] += 1
    bus.close()
    return seen


# --- high availability: two replicas, the leader killed mid-run ----------------------------------------


def _ha_server_main(index: int, redis_url: str, prefix: str, policy: str, port_q: mp.Queue, stop_ev: mp.Event,
                    stats_q: mp.Queue, gil_switch_interval_ms: float | None, routing_process: bool,
                    ha: dict[str, Any]) -> None:
    """One replica (``ha.enabled``) of the global scheduler; reports its port, and, when stopped, its figures."""
    import torch

    torch.set_num_threads(1)
    from global_scheduler.leadership import Replica
    from global_scheduler.scheduler import GlobalScheduler
    from global_scheduler.server import build_server
    from global_scheduler.settings import GlobalSchedulerSettings
    from meridian.bus import open_bus

    settings = GlobalSchedulerSettings(api={"listen": "127.0.0.1:0", "max_workers": 16,
                                            "gil_switch_interval_ms": gil_switch_interval_ms},
                                       bus={"url": redis_url, "key_prefix": prefix},
                                       routing={"policy": policy, "worker_process": routing_process},
                                       registry={"cluster_timeout_s": 3600.0, "forget_after_s": 7200.0},
                                       ha={"enabled": True, **ha})
    replica = Replica.from_settings(settings, make_engine=lambda fence: GlobalScheduler(
        settings=settings, bus=open_bus(redis_url, key_prefix=prefix), fence=fence))
    running = build_server(None, settings, replica=replica)
    port_q.put((index, running.port, os.getpid()))
    stop_ev.wait()
    deadline = time.time() + 120
    while time.time() < deadline:  # drain: the leader has dispatched everything accepted
        if replica.leading() and replica.engine.store.counts_by_state().get(1, 0) == 0:
            break
        time.sleep(0.2)
    engine = replica.engine
    stats_q.put({"index": index, "leading": replica.leading(), "terms": replica.elector.terms,
                 "became_leader_unix_s": replica.became_leader_at, "restore_s": replica.restore_s,
                 "stored": len(engine.store), "dispatched_total": engine.dispatched_total,
                 "pending": engine.store.counts_by_state().get(1, 0), "fence_refused": replica.fence.refused,
                 "ids": [w.id for w in engine.store.list(limit=10**9)[0]],  # what its API holds (ListWorkloads)
                 "dispatched_ids": [wid for wid, _, _ in engine.store.dispatched()]})
    running.stop(0.5)


def _ha_client_main(ports: list[int], rate: float, duration_s: float, index: int, start_at: float,
                    out_q: mp.Queue) -> None:
    """Open-loop paced submissions to ``ports[index % 2]``; after a failed call the client sends to the other
    replica (as a load balancer would). Each call is recorded: (sent, done) wall times, ok, id or code."""
    import grpc

    from protos import global_api_pb2 as api
    from protos import global_api_pb2_grpc as api_grpc

    stubs = []
    channels = []
    for port in ports:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        channels.append(channel)
        stubs.append(api_grpc.GlobalSchedulerStub(channel))
    target = [index % len(ports)]
    lock = threading.Lock()
    inflight = threading.Semaphore(512)
    calls: list[tuple[float, float, bool, str]] = []
    spec = api.WorkloadSpec(name="bench", tenant=f"tenant-{index}", replicas=2,
                            requests=api.ResourceQuantities(cpu="500m", memory="1Gi"))

    def done(fut: Any, t0: float, used: int) -> None:
        t1 = time.time()
        try:
            record = (t0, t1, True, fut.result().id)
        except grpc.RpcError as exc:
            record = (t0, t1, False, exc.code().name if exc.code() else "UNKNOWN")
            with lock:
                if target[0] == used:
                    target[0] = (used + 1) % len(stubs)
        with lock:
            calls.append(record)
        inflight.release()

    pacer = Pacer(start_at, rate, duration_s)
    for n in pacer:
        inflight.acquire()
        with lock:
            used = target[0]
        t0 = time.time()
        fut = stubs[used].SubmitWorkload.future(
            api.SubmitWorkloadRequest(spec=spec, idempotency_key=f"ha-c{index}-{n}"), timeout=30)
        fut.add_done_callback(lambda f, t0=t0, used=used: done(f, t0, used))
    for _ in range(512):
        inflight.acquire()
    for channel in channels:
        channel.close()
    out_q.put({"calls": calls, "sent": pacer.sent, "elapsed": time.perf_counter() - pacer.t_start})


def _latency_window(ok: list[Any], lo: float, hi: float) -> dict[str, float | int]:
    """p50/p99 (ms) of the acknowledged calls (sent, answered, …) sent in [lo, hi)."""
    ms = np.array([(c[1] - c[0]) * 1000 for c in ok if lo <= c[0] < hi])
    if not ms.size:
        return {"calls": 0}
    return {"calls": int(ms.size), "p50": float(np.percentile(ms, 50)), "p99": float(np.percentile(ms, 99))}


def run_ha_api_bench(*, redis_url: str, rate: float = 500.0, duration_s: float = 10.0, clients: int = 2,
                     clusters: int = 10, policy: str = "gnn", kill_leader_at: float = 0.5,
                     lease_duration_s: float = 5.0, gil_switch_interval_ms: float | None = 0.5,
                     routing_process: bool = True) -> dict[str, Any]:
    """Two replicas, clients on both, the leader ``kill -9``-ed at ``kill_leader_at`` of the run. Reports
    accepted (acknowledged workloads), lost (acknowledged, absent from the surviving replica's API), missing
    (acknowledged, no place published) and of those unpublished_at_kill (DISPATCHED in the store: made durable
    by the killed leader, not yet published when it died; reconciliation's case), dispatched_twice (a workload with places of two attempts, or of one attempt on two clusters: nothing is
    rerouted in this run), failover_s (kill → the survivor holds the lock; and → the first submission sent
    after the kill acknowledged) and the submissions that failed."""
    if not 0.0 < kill_leader_at < 1.0:
        raise ValueError(f"kill_leader_at is a fraction of the run, in (0, 1): {kill_leader_at}")
    ha = {"lease_duration_s": lease_duration_s, "renew_deadline_s": 0.7 * lease_duration_s,
          "retry_period_s": 0.1 * lease_duration_s}
    prefix = f"bench-api-{uuid.uuid4().hex[:8]}:"
    publish_clusters(redis_url, prefix, clusters)
    run = _run_ha(redis_url=redis_url, prefix=prefix, rate=rate, duration_s=duration_s, clients=clients,
                  policy=policy, kill_leader_at=kill_leader_at, ha=ha,
                  gil_switch_interval_ms=gil_switch_interval_ms, routing_process=routing_process)
    places, entries = _places_by_attempt(redis_url, prefix, clusters)
    remove_run_keys(redis_url, prefix)
    return {
        "mode": "ha-kill-leader", "offered_per_s": rate, "duration_s": duration_s, "clients": clients,
        "clusters": clusters, "policy": policy, "routing_process": routing_process, "cpu_count": os.cpu_count(),
        "kill_leader_at": kill_leader_at, "lease_duration_s": lease_duration_s, **{f"ha_{k}": v for k, v in ha.items()},
        **_ha_outcome(run, places, entries),
        "redis_key_prefix": prefix,
    }


@dataclass
class _HaRun:
    """What the HA run's processes reported: every client's calls, the kill, and the survivor's figures."""

    results: list[dict[str, Any]]
    killed: int
    killed_at: float
    lock_taken_at: float | None
    stats: dict[str, Any]
    held: set[str]  # every workload the survivor holds
    dispatched_held: set[str]


def _run_ha(*, redis_url: str, prefix: str, rate: float, duration_s: float, clients: int, policy: str,
            kill_leader_at: float, ha: dict[str, float], gil_switch_interval_ms: float | None,
            routing_process: bool) -> _HaRun:
    """Two replicas and the clients; the leader killed at ``kill_leader_at`` of the run, the survivor stopped
    once the clients are done."""
    from global_scheduler.leadership import LOCK_KEY, LeaderRecord
    from meridian.bus import redis_client

    ctx = mp.get_context("spawn")
    port_q: mp.Queue = ctx.Queue()
    stats_q: mp.Queue = ctx.Queue()
    out_q: mp.Queue = ctx.Queue()
    # One event per replica: setting an Event another process waits on waits for every waiter to wake, and a
    # killed waiter never does.
    stop_evs = [ctx.Event(), ctx.Event()]
    servers = [ctx.Process(target=_ha_server_main, args=(i, redis_url, prefix, policy, port_q, stop_evs[i], stats_q,
                                                         gil_switch_interval_ms, routing_process, ha))
               for i in range(2)]
    for s in servers:
        s.start()
    lock_client: redis_py.Redis = redis_client(redis_url, socket_timeout=2)
    lock_key = prefix + LOCK_KEY

    def holder() -> LeaderRecord | None:
        return LeaderRecord.parse(lock_client.get(lock_key))

    try:
        ports: dict[int, int] = {}
        for _ in servers:
            index, port, _pid = port_q.get(timeout=180)
            ports[index] = port
        by_address = {f"127.0.0.1:{p}": i for i, p in ports.items()}
        _wait_for_leader(holder, by_address)
        time.sleep(1.5)  # the leader's registry reads the summaries
        start_at = time.time() + 2.0
        port_list = [ports[0], ports[1]]
        procs = [ctx.Process(target=_ha_client_main, args=(port_list, rate / clients, duration_s, i, start_at, out_q),
                             daemon=True) for i in range(clients)]
        for p in procs:
            p.start()
        kill_at = start_at + kill_leader_at * duration_s
        time.sleep(max(0.0, kill_at - time.time()))
        killed, killed_at, lock_taken_at = _kill_leader(holder, by_address, servers)
        results = [out_q.get(timeout=duration_s + 240) for _ in procs]
        for p in procs:
            p.join(timeout=10)
        survivor = 1 - killed
        stop_evs[survivor].set()
        stats = stats_q.get(timeout=180)
        held = set(stats.pop("ids"))
        dispatched_held = set(stats.pop("dispatched_ids"))
        servers[survivor].join(timeout=30)
    finally:
        for s in servers:
            if s.is_alive():
                s.terminate()
                s.join(timeout=10)
        lock_client.close()
    return _HaRun(results=results, killed=killed, killed_at=killed_at, lock_taken_at=lock_taken_at, stats=stats,
                  held=held, dispatched_held=dispatched_held)


def _wait_for_leader(holder: Callable[[], LeaderRecord | None], by_address: dict[str, int]) -> None:
    """Until one of the replicas holds the lock (a minute at most)."""
    deadline = time.time() + 60
    while (first := holder()) is None or first.advertise not in by_address:
        if time.time() > deadline:
            raise RuntimeError("no leader was elected")
        time.sleep(0.05)


def _kill_leader(holder: Callable[[], LeaderRecord | None], by_address: dict[str, int],
                 servers: list[Any]) -> tuple[int, float, float | None]:
    """``kill -9`` the replica holding the lock; returns its index, when it was killed and when another
    epoch took the lock (None when none did within 120 s)."""
    leader_before = holder()
    assert leader_before is not None
    killed = by_address[leader_before.advertise]
    victim = servers[killed]
    assert victim.pid is not None
    os.kill(victim.pid, 9)
    killed_at = time.time()
    lock_taken_at = None
    while time.time() < killed_at + 120:
        now = holder()
        if now is not None and now.epoch > leader_before.epoch:
            lock_taken_at = time.time()
            break
        time.sleep(0.01)
    return killed, killed_at, lock_taken_at


def _places_by_attempt(redis_url: str, prefix: str, clusters: int) -> tuple[dict[str, dict[int, set[str]]], int]:
    """The run's place messages: workload → attempt → the clusters it was placed on; and how many there were."""
    from meridian.bus import dispatch_stream, open_bus
    from protos import dispatch_pb2 as dpb

    bus = open_bus(redis_url, key_prefix=prefix)
    places: dict[str, dict[int, set[str]]] = {}
    entries = 0
    for i in range(clusters):
        cluster = f"bench-{i}"
        for entry in bus.read_range(dispatch_stream(cluster)):
            msg = dpb.DispatchMessage.FromString(entry.payload)
            if msg.WhichOneof("action") == "place":
                places.setdefault(msg.place.workload_id, {}).setdefault(msg.place.attempt, set()).add(cluster)
                entries += 1
    bus.close()
    return places, entries


def _ha_outcome(run: _HaRun, places: dict[str, dict[int, set[str]]], entries: int) -> dict[str, Any]:
    """The HA run's figures from the clients' calls, the survivor's store and the dispatch streams."""
    killed_at = run.killed_at
    calls = [c for r in run.results for c in r["calls"]]
    ok = [c for c in calls if c[2]]
    failed = [c for c in calls if not c[2]]
    accepted = {c[3] for c in ok}
    after = sorted(c[1] for c in ok if c[0] >= killed_at)
    twice = sorted(wid for wid, by_attempt in places.items()
                   if len(by_attempt) > 1 or any(len(where) > 1 for where in by_attempt.values()))
    lat = np.array([(c[1] - c[0]) * 1000 for c in ok]) if ok else np.zeros(1)
    elapsed = max(r["elapsed"] for r in run.results)
    codes = Counter(c[3] for c in failed)
    recovered_at = after[0] if after else float("inf")

    def window(lo: float, hi: float) -> dict[str, float | int]:
        return _latency_window(ok, lo, hi)

    return {
        "sent": sum(r["sent"] for r in run.results), "accepted": len(accepted), "errors": len(failed),
        "error_codes": dict(codes),
        "errors_after_kill": sum(1 for c in failed if c[1] >= killed_at),
        "lost": len(accepted - run.held), "dispatched_entries": entries, "dispatched_unique": len(places),
        "dispatched_twice": len(twice), "dispatched_twice_ids": twice[:20],
        "missing": len(accepted - set(places)),
        # Made durable by the leader that was killed before its answer reached the client (counted among the
        # errors): not lost, and dispatched once like any other; a client retrying with its key gets it.
        "dispatched_unacknowledged": len(set(places) - accepted),
        # Made durable (DISPATCHED) by the killed leader, which died before publishing them: the crash between
        # the durable write and the publish that reconciliation heals (same attempt) once a summary made after
        # reconcile.grace_s shows the cluster does not hold them (this run's synthetic clusters report once).
        "unpublished_at_kill": len((accepted - set(places)) & run.dispatched_held),
        "lock_takeover_s": None if run.lock_taken_at is None else run.lock_taken_at - killed_at,
        "failover_s": after[0] - killed_at if after else None,
        "throughput_per_s": len(ok) / elapsed if elapsed else 0.0,
        "latency_ms_p50": float(np.percentile(lat, 50)), "latency_ms_p99": float(np.percentile(lat, 99)),
        "latency_ms_max": float(lat.max()), "killed_replica": run.killed,
        # Acknowledged calls' latency (ms) by when they were sent: before the kill, during the failover, after it.
        "latency_ms_by_phase": {"before_kill": window(0.0, killed_at), "failover": window(killed_at, recovered_at),
                                "after_failover": window(recovered_at, float("inf"))},
        "survivor": {k: v for k, v in run.stats.items() if k != "index"},
    }
