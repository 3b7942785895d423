"""The regional dispatch worker against real Redis: all-or-nothing placement, idempotent redelivery,
release, malformed entries dead-lettered, summaries; the command's flags and start-up errors."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import numpy as np
import pytest

from meridian.bus import SUMMARY_STREAM, dead_letter_stream, dispatch_stream, events_stream, open_bus
from meridian.envtest import wait_for
from meridian.model import GIB, Node, Resources
from protos import dispatch_pb2 as dpb
from protos import telemetry_pb2 as tpb
from regional_scheduler.dispatch_worker import DispatchWorker, DispatchWorkerSettings, simulated_cluster
from regional_scheduler.policies.base import Scores


@pytest.fixture
def worker(redis_url: str, key_prefix: str) -> DispatchWorker:
    nodes = [Node(name=f"n{i}", capacity=Resources(milli_cpu="16", memory_bytes=64 * GIB, gpu=2)) for i in range(2)]
    w = DispatchWorker(bus=open_bus(redis_url, key_prefix=key_prefix), state=simulated_cluster(nodes),
                       settings=DispatchWorkerSettings(cluster="c1", region="eu-north", bus={"block_ms": 10}))
    w.bus.ensure_group(w.stream, "regional-dispatch")
    return w


def place(wid: str, attempt: int = 1, replicas: int = 2, cpu: int = 8000, gpu: int = 0) -> bytes:
    return dpb.DispatchMessage(cluster="c1", place=dpb.PlaceWorkload(
        workload_id=wid, attempt=attempt, name="job", tenant="t", replicas=replicas,
        requests=dpb.ReplicaRequests(milli_cpu=cpu, memory_bytes=GIB, gpu=gpu))).SerializeToString()


def events(w: DispatchWorker) -> list[dpb.PlacementEvent]:
    return [dpb.PlacementEvent.FromString(e.payload) for e in w.bus.read_range(events_stream("c1"))]


@pytest.mark.parametrize(("replicas", "cpu", "gpu", "phases", "held_cpu"), [
    # 2 nodes × 16 CPU: 4 × 8 CPU fit exactly (two per node).
    pytest.param(4, 8000, 0, [dpb.PLACEMENT_PHASE_SCHEDULED, dpb.PLACEMENT_PHASE_RUNNING], 32000, id="fits-exactly"),
    # 5 × 8 CPU = 40 > 32: the fifth fails, the four placed are released (all or nothing).
    pytest.param(5, 8000, 0, [dpb.PLACEMENT_PHASE_FAILED], 0, id="all-or-nothing"),
    # 3 replicas × 2 GPUs on 2 nodes × 2 GPUs: the third has no idle GPU.
    pytest.param(3, 1000, 2, [dpb.PLACEMENT_PHASE_FAILED], 0, id="gpu-shortage"),
])
def test_place(worker: DispatchWorker, replicas: int, cpu: int, gpu: int, phases: list[int], held_cpu: int) -> None:
    worker.bus.publish(dispatch_stream("c1"), place("w1", replicas=replicas, cpu=cpu, gpu=gpu))
    assert worker.poll_once() == 1
    got = events(worker)
    assert [e.phase for e in got] == phases
    assert int(worker.state.req_milli_cpu.sum()) == held_cpu
    if phases[0] == dpb.PLACEMENT_PHASE_FAILED:
        assert "replica" in got[0].reason and "nodes are available" in got[0].reason
    else:
        assert len(got[0].nodes) == replicas
    assert worker.bus.pending(dispatch_stream("c1"), "regional-dispatch") == 0


def test_redelivery_is_idempotent_and_release_frees(worker: DispatchWorker) -> None:
    worker.bus.publish(dispatch_stream("c1"), place("w1"))
    worker.bus.publish(dispatch_stream("c1"), place("w1"))  # the same attempt again
    worker.poll_once()
    assert int(worker.state.req_milli_cpu.sum()) == 16000
    assert len(events(worker)) == 2  # SCHEDULED + RUNNING once
    release = dpb.DispatchMessage(cluster="c1", release=dpb.ReleaseWorkload(workload_id="w1", attempt=1, reason="x"))
    worker.bus.publish(dispatch_stream("c1"), release.SerializeToString())
    worker.poll_once()
    assert int(worker.state.req_milli_cpu.sum()) == 0
    assert events(worker)[-1].phase == dpb.PLACEMENT_PHASE_RELEASED
    # A newer attempt routed back here is placed again.
    worker.bus.publish(dispatch_stream("c1"), place("w1", attempt=2))
    worker.poll_once()
    assert int(worker.state.req_milli_cpu.sum()) == 16000


def test_malformed_entries_are_dead_lettered(worker: DispatchWorker) -> None:
    worker.bus.publish(dispatch_stream("c1"), b"\xff\xfenot a proto")
    worker.bus.publish(dispatch_stream("c1"), dpb.DispatchMessage(cluster="c1").SerializeToString())
    worker.bus.publish(dispatch_stream("c1"), place("ok"))
    assert worker.poll_once() == 3
    dead = worker.bus.read_range(dead_letter_stream(dispatch_stream("c1")))
    assert len(dead) == 2
    reasons = [tpb.DeadLetter.FromString(d.payload).reason for d in dead]
    assert all(r.startswith("cannot apply") for r in reasons)
    assert "ok" in worker.held


def test_summary_reflects_placements(worker: DispatchWorker) -> None:
    worker.bus.publish(dispatch_stream("c1"), place("w1", replicas=1, cpu=8000))
    worker.poll_once()
    worker.publish_summary()
    latest = worker.bus.read_latest(SUMMARY_STREAM)
    assert latest is not None
    s = tpb.ClusterSummary.FromString(latest.payload)
    assert (s.cluster, s.region, s.nodes_total) == ("c1", "eu-north", 2)
    assert s.allocatable.milli_cpu == 32000 and s.free.milli_cpu == 24000 and s.max_node_free_milli_cpu == 16000



class _BrokenPolicy:
    """Scores the first replica, then raises: a model that fails mid-workload."""

    name = "broken"

    def score(self, state: object, pod: object, nodes: np.ndarray) -> Scores:
        if pod.name.endswith("-1"):  # type: ignore[attr-defined]
            raise RuntimeError("model exploded")
        return Scores(np.zeros(nodes.size))


def test_a_scheduler_error_fails_the_workload_and_frees_its_replicas(redis_url: str, key_prefix: str) -> None:
    """A broken policy must produce a FAILED event (so the global tier reroutes), never a wedged workload."""
    nodes = [Node(name=f"n{i}", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB)) for i in range(2)]
    w = DispatchWorker(bus=open_bus(redis_url, key_prefix=key_prefix), state=simulated_cluster(nodes),
                       settings=DispatchWorkerSettings(cluster="c1"))
    w.service.scheduler.policy = _BrokenPolicy()
    events = w.place(dpb.PlaceWorkload(workload_id="w1", attempt=1, name="web", replicas=2,
                                       requests=dpb.ReplicaRequests(milli_cpu=1000)))
    decoded = [dpb.PlacementEvent.FromString(e) for e in events]
    assert [e.phase for e in decoded] == [dpb.PLACEMENT_PHASE_FAILED]
    assert "model exploded" in decoded[0].reason
    assert int(w.state.req_milli_cpu.sum()) == 0  # the first replica was released again


def test_simulated_power_follows_the_documented_model() -> None:
    # One 16-vCPU node ("small" profile: 60 W idle, 180 W max) at 50 % requested CPU, one T4 (10 W idle,
    # 70 W max) half allocated: host 60 + 120·(2·0.5 − 0.5^1.4) = 60 + 120·0.62107 = 134.53 W;
    # GPU 10 + 60·0.5 = 40 W → 174.53 W. A cordoned node draws nothing in the summary.
    from meridian.model import Pod
    from regional_scheduler.dispatch_worker import simulated_power_watts

    state = simulated_cluster([
        Node(name="a", capacity=Resources(milli_cpu=16000, memory_bytes=64 * GIB, gpu=1), gpu_model="T4"),
        Node(name="b", capacity=Resources(milli_cpu=16000, memory_bytes=64 * GIB)),
    ])
    pod = Pod(name="p", requests=Resources(milli_cpu=8000, gpu_milli=500))
    state.allocate(pod, state.choose_devices(0, pod))
    state.schedulable[1] = False
    assert simulated_power_watts(state) == pytest.approx(60 + 120 * (1 - 0.5**1.4) + 40, rel=1e-9)


def test_summary_names_what_each_workload_holds(worker: DispatchWorker) -> None:
    worker.bus.publish(dispatch_stream("c1"), place("w1", replicas=2, cpu=4000, gpu=1))
    worker.bus.publish(dispatch_stream("c1"), place("w2", replicas=1, cpu=2000))
    worker.poll_once()
    s = worker.summary()
    held = {h.workload: (h.tenant, h.milli_cpu, h.memory_bytes, h.gpu_milli) for h in s.holdings}
    assert held == {"w1": ("t", 8000, 2 * GIB, 2000), "w2": ("t", 2000, GIB, 0)}
    # The idle floor is the nodes' power with nothing running, below the power now.
    assert 0 < s.idle_power_watts < s.power_watts
    worker.bus.publish(dispatch_stream("c1"), dpb.DispatchMessage(
        cluster="c1", release=dpb.ReleaseWorkload(workload_id="w1", attempt=1)).SerializeToString())
    worker.poll_once()
    assert [h.workload for h in worker.summary().holdings] == ["w2"]


def test_events_whose_publish_failed_are_sent_on_redelivery(redis_url: str, key_prefix: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The placement is applied, then publishing its events fails (Redis restarting): the entry stays
    pending, and its redelivery must send the events instead of treating the entry as a duplicate
    (which left the workload DISPATCHED forever while the cluster held it)."""
    from meridian.bus import BusUnavailableError

    nodes = [Node(name=f"n{i}", capacity=Resources(milli_cpu="16", memory_bytes=64 * GIB)) for i in range(2)]
    w = DispatchWorker(bus=open_bus(redis_url, key_prefix=key_prefix), state=simulated_cluster(nodes),
                       settings=DispatchWorkerSettings(cluster="c1", bus={"block_ms": 10, "claim_idle_ms": 1000}))
    w.bus.ensure_group(w.stream, "regional-dispatch")
    w.bus.publish(dispatch_stream("c1"), place("w1"))
    real_publish = w.bus.publish_many

    def unavailable(*args: object, **kwargs: object) -> None:
        raise BusUnavailableError("connection refused (Redis restarting)")

    monkeypatch.setattr(w.bus, "publish_many", unavailable)
    with pytest.raises(BusUnavailableError):
        w.poll_once()
    assert events(w) == [] and w.bus.pending(dispatch_stream("c1"), "regional-dispatch") == 1
    assert int(w.state.req_milli_cpu.sum()) == 16000  # applied before the publish failed
    monkeypatch.setattr(w.bus, "publish_many", real_publish)
    # Polled until the entry has been idle for claim_idle_ms (Redis's clock) and is claimed again.
    wait_for(lambda: w.poll_once() and events(w), timeout=30, interval=0.05,
             message="the unacknowledged entry to be claimed again and its events published")
    assert [e.phase for e in events(w)] == [dpb.PLACEMENT_PHASE_SCHEDULED, dpb.PLACEMENT_PHASE_RUNNING]
    assert w.bus.pending(dispatch_stream("c1"), "regional-dispatch") == 0
    assert int(w.state.req_milli_cpu.sum()) == 16000  # placed once
    # Once published, a further place of the same attempt places nothing more and re-states the workload's
    # current phase (what the global reconciliation relies on to heal a lost event).
    w.bus.publish(dispatch_stream("c1"), place("w1"))
    w.poll_once()
    assert [e.phase for e in events(w)][2:] == [dpb.PLACEMENT_PHASE_RUNNING]
    assert int(w.state.req_milli_cpu.sum()) == 16000


@pytest.mark.parametrize(("replicas", "cpu", "start_delay_s", "release", "restated"), [
    # 2 × 8 CPU fit: placed and started, so a repeat says RUNNING with both nodes.
    pytest.param(2, 8000, 0.0, False, (dpb.PLACEMENT_PHASE_RUNNING, 2), id="running"),
    # Started after a delay not yet over: SCHEDULED with its nodes.
    pytest.param(2, 8000, 60.0, False, (dpb.PLACEMENT_PHASE_SCHEDULED, 2), id="scheduled"),
    # 5 × 8 CPU > 32: the place FAILED; a repeat says FAILED again, with the same reason.
    pytest.param(5, 8000, 0.0, False, (dpb.PLACEMENT_PHASE_FAILED, 0), id="failed"),
    # Released since: the global tier has moved on, nothing is said.
    pytest.param(2, 8000, 0.0, True, None, id="released"),
])
def test_a_repeated_place_restates_the_current_phase_once(redis_url: str, key_prefix: str, replicas: int, cpu: int,
                                                          start_delay_s: float, release: bool,
                                                          restated: tuple[int, int] | None) -> None:
    nodes = [Node(name=f"n{i}", capacity=Resources(milli_cpu="16", memory_bytes=64 * GIB)) for i in range(2)]
    w = DispatchWorker(bus=open_bus(redis_url, key_prefix=key_prefix), state=simulated_cluster(nodes),
                       settings=DispatchWorkerSettings(cluster="c1", bus={"block_ms": 10}, start_delay_s=start_delay_s))
    w.bus.ensure_group(w.stream, "regional-dispatch")
    w.bus.publish(dispatch_stream("c1"), place("w1", replicas=replicas, cpu=cpu))
    w.poll_once()
    if release:
        w.bus.publish(dispatch_stream("c1"), dpb.DispatchMessage(
            cluster="c1", release=dpb.ReleaseWorkload(workload_id="w1", attempt=1)).SerializeToString())
        w.poll_once()
    first = events(w)
    held_cpu = int(w.state.req_milli_cpu.sum())
    # The same attempt twice in one batch: one statement, no second placement.
    w.bus.publish(dispatch_stream("c1"), place("w1", replicas=replicas, cpu=cpu))
    w.bus.publish(dispatch_stream("c1"), place("w1", replicas=replicas, cpu=cpu))
    w.poll_once()
    again = events(w)[len(first):]
    assert int(w.state.req_milli_cpu.sum()) == held_cpu
    if restated is None:
        assert again == []
        return
    phase, n_nodes = restated
    assert [(e.phase, len(e.nodes), e.attempt) for e in again] == [(phase, n_nodes, 1)]
    if phase == dpb.PLACEMENT_PHASE_FAILED:
        assert again[0].reason == first[0].reason
    else:
        assert list(again[0].nodes) == list(first[0].nodes)


def test_summary_says_its_holdings_are_complete(worker: DispatchWorker) -> None:
    # An idle simulated cluster holds nothing, and says so: an empty list is an answer, not "unknown".
    s = worker.summary()
    assert s.holdings_complete and list(s.holdings) == []


# ------------------------------------------------------------------ the command's start-up


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: nothing listens there


@pytest.mark.parametrize("verbose", [pytest.param(False, id="plain"), pytest.param(True, id="verbose")])
def test_redis_unreachable_at_start_is_one_line_and_exit_2(verbose: bool) -> None:
    url = f"redis://worker:s3cret@127.0.0.1:{_closed_port()}/0"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MERIDIAN_DISPATCH_", "MERIDIAN_REDIS_"))}
    proc = subprocess.run([sys.executable, "-m", "regional_scheduler.dispatch_worker", "--nodes", "2", "--bus-url", url,
                           *(["--verbose"] if verbose else [])], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: Redis at {url.replace('s3cret', '***')} is unreachable ("), last
    assert last.endswith("; start Redis there (redis-server), or point --bus-url or MERIDIAN_DISPATCH_BUS_URL at a "
                         "running one")
    if verbose:
        assert "Traceback" in proc.stderr
    else:
        assert proc.stderr.strip() == last and proc.stdout == ""


@pytest.mark.parametrize(("args", "env", "expected"), [
    pytest.param(["--cluster", ""], {}, "error: setting cluster='' is not valid: String should have at least 1 "
                 "character", id="empty-cluster-flag"),
    pytest.param([], {"MERIDIAN_DISPATCH_BUS__BATCH": "many"}, "error: MERIDIAN_DISPATCH_BUS__BATCH='many' is not "
                 "valid", id="setting-of-the-wrong-type"),
    pytest.param([], {"MERIDIAN_DISPATCH_BATCH": "many"}, "error: MERIDIAN_DISPATCH_BATCH='many' is not valid",
                 id="flat-spelling-of-the-wrong-type"),
    pytest.param(["--node-offset", "100000"], {}, "error: --node-offset 100000 is past the last of the", id="offset"),
])
def test_other_mistakes_at_start_are_one_line(args: list[str], env: dict[str, str], expected: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MERIDIAN_DISPATCH_")}
    # The in-process bus: nothing is left behind in a shared Redis.
    proc = subprocess.run([sys.executable, "-m", "regional_scheduler.dispatch_worker", "--bus-url", "memory://", *args],
                          env={**clean, **env}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith(expected), proc.stderr

