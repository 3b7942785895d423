"""``meridian bench api --hostile`` end to end at a tiny size: the JSON's shape, the hostile mix really
hit the server's limits, and every health check was answered. The throughput ratio's target (≥ 0.90)
lives in the benchmark (docs/security.md), never in a unit test."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from meridian.cli import build_app

PHASE_KEYS = {"sent", "accepted", "errors", "error_codes", "elapsed_s", "throughput_per_s", "latency_ms_p50",
              "latency_ms_p99", "latency_ms_max"}
HEALTH_KEYS = {"probes", "answered", "missed", "latency_ms_p50", "latency_ms_p99", "latency_ms_max"}


def test_tiny_hostile_run(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "hostile.json"
    result = CliRunner().invoke(build_app(), [
        "bench", "api", "--hostile", "--duration", "1", "--rate", "40", "--clients", "1", "--clusters", "2",
        "--policy", "karmada", "--routing-in-api", "--redis", redis_url, "--watches", "12", "--watch-tokens", "2",
        "--oversized-rate", "5", "--garbage-rate", "20", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "hostile / clean throughput" in result.output
    r = json.loads(out.read_text())
    assert r["mode"] == "hostile" and r["target_ratio"] == 0.9
    assert isinstance(r["ratio"], float) and isinstance(r["ratio_met"], bool)
    for phase in ("clean", "hostile"):
        assert set(r[phase]) == PHASE_KEYS
        assert r[phase]["accepted"] > 0 and r[phase]["errors"] == 0
        health = r["health"][phase]
        assert set(health) == HEALTH_KEYS
        # ~1 s of load at one probe per 100 ms, each answered.
        assert health["probes"] >= 5 and health["missed"] == 0 and health["answered"] == health["probes"]
    mix, server = r["hostile_mix"], r["server"]
    # 12 watches on 16 handler threads: 8 open at most (the server's limit), the rest refused.
    assert server["watch_limit"] == 8 and mix["watches_open_max"] == 8
    assert mix["watch_refusals"] > 0 and set(mix["watch_codes"]) <= {"RESOURCE_EXHAUSTED", "CANCELLED"}
    assert mix["oversized_sent"] > 0 and set(mix["oversized_codes"]) == {"RESOURCE_EXHAUSTED"}
    assert mix["garbage_sent"] > 0 and set(mix["garbage_codes"]) == {"INVALID_ARGUMENT"}
    assert server["undecodable_refused"] == mix["garbage_sent"]
    dispatch = r["dispatch"]
    assert dispatch["dispatched_unique"] == dispatch["accepted"] and dispatch["duplicates"] == dispatch["missing"] == 0
