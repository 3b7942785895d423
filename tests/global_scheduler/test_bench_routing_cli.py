"""`meridian bench routing`: the issue's JSON keys per policy, and carbon on the same work (--same-work-as)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from global_scheduler.bench_routing import CAPACITY_KEYS, JSON_KEYS
from meridian.cli import build_app
from meridian.traces import default_traces_dir

TRACES = default_traces_dir()
pytestmark = pytest.mark.skipif(not (TRACES / "alibaba-dlrm-v2025").exists(), reason="shared traces not available")
WINDOW = ["--days", "1", "--clusters", "6", "--latency-clusters", "0"]


def _bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "routing.json"
    res = CliRunner().invoke(build_app(), ["bench", "routing", *WINDOW, "--json", str(out), *args])
    assert res.exit_code == 0, res.output
    return json.loads(out.read_text())


def test_json_has_the_issue_keys_for_every_policy(tmp_path: Path) -> None:
    data = _bench(tmp_path, "--policies", "karmada,least-carbon")
    assert set(data["policies"]) == {"karmada", "least-carbon"}
    for result in data["policies"].values():
        assert set(JSON_KEYS) <= set(result)
        assert result["carbon_kg"] > 0 and result["energy_kwh"] > 0
    assert data["same_work_as"] is None


def test_json_reports_decision_counts_and_memory(tmp_path: Path) -> None:
    """The capacity model's figures (issue 27): decision p99 over the run's own decisions, and memory."""
    data = _bench(tmp_path, "--policies", "karmada")
    result = data["policies"]["karmada"]
    assert set(CAPACITY_KEYS) <= set(result)
    assert result["decisions"] >= result["placed"] > 0  # every start took a decision; reroutes take more
    assert result["decision_ms_p99"] >= result["decision_ms_p50"] > 0
    assert result["wall_ms_per_decision"] > 0
    memory = data["memory"]
    assert memory["peak_rss_mib"] >= result["peak_rss_mib"] > 0
    assert memory["federation_build_peak_mib"] >= memory["federation_state_mib"] > 0


def test_same_work_runs_every_policy_on_what_the_reference_started(tmp_path: Path) -> None:
    full = _bench(tmp_path, "--policies", "least-carbon,karmada")["policies"]
    same = _bench(tmp_path, "--policies", "least-carbon,karmada", "--same-work-as", "least-carbon")
    assert same["same_work_as"] == "least-carbon"
    lc_full, lc_same, km_same = full["least-carbon"], same["policies"]["least-carbon"], same["policies"]["karmada"]
    assert lc_full["failures"] > 0  # otherwise this test compares nothing
    # Only the work least-carbon started is left: fewer workloads, the same for every policy.
    assert lc_same["workloads"] == km_same["workloads"] < lc_full["workloads"]
    # A workload that failed never held capacity, so leaving it out changes none of least-carbon's decisions.
    assert lc_same["failures"] == 0
    assert lc_same["carbon_kg"] == pytest.approx(lc_full["carbon_kg"], rel=1e-9)
    assert lc_same["workload_hours"] == pytest.approx(lc_full["workload_hours"], rel=1e-9)


def test_unknown_reference_policy_is_a_usage_error() -> None:
    res = CliRunner().invoke(build_app(), ["bench", "routing", *WINDOW, "--same-work-as", "nope"])
    assert res.exit_code == 2
    assert "--same-work-as" in res.output and "unknown" in res.output


def test_default_policies_are_gnn_and_every_baseline(tmp_path: Path) -> None:
    from global_scheduler.routing.registry import BASELINES

    data = _bench(tmp_path)
    assert set(data["policies"]) == {"gnn", *BASELINES}
    safe, greedy = data["policies"]["least-carbon-slo"], data["policies"]["least-carbon"]
    assert safe["slo_violations"] == 0 < greedy["slo_violations"]
    summary = data["comparison"]
    assert summary["carbon_vs_least_carbon_slo"] == pytest.approx(
        data["policies"]["gnn"]["carbon_kg"] / safe["carbon_kg"] - 1)
    assert summary["failures_vs_least_carbon_slo"] == [data["policies"]["gnn"]["failures"], safe["failures"]]


# The same window options in `python -m experiments.carbon_bound`: tests/experiments/test_carbon_bound.py.
@pytest.mark.parametrize(("args", "message"), [
    pytest.param(["--start", "13-45"], "is not MM-DD", id="bad-start"),
    pytest.param(["--carbon", "EMPTY"], "no carbon CSV files", id="empty-carbon-folder"),
])
def test_window_errors_are_usage_errors(tmp_path: Path, args: list[str], message: str) -> None:
    args = [str(tmp_path) if a == "EMPTY" else a for a in args]
    res = CliRunner().invoke(build_app(), ["bench", "routing", "--days", "1", "--clusters", "2", *args])
    assert res.exit_code == 2, res.output  # a usage error, not a traceback
    # rich wraps the message inside a box at any width: compare without spaces and box edges
    assert message.replace(" ", "") in re.sub(r"[\s│]+", "", res.output), res.output
