"""``meridian learn once`` and ``meridian bench lifecycle`` through the root command, with the autoscaling
tier's real retrainer and quick scenario, on the real Redis."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meridian.bus import StreamBus
from meridian.cli import build_app
from meridian.lifecycle.records import records_stream
from meridian.lifecycle.tiers import lifecycle_for
from meridian.model_registry.registry import open_registry


def test_learn_once_retrains_from_the_published_records_and_starts_a_shadow(
        redis_url: str, key_prefix: str, redis_bus: StreamBus, tmp_path: Path) -> None:
    scenario = lifecycle_for("autoscaling").scenario(quick=True, seed=0)
    for record in scenario.records()[:8]:  # two hours of 15-minute windows
        redis_bus.publish(records_stream("autoscaling"), record.model_dump_json().encode())
    args = ["learn", "once", "--model", "autoscaling", "--redis", redis_url, "--key-prefix", key_prefix,
            "--artifacts", str(tmp_path / "store"), "--out-dir", str(tmp_path / "out")]
    result = CliRunner().invoke(build_app(), args)
    assert result.exit_code == 0, result.output
    version = json.loads(result.output[result.output.index("{"):])
    assert version["model"] == "autoscaling" and version["parent"] is None
    registry = open_registry(redis_url, artifacts_dir=tmp_path / "store", key_prefix=key_prefix)
    try:
        stored = registry.get(version["version_id"])
        assert stored.state.value == "shadow"
        assert stored.data_window.start == scenario.records()[0].start
        assert stored.data_window.end == scenario.records()[7].end
    finally:
        registry.close()
    # the records were consumed and acknowledged: a second one-shot has nothing to train on
    again = CliRunner().invoke(build_app(), args)
    assert again.exit_code == 2 and "no learning records of autoscaling" in again.output


@pytest.mark.slow
def test_bench_lifecycle_writes_every_figure_the_issue_names(redis_url: str, tmp_path: Path) -> None:
    out = tmp_path / "lifecycle.json"
    result = CliRunner().invoke(build_app(), [
        "bench", "lifecycle", "--scenarios", "autoscaling", "--quick", "--injections", "1", "--redis", redis_url,
        "--out-dir", str(tmp_path / "run"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Model lifecycle" in result.output
    scenario = json.loads(out.read_text())["scenarios"]["autoscaling"]
    for key in ("detection_delay", "stale", "continual", "oracle", "sabotage_promotions", "rollback_within",
                "false_alarms", "checks"):
        assert key in scenario
    assert scenario["stale"] > 0 and scenario["oracle"] > 0
    for kind in ("random", "wrong_regime"):
        assert scenario["sabotage_promotions"][kind]["injected"] == 1
        assert scenario["sabotage_promotions"][kind]["promoted"] == 0
        assert set(scenario["rollback_within"][kind]) >= {"rolled_back", "windows", "decisions", "damage"}
