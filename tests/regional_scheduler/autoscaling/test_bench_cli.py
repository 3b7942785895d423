"""``meridian bench autoscale`` end to end on a small series (table + JSON)."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from meridian.cli import build_app


def test_bench_autoscale_writes_json_with_required_keys(per_minute_csv: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(build_app(), ["bench", "autoscale", "--series", str(per_minute_csv),
                                              "--policies", "hpa,quantile-budget,learned", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    entry = report["series"][per_minute_csv.stem]
    for policy in ("hpa", "quantile-budget", "learned"):
        assert set(entry["policies"][policy]) >= {"slo_violation_minutes", "p99_latency_ms", "replica_hours",
                                                  "scale_events"}
    assert set(entry["vs_hpa"]["learned"]) == {"violation_reduction", "replica_hours_ratio", "meets_target"}
    # The budget policy's levels were fitted and calibrated (on training days) and are reported.
    assert entry["quantile"]["tau_up"] >= entry["quantile"]["tau_down"]
    assert report["settings"]["budget"]["ratio"] == 1.03
    assert entry["train_days"] == 3 and entry["held_back_days"] == 1


def test_unknown_policy_is_rejected(per_minute_csv: Path) -> None:
    result = CliRunner().invoke(build_app(), ["bench", "autoscale", "--series", str(per_minute_csv),
                                              "--policies", "hpa,magic"])
    assert result.exit_code != 0
