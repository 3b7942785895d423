"""``meridian autoscaler`` end to end on a replayed series: the default live policy with a shadow beside it."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meridian.cli import build_app


def test_autoscaler_replays_a_series_with_the_default_policy_and_a_shadow(
        per_minute_csv: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="regional_scheduler.autoscaling.serving")
    result = CliRunner().invoke(build_app(), [
        "autoscaler", "--deployment", "web", "--namespace", "shop", "--replay", str(per_minute_csv),
        "--no-keda", "--interval", "0", "--minutes", "90", "--shadow", "hpa"])
    assert result.exit_code == 0, result.output
    pairs = [tuple(map(int, m.groups())) for m in
             (re.match(r"live=(\d+) shadow\(hpa\)=(\d+)", r.getMessage()) for r in caplog.records) if m]
    assert len(pairs) == 90
    # The synthetic series' rate rises through the first hours: both scale above one replica.
    assert max(live for live, _ in pairs) > 1 and max(shadow for _, shadow in pairs) > 1


@pytest.mark.parametrize("flag", ["--policy", "--shadow"])
def test_autoscaler_rejects_an_unknown_policy_with_a_usage_error(per_minute_csv: Path, flag: str) -> None:
    result = CliRunner().invoke(build_app(), [
        "autoscaler", "--deployment", "web", "--replay", str(per_minute_csv), "--no-keda", flag, "magic"])
    assert result.exit_code == 2  # a usage error naming the choices, not a traceback
    assert "unknown autoscaling policy 'magic'" in result.output and "quantile-budget" in result.output


def test_autoscaler_takes_its_policies_from_the_environment_when_no_flag_is_given(
        per_minute_csv: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_AUTOSCALER_POLICY", "hpa")
    monkeypatch.setenv("MERIDIAN_AUTOSCALER_SHADOW_POLICY", "forecast")
    caplog.set_level(logging.INFO, logger="regional_scheduler.autoscaling.serving")
    result = CliRunner().invoke(build_app(), [
        "autoscaler", "--deployment", "web", "--replay", str(per_minute_csv), "--no-keda", "--interval", "0",
        "--minutes", "3"])
    assert result.exit_code == 0, result.output
    assert sum("shadow(forecast)=" in r.getMessage() for r in caplog.records) == 3


@pytest.mark.parametrize("flag", ["--policy", "--shadow"])
def test_autoscaler_refuses_hpa_on_prometheus_without_cpu_queries(flag: str) -> None:
    """The hpa policy scales on CPU utilisation; a Prometheus source with only a rate query has none, and
    the loop must say so before it starts rather than run an HPA that never scales (issue 23 item 7).
    Refused before any connection: the URL is never contacted."""
    result = CliRunner().invoke(build_app(), [
        "autoscaler", "--deployment", "web", "--prometheus", "http://127.0.0.1:9", "--rate-query", "rate",
        "--no-keda", "--minutes", "1", *(["--policy", "hpa"] if flag == "--policy" else
                                         ["--policy", "forecast", "--shadow", "hpa"])])
    assert result.exit_code == 2, result.output
    output = " ".join(result.output.split())
    assert "'hpa' scales on CPU utilisation" in output and "--cpu-usage-query" in output


def test_autoscaler_wants_both_cpu_queries() -> None:
    result = CliRunner().invoke(build_app(), [
        "autoscaler", "--deployment", "web", "--prometheus", "http://127.0.0.1:9", "--rate-query", "rate",
        "--cpu-usage-query", "usage", "--no-keda", "--minutes", "1"])
    assert result.exit_code == 2 and "go together" in " ".join(result.output.split())
