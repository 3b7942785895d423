"""The live day-ahead carbon forecast: the same hours one day earlier, as the federation simulator does."""

from __future__ import annotations

import numpy as np

from global_scheduler.carbon_history import HourlyCarbonHistory
from global_scheduler.registry import FORECAST_HOURS, ClusterRegistry
from protos import telemetry_pb2 as tpb

T0 = 1_700_000_000 // 3600 * 3600  # an hour boundary


def test_forecast_is_yesterdays_same_hours_and_flat_where_unseen() -> None:
    h = HourlyCarbonHistory()
    fresh = h.day_ahead(["eu-north", "eu-west"], T0, np.array([10.0, 90.0]), 4)
    np.testing.assert_array_equal(fresh, [[10.0] * 4, [90.0] * 4])
    # Yesterday 00:00-01:59 relative to now: two readings in the first hour (mean), one in the second.
    h.observe("eu-west", T0 - 24 * 3600 + 60, 100.0)
    h.observe("eu-west", T0 - 24 * 3600 + 1800, 200.0)
    h.observe("eu-west", T0 - 23 * 3600 + 5, 40.0)
    h.observe("eu-west", T0 - 23 * 3600 + 9, float("nan"))  # ignored
    got = h.day_ahead(["eu-north", "eu-west"], T0 + 120, np.array([10.0, 90.0]), 4)
    np.testing.assert_array_equal(got, [[10.0] * 4, [150.0, 40.0, 90.0, 90.0]])


def test_old_hours_are_forgotten() -> None:
    h = HourlyCarbonHistory(hours_kept=48)
    for k in range(60):
        h.observe("r", T0 + k * 3600, float(k))
    # 60 hours observed, 48 kept: the day-ago hours of "now" = T0 + 59 h are k = 35..38.
    got = h.day_ahead(["r"], T0 + 59 * 3600, np.array([-1.0]), 4)
    np.testing.assert_array_equal(got, [[35.0, 36.0, 37.0, 38.0]])
    assert len(h._by_region["r"]) <= 48


def test_registry_features_carry_the_forecast() -> None:
    reg = ClusterRegistry(cluster_timeout_s=1e9)
    for k, g in enumerate((300.0, 50.0)):  # yesterday: a dirty hour, then a clean one
        reg.apply(tpb.ClusterSummary(cluster="c1", region="eu-west", sequence=k + 1,
                                     generated_unix_ms=(T0 - 24 * 3600 + k * 3600) * 1000, nodes_schedulable=1,
                                     carbon_g_per_kwh=g), now_s=T0)
    reg.apply(tpb.ClusterSummary(cluster="c1", region="eu-west", sequence=3, generated_unix_ms=T0 * 1000,
                                 nodes_schedulable=1, carbon_g_per_kwh=120.0), now_s=T0)
    _, _, f = reg.features(now_s=T0 + 60)
    assert f.carbon_forecast_hourly.shape == (1, FORECAST_HOURS)
    np.testing.assert_array_equal(f.carbon_forecast_hourly[0, :3], [300.0, 50.0, 120.0])
    assert f.carbon_now[0] == 120.0
    assert f.carbon_forecast[0] == f.carbon_forecast_hourly[0].mean()


def test_a_cluster_without_a_carbon_source_is_unknown_not_clean() -> None:
    reg = ClusterRegistry(cluster_timeout_s=1e9)
    for name, region, g, unknown in (("c1", "eu-west", 100.0, False), ("c2", "eu-north", 300.0, False),
                                     ("c3", "us-west", 0.0, True)):
        reg.apply(tpb.ClusterSummary(cluster=name, region=region, sequence=1, generated_unix_ms=T0 * 1000,
                                     nodes_schedulable=1, carbon_g_per_kwh=g, carbon_unknown=unknown), now_s=T0)
    listed = {c.name: c for c in reg.cluster_messages()}
    assert listed["c3"].carbon_unknown and not listed["c1"].carbon_unknown
    names, _, f = reg.features(now_s=T0 + 60)
    # routed as the mean of the known ones, (100 + 300) / 2, not as a 0 g/kWh grid
    assert dict(zip(names, f.carbon_now.tolist(), strict=True)) == {"c1": 100.0, "c2": 300.0, "c3": 200.0}
    assert "us-west" not in reg.carbon_history._by_region  # nothing recorded for tomorrow's forecast
