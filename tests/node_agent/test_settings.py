"""Agent settings from the environment (as the DaemonSet sets them) and the wiring built from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.bus import RedisStreamBus, telemetry_stream
from node_agent.cli import build_agent
from node_agent.settings import AgentSettings
from protos import telemetry_pb2 as pb


def test_environment_like_the_daemonset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "worker-3")
    monkeypatch.setenv("MERIDIAN_AGENT_CLUSTER", "east")
    monkeypatch.setenv("MERIDIAN_AGENT_USAGE__PROC_ROOT", "/host/proc")
    monkeypatch.setenv("MERIDIAN_AGENT_POWER__POWERCAP_ROOT", "/host/sys/class/powercap")
    monkeypatch.setenv("MERIDIAN_AGENT_PUBLISH__INTERVAL_S", "5")
    monkeypatch.setenv("MERIDIAN_AGENT_CARBON__SOURCE", "redis")
    settings = AgentSettings()
    assert (settings.node_name, settings.cluster) == ("worker-3", "east")
    assert settings.usage.proc_root == Path("/host/proc")
    assert settings.power.powercap_root == Path("/host/sys/class/powercap")
    assert settings.publish.interval_s == 5.0 and settings.carbon.source == "redis"


@pytest.mark.parametrize(
    ("simulate_nodes", "expect_reports"),
    [pytest.param(0, 1, id="this-machine"), pytest.param(25, 25, id="simulated-fleet")],
)
def test_built_agent_publishes(tmp_path: Path, redis_url: str, key_prefix: str, simulate_nodes: int,
                               expect_reports: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    settings = AgentSettings(node_name="me", cluster=key_prefix.strip(":"), bus_url=redis_url)
    settings.simulate.nodes = simulate_nodes
    settings.power.powercap_root = tmp_path / "no-powercap"
    settings.carbon.g_per_kwh = 123.0
    agent = build_agent(settings)
    assert agent.tick()
    bus = RedisStreamBus(redis_url)
    stream = telemetry_stream(settings.cluster)
    try:
        reports = [pb.NodeTelemetry.FromString(e.payload) for e in bus.read_range(stream)]
        assert len(reports) == expect_reports
        assert {r.carbon_g_per_kwh for r in reports} == {123.0}
        if not simulate_nodes:
            assert reports[0].node == "me" and reports[0].power_source == pb.POWER_SOURCE_MODEL
            assert reports[0].capacity_milli_cpu > 0 and reports[0].used_memory_bytes > 0
    finally:
        bus.delete(stream)
        bus.close()


def test_standalone_entry_point_stays_small() -> None:
    """``python -m node_agent`` (the DaemonSet's command) works and does not import torch."""
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "node_agent", "--help"], capture_output=True, text=True,
                            timeout=120, check=False)
    assert result.returncode == 0 and "--simulate-nodes" in result.stdout
    probe = subprocess.run([sys.executable, "-c", "import sys, node_agent.__main__; print('torch' in sys.modules)"],
                           capture_output=True, text=True, timeout=120, check=True)
    assert probe.stdout.strip() == "False"
