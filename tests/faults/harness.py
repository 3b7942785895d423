"""Real processes for the fault suite: a private ``redis-server`` (optionally with an append-only file, so a
restart keeps its data), the global scheduler (``meridian global-scheduler``) and regional dispatch
workers (``python -m regional_scheduler.dispatch_worker``), each a subprocess that a test can
``kill -9`` and start again; a gRPC client that retries a submission with its idempotency key until
it is acknowledged; and readers of what the streams and the API hold, for the suite's invariants.

Timings are shortened through the components' own settings (environment variables), never by
patching: clusters report every 0.3 s and count as down after 10 s of silence (less where a test says),
consumers reclaim a dead consumer's pending entries after 1 s, reconciliation looks every 0.5 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import redis
from grpc_health.v1 import health_pb2, health_pb2_grpc

from meridian.bus import dispatch_stream
from meridian.envtest import wait_for
from protos import dispatch_pb2 as dpb
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from protos import telemetry_pb2 as tpb
from tests.redis_helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
REDIS_PASSWORD = "fault-suite"
RETRYABLE = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


# ------------------------------------------------------------------ Redis


@dataclass
class Redis:
    """A private redis-server on a free port. ``appendonly``: every write is in the append-only file
    (fsync always) before Redis answers, so a kill -9 and restart keeps it."""

    workdir: Path
    appendonly: bool = False
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5)

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise AssertionError("redis-server is not installed; .ci/run installs it")
        durability = ["--appendonly", "yes", "--appendfsync", "always"] if self.appendonly else ["--appendonly", "no"]
        self.proc = subprocess.Popen([binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      *durability, "--dir", str(self.workdir)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, timeout=10, interval=0.05, message=f"redis-server on port {self.port}")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.exceptions.ConnectionError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


# ------------------------------------------------------------------ components


@dataclass
class Component:
    """One component as a real process; its output goes to ``log``."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            out.write(f"==== start {' '.join(self.argv)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen(self.argv, cwd=ROOT, env={**os.environ, **self.env}, stdout=out,
                                         stderr=subprocess.STDOUT)

    def kill(self) -> None:
        """kill -9: no handler runs, nothing is flushed or acknowledged."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()

    def exited(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def scheduler_env(redis_url: str, **overrides: object) -> dict[str, str]:
    """The global scheduler's settings for the suite (MERIDIAN_GLOBAL_*), short timings."""
    env = {
        "BUS__URL": redis_url, "BUS__POLL_BLOCK_MS": 50, "BUS__CLAIM_IDLE_MS": 1000,
        "ROUTING__POLICY": "karmada", "ROUTING__WORKER_PROCESS": "false",
        # Short, yet far above a summary interval (0.3 s) and a claim (1 s), so a loaded CI machine does not
        # turn a slow process into a cluster declared down or a dispatch taken for lost.
        "REGISTRY__CLUSTER_TIMEOUT_S": 10.0, "REGISTRY__SWEEP_INTERVAL_S": 0.2,
        "RECONCILE__INTERVAL_S": 0.5, "RECONCILE__GRACE_S": 10.0,
    }
    env.update({k.upper(): v for k, v in overrides.items()})
    return {f"MERIDIAN_GLOBAL_{k}": str(v) for k, v in env.items()}


class SchedulerProcess(Component):
    def __init__(self, *, redis_url: str, log: Path, inject: str | None = None, metrics_port: int = 0,
                 **settings: object) -> None:
        self.port = free_port()
        self.metrics_port = metrics_port
        args = ["global-scheduler", "--listen", f"127.0.0.1:{self.port}", "--no-energy"]
        if metrics_port:
            args += ["--metrics-port", str(metrics_port)]
        prefix = ["-m", "tests.faults.inject", inject] if inject else ["-m", "meridian.cli"]
        super().__init__("global-scheduler", [sys.executable, *prefix, *args], scheduler_env(redis_url, **settings),
                         log)
        self.channel: grpc.Channel | None = None

    def stub(self) -> api_grpc.GlobalSchedulerStub:
        if self.channel is None:
            # Reconnect fast after a restart on the same port (gRPC's default back-off grows to minutes).
            self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}", options=[
                ("grpc.initial_reconnect_backoff_ms", 100), ("grpc.min_reconnect_backoff_ms", 100),
                ("grpc.max_reconnect_backoff_ms", 500)])
        return api_grpc.GlobalSchedulerStub(self.channel)

    def serving(self) -> bool:
        self.stub()  # opens the channel
        try:
            reply = health_pb2_grpc.HealthStub(self.channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    def wait_serving(self, timeout_s: float = 60) -> None:
        def up() -> bool:
            if self.exited() is not None:
                raise AssertionError(f"the global scheduler exited ({self.exited()}):\n{self.output()[-3000:]}")
            return self.serving()

        wait_for(up, timeout=timeout_s, message="the global scheduler to serve")

    def clusters(self) -> list[api.Cluster]:
        return list(self.stub().ListClusters(api.ListClustersRequest(), timeout=5).clusters)

    def wait_clusters(self, names: Iterable[str], timeout_s: float = 30) -> None:
        wanted = set(names)
        wait_for(lambda: wanted <= {c.name for c in self.clusters() if c.ready},
                 timeout=timeout_s, message=f"clusters {sorted(wanted)} to report")

    def workloads(self) -> list[api.Workload]:
        out: list[api.Workload] = []
        token = ""
        while True:
            page = self.stub().ListWorkloads(api.ListWorkloadsRequest(page_size=1000, page_token=token), timeout=10)
            out.extend(page.workloads)
            token = page.next_page_token
            if not token:
                return out

    def wait_all(self, ids: Iterable[str], states: set[int], timeout_s: float) -> dict[str, api.Workload]:
        wanted = set(ids)

        def settled() -> dict[str, api.Workload] | None:
            try:
                got = {w.id: w for w in self.workloads() if w.id in wanted}
            except grpc.RpcError:
                return None
            return got if len(got) == len(wanted) and all(w.state in states for w in got.values()) else None

        try:
            return wait_for(settled, timeout=timeout_s, message="every workload to settle")
        except TimeoutError:
            left = Counter(api.WorkloadState.Name(w.state) for w in self.workloads() if w.id in wanted)
            raise AssertionError(f"not settled within {timeout_s} s: {dict(left)}\n{self.output()[-4000:]}") from None

    def metric(self, name: str, labels: dict[str, str]) -> float:
        """A sample of the process's /metrics (0 when absent)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return 0.0


def dispatch_worker(*, cluster: str, redis_url: str, log: Path, node_offset: int, nodes: int = 4,
                    inject: str | None = None, **settings: object) -> Component:
    env = {"CLUSTER": cluster, "BUS_URL": redis_url, "REGION": "eu-north", "SUMMARY_INTERVAL_S": 0.3,
           "BUS__BLOCK_MS": 50, "BUS__CLAIM_IDLE_MS": 1000, "BUS__BACKOFF_S": "[0.1, 0.2, 0.5]"}
    env.update({k.upper(): v for k, v in settings.items()})
    prefix = ["-m", "tests.faults.inject", inject] if inject else ["-m", "regional_scheduler.dispatch_worker"]
    return Component(f"dispatch-{cluster}", [sys.executable, *prefix, "--nodes", str(nodes), "--node-offset",
                                             str(node_offset)],
                     {f"MERIDIAN_DISPATCH_{k}": str(v) for k, v in env.items()}, log)


# ------------------------------------------------------------------ client


def workload_spec(name: str) -> api.WorkloadSpec:
    return api.WorkloadSpec(name=name, tenant="faults", replicas=1,
                            requests=api.ResourceQuantities(cpu="500m", memory="512Mi"))


REPLICA_MILLI_CPU = 500


def submit(scheduler: SchedulerProcess, key: str, *, deadline_s: float = 60.0) -> api.Workload:
    """Submit with ``key`` until acknowledged, retrying through outages and restarts (the same key: never two)."""
    end = time.monotonic() + deadline_s
    while True:
        try:
            return scheduler.stub().SubmitWorkload(api.SubmitWorkloadRequest(spec=workload_spec(key),
                                                                             idempotency_key=key), timeout=5)
        except grpc.RpcError as exc:
            if exc.code() not in RETRYABLE or time.monotonic() > end:
                raise
            time.sleep(0.1)  # a client's retry pacing (the behaviour imitated), not a wait for something


@dataclass
class Load:
    """Client threads submitting ``keys`` one after another, each thread one per ``pace_s``;
    ``acknowledged`` maps key → workload id."""

    scheduler: SchedulerProcess
    keys: list[str]
    threads: int = 4
    pace_s: float = 0.02
    acknowledged: dict[str, str] = field(default_factory=dict)
    errors: list[BaseException] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _workers: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._run, args=(i, self.keys[i::self.threads]), daemon=True)
            t.start()
            self._workers.append(t)

    def submit_one(self, thread: int, key: str) -> api.Workload:
        """One acknowledged submission of ``key`` from client thread ``thread`` (an error ends that thread)."""
        return submit(self.scheduler, key)

    def _run(self, thread: int, keys: list[str]) -> None:
        for key in keys:
            try:
                w = self.submit_one(thread, key)
            except BaseException as exc:  # reported by join()
                self.errors.append(exc)
                return
            with self._lock:
                self.acknowledged[key] = w.id
            time.sleep(self.pace_s)  # the load's pace: a rate, not a wait for something

    def snapshot(self) -> dict[str, str]:
        with self._lock:
            return dict(self.acknowledged)

    def join(self, timeout_s: float) -> None:
        for t in self._workers:
            t.join(timeout=timeout_s)
        assert not self.errors, self.errors
        assert not any(t.is_alive() for t in self._workers), "submissions still running"


# ------------------------------------------------------------------ what the streams hold


def places(client: redis.Redis, clusters: Iterable[str]) -> Counter[tuple[str, int, str]]:
    """Place messages on the clusters' dispatch streams, per (workload, attempt, cluster)."""
    out: Counter[tuple[str, int, str]] = Counter()
    for cluster in clusters:
        for _, fields in client.xrange(dispatch_stream(cluster)):
            msg = dpb.DispatchMessage.FromString(fields[b"p"])
            if msg.WhichOneof("action") == "place":
                out[msg.place.workload_id, msg.place.attempt, cluster] += 1
    return out


def latest_summary(client: redis.Redis, cluster: str) -> tpb.ClusterSummary | None:
    for _, fields in client.xrevrange("meridian:summary", count=500):
        s = tpb.ClusterSummary.FromString(fields[b"p"])
        if s.cluster == cluster:
            return s
    return None


def dispatch_pending(client: redis.Redis, cluster: str) -> int:
    try:
        return int(client.xpending(dispatch_stream(cluster), "regional-dispatch")["pending"])
    except redis.exceptions.ResponseError:  # no group yet
        return 0


def assert_dispatched_once(client: redis.Redis, clusters: Iterable[str], workloads: dict[str, api.Workload], *,
                           republished: bool = False) -> None:
    """No workload dispatched twice: each one's place messages are of one attempt (1: never rerouted), all to
    the cluster it runs on, and there is exactly one, unless ``republished``: reconciliation may publish
    the same place again (the regional worker applies it once; :func:`assert_held_once` checks that)."""
    sent = places(client, clusters)
    assert {wid for wid, _, _ in sent} == set(workloads), "place messages for workloads not submitted, or missing"
    assert {w.id: w.attempt for w in workloads.values() if w.attempt != 1} == {}
    elsewhere = {(wid, attempt, cluster) for wid, attempt, cluster in sent
                 if attempt != 1 or cluster != workloads[wid].cluster}
    assert not elsewhere, f"places of another attempt, or to another cluster: {elsewhere}"
    if not republished:
        twice = {k: n for k, n in sent.items() if n != 1}
        assert not twice, f"place messages sent more than once: {twice}"


def assert_held_once(client: redis.Redis, clusters: Iterable[str], workloads: dict[str, api.Workload], *,
                     replica_milli_cpu: int = REPLICA_MILLI_CPU, timeout_s: float = 20) -> None:
    """Each cluster's summary holds exactly the workloads that run there, each applied once: its requested
    CPU is their sum (a workload placed twice would count twice)."""
    for cluster in clusters:
        mine = {wid for wid, w in workloads.items() if w.cluster == cluster}

        def matches(cluster: str = cluster, mine: set[str] = mine) -> bool:
            s = latest_summary(client, cluster)
            return s is not None and {h.workload for h in s.holdings} == mine and \
                s.requested.milli_cpu == len(mine) * replica_milli_cpu

        try:
            wait_for(matches,
                     timeout=timeout_s, message=f"{cluster}'s summary to hold its {len(mine)} workloads once")
        except TimeoutError:
            s = latest_summary(client, cluster)
            raise AssertionError(f"{cluster}: holds {None if s is None else len(s.holdings)} workloads, requested "
                                 f"{None if s is None else s.requested.milli_cpu} milli-CPU; expected {len(mine)} "
                                 f"× {replica_milli_cpu}") from None


def assert_no_cluster_declared_down(scheduler: SchedulerProcess) -> None:
    out = scheduler.output()
    assert "stopped reporting" not in out, [line for line in out.splitlines() if "stopped reporting" in line]
