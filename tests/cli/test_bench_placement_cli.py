import json
from pathlib import Path

from typer.testing import CliRunner

from meridian.cli import build_app

KEYS = {"gpu_alloc_pct_at_100", "unallocated_gpus_at_100", "frag_gpu_pct_at_100", "failure_rate", "cpu_alloc_pct",
        "mem_alloc_pct", "frag_gini", "util_variance", "decision_ms_p50", "decision_ms_p99"}


def test_bench_placement_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(build_app(), ["bench", "placement", "--scenario", "seed-50x200", "--seeds", "2",
                                              "--policies", "least-allocated,best-fit", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"least-allocated", "best-fit"}
    for summary in data["policies"].values():
        assert set(summary) >= KEYS
        assert summary["gpu_alloc_pct_at_100"] is None  # no GPUs in this scenario
    assert data["policies"]["best-fit"]["failure_rate"] < data["policies"]["least-allocated"]["failure_rate"]


def test_unknown_policy_is_rejected() -> None:
    result = CliRunner().invoke(build_app(), ["bench", "placement", "--scenario", "seed-50x200", "--policies", "nope"])
    assert result.exit_code != 0
    assert "unknown placement policy" in result.output
