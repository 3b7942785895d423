"""The cluster summary's arithmetic, its publisher, and the CLI entry points of the telemetry fabric."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meridian.bus import SUMMARY_STREAM, InProcessStreamBus, StreamEntry
from meridian.cli import build_app
from meridian.envtest import wait_for
from meridian.metrics import seed_fragmentation_score
from meridian.model import GIB
from meridian.telemetry import decode_reports
from protos import telemetry_pb2 as pb
from regional_scheduler.summary_publisher import SummaryPublisher, SummarySettings, build_summary
from regional_scheduler.telemetry_state import TelemetryState


def _state(clock: list[float]) -> TelemetryState:
    ts = TelemetryState(cluster="east", stale_after_s=10.0, clock=lambda: clock[0])
    reports = [
        pb.NodeTelemetry(cluster="east", node="a", sequence=1, allocatable_milli_cpu=8000,
                         allocatable_memory_bytes=32 * GIB, requested_milli_cpu=2000, requested_memory_bytes=8 * GIB,
                         used_milli_cpu=1000, power_watts=200.0, energy_joules=5000.0, carbon_g_per_kwh=100.0,
                         pue=1.5, allocatable_gpu=2, gpu_free_milli=[1000, 500]),
        pb.NodeTelemetry(cluster="east", node="b", sequence=1, allocatable_milli_cpu=4000,
                         allocatable_memory_bytes=16 * GIB, requested_milli_cpu=1000, used_milli_cpu=3000,
                         power_watts=300.0, energy_joules=7000.0, carbon_g_per_kwh=400.0, pue=1.0),
        pb.NodeTelemetry(cluster="east", node="c", sequence=1, allocatable_milli_cpu=16000,
                         allocatable_memory_bytes=64 * GIB, unschedulable=True, power_watts=100.0,
                         carbon_g_per_kwh=100.0, pue=1.0),
    ]
    batch, _ = decode_reports([StreamEntry(f"1-{i}", r.SerializeToString()) for i, r in enumerate(reports)])
    ts.apply(batch)
    return ts


def test_summary_arithmetic() -> None:
    clock = [0.0]
    ts = _state(clock)
    s = build_summary(ts, region="eu", sequence=7, now_s=12.0)
    assert (s.cluster, s.region, s.sequence, s.generated_unix_ms) == ("east", "eu", 7, 12_000)
    assert (s.nodes_total, s.nodes_schedulable, s.nodes_stale) == (3, 2, 0)  # c is cordoned
    # schedulable a + b: allocatable 8000 + 4000, requested 2000 + 1000, free 9000; c excluded
    assert (s.allocatable.milli_cpu, s.requested.milli_cpu, s.free.milli_cpu) == (12_000, 3000, 9000)
    assert s.max_node_free_milli_cpu == 6000  # a: 8000 − 2000
    assert s.gpu_free_milli == 1500 and s.gpu_devices_idle == 1
    # power over fresh nodes: 200 + 300 + 100 = 600 W
    assert s.power_watts == pytest.approx(600.0)
    assert s.energy_joules == pytest.approx(12_000.0)
    # power-weighted intensity: (200·100 + 300·400 + 100·100) / 600 = 250
    assert s.carbon_g_per_kwh == pytest.approx(250.0)
    # Σ P·PUE·I / 3.6e6 = (200·1.5·100 + 300·1·400 + 100·1·100) / 3.6e6 = 160000 / 3.6e6 g/s
    assert s.carbon_g_per_s == pytest.approx(160_000 / 3.6e6)
    assert s.pue == pytest.approx((200 * 1.5 + 300 + 100) / 600)
    assert s.fragmentation_score == pytest.approx(seed_fragmentation_score(ts.state))
    assert s.reports_applied == 3


def test_stale_nodes_leave_the_summary() -> None:
    clock = [0.0]
    ts = _state(clock)
    clock[0] = 30.0
    ts.mark_stale()
    s = build_summary(ts, region="eu", sequence=1, now_s=30.0)
    assert (s.nodes_schedulable, s.nodes_stale) == (0, 3)
    assert s.power_watts == 0.0 and s.free.milli_cpu == 0


def test_publisher_appends_to_the_summary_stream() -> None:
    bus = InProcessStreamBus()
    publisher = SummaryPublisher(bus=bus, state=_state([0.0]), settings=SummarySettings(region="eu"),
                                 clock=lambda: 5.0)
    publisher.publish_once()
    publisher.publish_once()
    latest = bus.read_latest(SUMMARY_STREAM)
    assert latest is not None
    summary = pb.ClusterSummary.FromString(latest.payload)
    assert (summary.cluster, summary.sequence) == ("east", 2)


def test_cli_commands_are_registered() -> None:
    runner = CliRunner()
    app = build_app()
    for args in (["agent", "--help"], ["carbon-feeder", "--help"], ["regional-telemetry", "--help"],
                 ["bench", "telemetry", "--help"]):
        result = runner.invoke(app, args)
        assert result.exit_code == 0, result.output


def test_bench_telemetry_smoke(tmp_path: Path, redis_url: str) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(build_app(), [
        "bench", "telemetry", "--nodes", "400", "--duration-s", "1", "--warmup-s", "0.5", "--raw-seconds", "0.2", "--drain-reports", "2000",
        "--redis-url", redis_url, "--json", str(out)])
    assert result.exit_code == 0, result.output
    figures = json.loads(out.read_text())
    assert {"reports_per_s", "raw_xadd_per_s", "consumer_rss_mb"} <= figures.keys()
    assert figures["reports_per_s"] > 0 and figures["raw_xadd_per_s"] > 0 and figures["consumer_rss_mb"] > 0
    assert figures["nodes_in_state"] == 400 and figures["dead_lettered"] == 0
    assert figures["consumer_drain_reports_per_s"] > 0


def test_agents_to_summary_end_to_end(redis_url: str, key_prefix: str) -> None:
    """A simulated agent → Redis → the running regional telemetry → a summary on meridian:summary."""
    from meridian.bus import RedisStreamBus
    from node_agent.cli import build_agent
    from node_agent.settings import AgentSettings
    from regional_scheduler.summary_publisher import RegionalTelemetry
    from regional_scheduler.telemetry_state import TelemetryConsumerSettings

    agent_settings = AgentSettings(cluster="e2e", region="eu", bus_url=redis_url, key_prefix=key_prefix)
    agent_settings.simulate.nodes = 30
    agent = build_agent(agent_settings)
    regional = RegionalTelemetry(
        settings=TelemetryConsumerSettings(cluster="e2e", bus_url=redis_url, key_prefix=key_prefix, bus={"block_ms": 100}),
        summary=SummarySettings(region="eu", interval_s=0.05)).start()
    reader = RedisStreamBus(redis_url, key_prefix=key_prefix)
    try:
        agent.tick()

        def complete() -> pb.ClusterSummary | None:
            latest = reader.read_latest(SUMMARY_STREAM)
            summary = pb.ClusterSummary.FromString(latest.payload) if latest else None
            return summary if summary is not None and summary.nodes_total == summary.reports_applied == 30 else None

        summary = wait_for(complete, timeout=60, interval=0.02, message="a summary of all 30 nodes' reports")
        assert (summary.cluster, summary.region) == ("e2e", "eu")
        assert summary.power_watts > 0 and summary.nodes_schedulable == 30
    finally:
        regional.close()
        reader.close()


def _carbon_state(sources: list[tuple[float, float, int]]) -> TelemetryState:
    ts = TelemetryState(cluster="east", stale_after_s=10.0, clock=lambda: 0.0)
    reports = [pb.NodeTelemetry(cluster="east", node=f"n{i}", sequence=1, allocatable_milli_cpu=1000,
                                allocatable_memory_bytes=GIB, power_watts=watts, carbon_g_per_kwh=intensity,
                                carbon_source=source, pue=1.0)
               for i, (watts, intensity, source) in enumerate(sources)]
    batch, rejected = decode_reports([StreamEntry(f"1-{i}", r.SerializeToString()) for i, r in enumerate(reports)])
    assert not rejected
    ts.apply(batch)
    return ts


@pytest.mark.parametrize(("sources", "carbon", "unknown"), [
    # (200·100 + 300·400) / 500 = 280; the node without a source is left out, not averaged in as 0
    pytest.param([(200.0, 100.0, pb.CARBON_SOURCE_STATIC), (300.0, 400.0, pb.CARBON_SOURCE_FEED_FILE),
                  (500.0, 0.0, pb.CARBON_SOURCE_NONE)], 280.0, False, id="one-node-without-a-source"),
    pytest.param([(200.0, 0.0, pb.CARBON_SOURCE_NONE), (300.0, 0.0, pb.CARBON_SOURCE_NONE)], 0.0, True,
                 id="no-source-anywhere-is-unknown"),
    # no power drawn: the plain mean of the known intensities, (100 + 300) / 2
    pytest.param([(0.0, 100.0, pb.CARBON_SOURCE_STATIC), (0.0, 300.0, pb.CARBON_SOURCE_STATIC)], 200.0, False,
                 id="idle-but-known"),
    pytest.param([(100.0, 50.0, pb.CARBON_SOURCE_UNSPECIFIED)], 50.0, False, id="older-agents-are-believed"),
])
def test_summary_carbon_without_a_source_is_unknown(sources: list[tuple[float, float, int]], carbon: float,
                                                    unknown: bool) -> None:
    s = build_summary(_carbon_state(sources), region="eu", sequence=1, now_s=1.0)
    assert s.carbon_g_per_kwh == pytest.approx(carbon) and s.carbon_unknown is unknown
