"""``meridian demo`` end to end, small: every tier in one process over the real Redis and gRPC, then a replay.

The README's main command must keep working; this runs it with fewer workloads and nodes and checks what
it measured, including the live energy shared out to tenants.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from global_scheduler.accounting.table import UNATTRIBUTED_TENANT
from meridian.cli import build_app
from meridian_demo.cli import tenant_rows


def test_demo_runs_every_tier(tmp_path: Path, redis_url: str) -> None:
    out = tmp_path / "demo.json"
    result = CliRunner().invoke(build_app(), [
        "demo", "--workloads", "12", "--nodes-per-cluster", "8", "--bus", redis_url, "--replay-days", "1",
        "--replay-clusters", "6", "--save-run", str(tmp_path / "run"), "--json", str(out)])
    assert result.exit_code == 0, result.output
    measured = json.loads(out.read_text())
    live = measured["live"]
    assert live["workloads"] == 12
    assert sum(live["states"].values()) == 12 and live["states"].get("running", 0) > 0
    assert sum(live["replicas_running_by_region"].values()) > 0
    assert sum(r["energy_kwh"] for r in live["energy"].values()) > 0
    tenants = {name: t["energy_kwh"] for name, t in live["energy_by_tenant"].items()}
    assert any(name != UNATTRIBUTED_TENANT and kwh > 0 for name, kwh in tenants.items()), tenants
    # Shares conserve energy: tenants plus the unattributed row add up to the regions' total.
    assert sum(tenants.values()) == pytest.approx(sum(r["energy_kwh"] for r in live["energy"].values()), rel=1e-9)
    assert set(measured["replay"]) and (tmp_path / "run").is_dir()


def test_tenant_table_keeps_the_unattributed_row_and_sums_the_tail() -> None:
    groups = {f"app_{i}": (float(i), i / 10) for i in range(1, 15)} | {UNATTRIBUTED_TENANT: (0.5, 0.2)}
    rows = tenant_rows(groups, top=3)
    assert [r[0] for r in rows] == ["app_14", "app_13", "app_12", UNATTRIBUTED_TENANT, "(11 more tenants)"]
    assert rows[-1][1] == pytest.approx(sum(range(1, 12))) and rows[-1][2] == pytest.approx(sum(range(1, 12)) / 10)
    assert sum(r[1] for r in rows) == pytest.approx(sum(v[0] for v in groups.values()))  # nothing lost
    assert [r[0] for r in tenant_rows({"a": (1.0, 0.0)}, top=3)] == ["a"]  # no tail row when all fit
