"""Fault tests of the telemetry fabric, each on its own ``redis-server`` (fixture ``redis_server``).

* a consumer killed (SIGKILL) after reading and applying a batch but before acknowledging it:
  another consumer claims the pending entries with XAUTOCLAIM and every report is applied exactly once;
* Redis killed and restarted under a running agent and consumer: both resume, the reports the agent
  buffered during the outage arrive and are applied, nothing is dropped.

Nothing here passes or fails on timing: waits poll a condition under a generous deadline.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import numpy as np
import redis

from meridian.bus import RedisStreamBus, telemetry_stream
from meridian.envtest import wait_for
from meridian.fleet import SimulatedFleet
from meridian.telemetry import TelemetryBatch
from node_agent.agent import NodeAgent, SimulatedReporter
from node_agent.publisher import ReportPublisher
from regional_scheduler.telemetry_state import TelemetryConsumer, TelemetryConsumerSettings, TelemetryState

CLUSTER = "faulty"
STREAM = telemetry_stream(CLUSTER)
DEADLINE_S = 60.0


class Audit:
    """Records every (node, sequence) a consumer applied."""

    def __init__(self) -> None:
        self.applied: list[tuple[str, int]] = []

    def __call__(self, batch: TelemetryBatch, rows: np.ndarray) -> None:
        self.applied.extend((batch.node[r], int(batch.sequence[r])) for r in rows.tolist())


DOOMED_CONSUMER = textwrap.dedent("""
    import sys, time
    from meridian.bus import RedisStreamBus
    from meridian.telemetry import decode_reports
    from regional_scheduler.telemetry_state import TelemetryState
    url, stream, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    bus = RedisStreamBus(url)
    bus.ensure_group(stream, "regional")
    entries = bus.read_group(stream, "regional", "doomed", count=count)
    batch, _ = decode_reports(entries, cluster="faulty")
    TelemetryState(cluster="faulty").apply(batch)      # applied in its own memory, never acknowledged
    print("APPLIED", len(entries), flush=True)
    time.sleep(3600)  # the fault: alive, holding its batch unacknowledged, until the test kills it (SIGKILL)
""")


def test_killed_consumer_is_taken_over_and_every_report_applied_once(redis_server) -> None:
    bus = RedisStreamBus(redis_server.url)
    fleet = SimulatedFleet(cluster=CLUSTER, region="r", n_nodes=50, start_sequence=0)
    published: list[tuple[str, int]] = []
    for round_ in range(4):
        fleet.advance(float(round_))
        payloads = fleet.reports(float(round_))
        bus.publish_many(STREAM, payloads)
        published.extend((name, round_ + 1) for name in fleet.names)
    doomed = subprocess.Popen([sys.executable, "-c", DOOMED_CONSUMER, redis_server.url, STREAM, "120"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert doomed.stdout is not None
        assert doomed.stdout.readline().split() == ["APPLIED", "120"]
    finally:
        doomed.kill()  # SIGKILL mid-batch: applied, never acknowledged
        doomed.wait(timeout=10)
    assert bus.pending(STREAM, "regional") == 120
    claim_after_ms = 200
    raw = redis.Redis.from_url(redis_server.url)
    wait_for(lambda: all(p["time_since_delivered"] >= claim_after_ms
                         for p in raw.xpending_range(STREAM, "regional", "-", "+", 200)),
             timeout=DEADLINE_S, message="entries to go idle")
    audit = Audit()
    settings = TelemetryConsumerSettings(cluster=CLUSTER, consumer="survivor", claim_interval_s=0.0,
                                         bus={"block_ms": 0, "batch": 1000, "claim_idle_ms": claim_after_ms})
    state = TelemetryState(cluster=CLUSTER)
    survivor = TelemetryConsumer(bus=bus, state=state, settings=settings, on_applied=audit)
    wait_for(lambda: survivor.step() == 0 and bus.pending(STREAM, "regional") == 0,
             timeout=DEADLINE_S, message="the survivor to drain")
    assert sorted(audit.applied) == sorted(published)  # every report exactly once
    assert state.duplicate_total == 0 and state.stale_sequence_total == 0
    assert state.state.last_seq.tolist() == [4] * 50
    bus.close()
    raw.close()


def test_agent_and_consumer_resume_after_redis_restart(redis_server) -> None:
    agent_bus = RedisStreamBus(redis_server.url, connect_timeout_s=0.5, socket_timeout_s=2.0)
    consumer_bus = RedisStreamBus(redis_server.url, connect_timeout_s=0.5, socket_timeout_s=2.0)
    fleet = SimulatedFleet(cluster=CLUSTER, region="r", n_nodes=20, start_sequence=0)
    publisher = ReportPublisher(bus=agent_bus, stream=STREAM, buffer_max=20 * 500, backoff_s=(0.05, 0.1))
    agent = NodeAgent(reporter=SimulatedReporter(fleet), publisher=publisher, interval_s=0.05, jitter_s=0.0)
    audit = Audit()
    settings = TelemetryConsumerSettings(cluster=CLUSTER, consumer="c",
                                         bus={"block_ms": 100, "backoff_s": (0.05, 0.1, 0.2)})
    state = TelemetryState(cluster=CLUSTER, stale_after_s=3600)
    consumer = TelemetryConsumer(bus=consumer_bus, state=state, settings=settings, on_applied=audit)
    stop = threading.Event()
    threads = [threading.Thread(target=agent.run, args=(stop,), daemon=True),
               threading.Thread(target=consumer.run, args=(stop,), daemon=True)]
    for t in threads:
        t.start()
    try:
        wait_for(lambda: state.applied_total >= 40, timeout=DEADLINE_S, message="reports before the outage")
        redis_server.kill()
        wait_for(lambda: publisher.failures >= 2 and len(publisher.buffer) >= 40,
                 timeout=DEADLINE_S, message="the agent to buffer")
        made_during_outage = int(fleet.sequence.min())
        redis_server.start()
        wait_for(lambda: bool((state.state.last_seq > made_during_outage + 2).all()),
                 timeout=DEADLINE_S, message="the consumer to catch up")
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
    applied = set(audit.applied)
    buffered = {(name, seq) for name in fleet.names for seq in range(made_during_outage - 1, made_during_outage + 1)}
    assert buffered <= applied, "reports buffered during the outage were not applied"
    assert publisher.dropped_total == 0
    assert len(audit.applied) == len(applied)  # nothing applied twice
    agent_bus.close()
    consumer_bus.close()


def test_malformed_and_oversized_reports_are_parked_and_the_consumer_goes_on(redis_server) -> None:
    from meridian.bus import dead_letter_stream
    from protos import telemetry_pb2 as pb

    bus = RedisStreamBus(redis_server.url)
    good = [pb.NodeTelemetry(cluster=CLUSTER, node=f"n{i}", sequence=1, power_watts=100.0).SerializeToString()
            for i in range(3)]
    poison = [b"\xff\xfe\xfd", pb.NodeTelemetry(cluster=CLUSTER, node="big", sequence=1,
                                                boot_id="x" * 5000).SerializeToString(),
              pb.NodeTelemetry(cluster="elsewhere", node="lost", sequence=1).SerializeToString()]
    bus.publish_many(STREAM, [good[0], poison[0], good[1], poison[1], poison[2], good[2]])
    settings = TelemetryConsumerSettings(cluster=CLUSTER, consumer="c", bus={"block_ms": 100}, max_payload_bytes=4096)
    state = TelemetryState(cluster=CLUSTER, stale_after_s=3600)
    consumer = TelemetryConsumer(bus=bus, state=state, settings=settings)
    stop = threading.Event()
    worker = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    worker.start()
    try:
        wait_for(lambda: state.applied_total == 3 and bus.pending(STREAM, settings.group) == 0,
                 timeout=DEADLINE_S, message="the good reports")
        bus.publish(STREAM, pb.NodeTelemetry(cluster=CLUSTER, node="n0", sequence=2).SerializeToString())
        wait_for(lambda: state.applied_total == 4,
                 timeout=DEADLINE_S, message="a report after the poison")  # still consuming
    finally:
        stop.set()
        worker.join(timeout=10)
    parked = sorted(pb.DeadLetter.FromString(e.payload).reason.split(":")[0]
                    for e in bus.read_range(dead_letter_stream(STREAM)))
    assert parked == ["decode error", "foreign", "oversized"]
    assert consumer.dead_lettered_total == 3
    bus.close()


def test_node_that_stops_reporting_turns_unschedulable_after_the_timeout(redis_server) -> None:
    clock = [5000.0]
    bus = RedisStreamBus(redis_server.url)
    fleet = SimulatedFleet(cluster=CLUSTER, region="r", n_nodes=3, start_sequence=0)
    settings = TelemetryConsumerSettings(cluster=CLUSTER, consumer="c", bus={"block_ms": 0}, stale_after_s=10.0)
    state = TelemetryState(cluster=CLUSTER, stale_after_s=10.0, clock=lambda: clock[0])
    consumer = TelemetryConsumer(bus=bus, state=state, settings=settings, clock=lambda: clock[0])
    bus.publish_many(STREAM, fleet.reports(clock[0]))
    wait_for(lambda: consumer.step() == 0 and state.applied_total == 3,
             timeout=DEADLINE_S, message="the first reports")
    for t in (5006.0, 5012.0):  # nodes 0 and 1 keep reporting, node 2 fell silent at t = 5000
        clock[0] = t
        bus.publish_many(STREAM, fleet.reports(t, slice(0, 2)))
        wait_for(lambda: consumer.step() == 0 and bus.pending(STREAM, settings.group) == 0,
                 timeout=DEADLINE_S, message="the reports")
    schedulable = state.state.schedulable[[state.state.index[n] for n in fleet.names]].tolist()
    assert schedulable == [True, True, False]  # 12 s of silence > 10 s
    bus.close()
