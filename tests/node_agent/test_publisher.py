"""The agent's bounded buffer, a whole agent on fake trees, its health endpoint, and a Redis outage."""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from meridian.bus import InProcessStreamBus, RedisStreamBus, telemetry_stream
from meridian.envtest import wait_for
from meridian.fleet import SimulatedFleet
from node_agent.agent import NodeAgent, NodeReporter, SimulatedReporter
from node_agent.collectors.carbon import CarbonCollector
from node_agent.collectors.kube import NodeInfo
from node_agent.collectors.power import PowerCollector
from node_agent.collectors.usage import CgroupUsage, ProcUsage
from node_agent.health import HealthServer
from node_agent.publisher import ReportPublisher
from protos import telemetry_pb2 as pb

STREAM = telemetry_stream("agent-test")


class _DownBus(InProcessStreamBus):
    """An in-process bus that can be switched off, to exercise the buffer without a server."""

    down = False

    def publish_many(self, stream: str, payloads, *, maxlen=None) -> int:
        from meridian.bus import BusUnavailableError

        if self.down:
            raise BusUnavailableError("switched off")
        return super().publish_many(stream, payloads, maxlen=maxlen)


@pytest.mark.parametrize(
    ("buffer_max", "submitted", "expect_dropped", "expect_first"),
    [
        pytest.param(10, 6, 0, b"0", id="fits"),
        pytest.param(4, 6, 2, b"2", id="oldest-dropped"),
        pytest.param(1, 3, 2, b"2", id="only-newest-kept"),
    ],
)
def test_buffer_is_bounded_and_keeps_the_newest(buffer_max: int, submitted: int, expect_dropped: int,
                                               expect_first: bytes) -> None:
    clock = [0.0]
    bus = _DownBus()
    publisher = ReportPublisher(bus=bus, stream=STREAM, buffer_max=buffer_max, backoff_s=(1.0, 5.0),
                                clock=lambda: clock[0])
    bus.down = True
    for i in range(submitted):
        publisher.submit([b"%d" % i])
        assert not publisher.flush()
    assert publisher.dropped_total == expect_dropped
    assert len(publisher.buffer) == submitted - expect_dropped
    bus.down = False
    assert not publisher.flush()  # still inside the back-off delay
    clock[0] = 100.0
    assert publisher.flush()
    sent = [e.payload for e in bus.read_range(STREAM)]
    assert sent[0] == expect_first and len(sent) == submitted - expect_dropped
    assert publisher.published_total == len(sent)


def _fake_host(root: Path) -> tuple[Path, Path]:
    proc = root / "proc"
    proc.mkdir()
    (proc / "stat").write_text("cpu  100 0 0 900 0 0 0 0 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\ncpu1 0 0 0 0 0 0 0 0 0 0\n")
    (proc / "meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable: 6000000 kB\n")
    return proc, root / "cgroup"


def test_node_reporter_builds_a_complete_report(tmp_path: Path) -> None:
    proc, cgroup = _fake_host(tmp_path)
    node = NodeInfo("n1", 2000, 8 * 2**30, 2, 1900, 7 * 2**30, 2, 500, 2**30, 1, labels={"zone": "a"},
                    taints=[("dedicated", "ml", "NoSchedule")], gpu_model="T4")
    reporter = NodeReporter(cluster="c", region="r", node=node, pue=1.3, usage=ProcUsage(proc),
                            cgroup=CgroupUsage(cgroup), power=PowerCollector(2, powercap_root=None),
                            carbon=CarbonCollector(static_g_per_kwh=42.0), labels_every=3)
    reports = [pb.NodeTelemetry.FromString(reporter.reports(1000.0 + i)[0]) for i in range(4)]
    first = reports[0]
    assert (first.cluster, first.region, first.node) == ("c", "r", "n1")
    assert first.allocatable_milli_cpu == 1900 and first.requested_memory_bytes == 2**30
    assert list(first.gpu_free_milli) == [1000, 0]  # 2 GPUs, 1 requested
    assert first.power_source == pb.POWER_SOURCE_MODEL and first.power_watts == pytest.approx(60.0)
    assert first.carbon_g_per_kwh == 42.0 and first.pue == pytest.approx(1.3)
    assert first.used_memory_bytes == 2_000_000 * 1024
    assert [r.labels_included for r in reports] == [True, False, False, True]
    assert dict(first.labels) == {"zone": "a"} and first.taints[0].key == "dedicated"
    sequences = [r.sequence for r in reports]
    assert sequences == list(range(sequences[0], sequences[0] + 4))
    assert sequences[0] > int(time.time() * 1000) * 1000 - 10**9  # starts at unix_ms × 1000


def test_health_endpoints_follow_the_agent() -> None:
    bus = _DownBus()
    fleet = SimulatedFleet(cluster="agent-test", region="r", n_nodes=3)
    publisher = ReportPublisher(bus=bus, stream=STREAM, buffer_max=100, backoff_s=(0.0,))
    agent = NodeAgent(reporter=SimulatedReporter(fleet), publisher=publisher, interval_s=1.0)
    server = HealthServer(port=0, live=agent.live, ready=agent.ready, address="127.0.0.1").start()
    base = f"http://127.0.0.1:{server.port}"

    def status(path: str) -> int:
        try:
            with urllib.request.urlopen(base + path, timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code

    try:
        assert status("/healthz") == 200
        assert status("/readyz") == 503  # nothing published yet
        bus.down = True
        agent.tick()
        assert status("/readyz") == 503
        bus.down = False
        agent.tick()
        assert status("/readyz") == 200
        with urllib.request.urlopen(base + "/metrics", timeout=5) as response:
            assert b"meridian_agent_reports_published_total" in response.read()
        assert status("/nope") == 404
    finally:
        server.shutdown()


def test_agent_rides_out_a_redis_restart(redis_server) -> None:
    """Redis killed and restarted: the agent buffers, counts nothing dropped, and delivers in order."""
    bus = RedisStreamBus(redis_server.url, connect_timeout_s=0.5, socket_timeout_s=2.0)
    fleet = SimulatedFleet(cluster="agent-test", region="r", n_nodes=5, start_sequence=0)
    publisher = ReportPublisher(bus=bus, stream=STREAM, buffer_max=1000, backoff_s=(0.0,))
    agent = NodeAgent(reporter=SimulatedReporter(fleet), publisher=publisher, interval_s=0.05, jitter_s=0.0)
    assert agent.tick()
    redis_server.kill()
    for _ in range(3):
        assert not agent.tick()
    assert len(publisher.buffer) == 15 and publisher.dropped_total == 0
    redis_server.start()  # a fresh server: no persistence, the stream is gone
    stop = threading.Event()
    worker = threading.Thread(target=agent.run, args=(stop,), daemon=True)
    worker.start()
    wait_for(lambda: not publisher.buffer and publisher.published_total >= 20, timeout=30, interval=0.05,
             message="the agent to deliver its buffer and its next reports")
    stop.set()
    worker.join(timeout=10)
    delivered = [pb.NodeTelemetry.FromString(e.payload) for e in bus.read_range(STREAM)]
    # everything buffered during the outage arrived, each node's sequences in order
    for node in fleet.names:
        seqs = [m.sequence for m in delivered if m.node == node]
        assert seqs[:3] == [2, 3, 4] and seqs == sorted(seqs)
    bus.close()


def test_an_outage_is_said_once_when_it_starts_and_once_when_it_ends() -> None:
    """The agent never buffers silently: one line names the stream, the cause and the buffer against its
    cap; one more says how long it lasted and what was sent and dropped; nothing between."""
    clock = [0.0]
    said: list[str] = []
    bus = _DownBus()
    publisher = ReportPublisher(bus=bus, stream=STREAM, buffer_max=3, backoff_s=(0.0,), clock=lambda: clock[0],
                                notify=said.append)
    bus.down = True
    for i in range(5):
        clock[0] = float(i)
        publisher.submit([b"%d" % i])
        assert not publisher.flush()
    assert said == [f"cannot publish to {STREAM}: switched off; buffering 1 reports (cap 3, the oldest dropped "
                    "beyond it) and retrying"]
    bus.down = False
    clock[0] = 12.0
    assert publisher.flush()
    # 5 submitted, cap 3: 2 dropped; the 3 kept are sent 12 s after the first failure.
    assert said[1:] == [f"publishing to {STREAM} again after 12 s: sent 3 buffered reports, dropped 2"]
    publisher.submit([b"5"])
    assert publisher.flush() and len(said) == 2
