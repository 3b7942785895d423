"""Carbon series as a feed (both shared layouts), the collector's sources and the Redis feeder."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from meridian.bus import InProcessStreamBus, RedisStreamBus, carbon_key
from meridian.carbon_feed import CarbonFeed, CarbonFeedError, load_carbon_series
from node_agent.collectors.carbon import CarbonCollector, CarbonFeeder
from protos import telemetry_pb2 as pb


@pytest.mark.parametrize(
    ("relative", "rows", "mean", "first"),
    [
        # counts and means from the traces README
        pytest.param("carbon/electricitymaps/BR_2021_hourly.csv", 8760, 126.3, "2021-01-01T00:00:00", id="em-BR"),
        pytest.param("carbon/electricitymaps/US-CAL-CISO_2022_hourly.csv", 8760, 194.6, "2022-01-01T00:00:00",
                     id="em-CISO"),
        pytest.param("carbon/lets-wait-awhile/ger_ci.csv", 37147, 315.2, "2019-12-20T00:00:00", id="lwa-DE"),
        pytest.param("carbon/lets-wait-awhile/gb_ci.csv", 21980, 217.6, "2019-12-20T00:00:00", id="lwa-GB"),
    ],
)
def test_shared_series_load(traces_dir: Path, relative: str, rows: int, mean: float, first: str) -> None:
    timestamps, values = load_carbon_series(traces_dir / relative)
    assert len(values) == rows
    assert values.mean() == pytest.approx(mean, abs=0.05)
    assert str(timestamps[0]) == first
    assert (np.diff(timestamps.astype(np.int64)) > 0).all()


@pytest.mark.parametrize(
    ("text", "column", "expected"),
    [
        pytest.param("Datetime (UTC),Zone Id,Carbon Intensity gCO\u2082eq/kWh (direct),"
                     "Carbon Intensity gCO\u2082eq/kWh (LCA)\r\n2021-01-01 00:00:00,X,10.5,20.5\r\n"
                     "2021-01-01 01:00:00,X,11.5,21.5\r\n", "direct", [10.5, 11.5], id="em-crlf-direct"),
        pytest.param("Datetime (UTC),Zone Id,Carbon Intensity gCO\u2082eq/kWh (direct),"
                     "Carbon Intensity gCO\u2082eq/kWh (LCA)\r\n2021-01-01 00:00:00,X,10.5,20.5\r\n", "LCA", [20.5],
                     id="em-lca"),
        pytest.param("Time,Carbon Intensity\n2020-01-01 00:30:00,5\n2020-01-01 00:00:00,4\n", "direct", [4.0, 5.0],
                     id="lwa-unsorted"),
        pytest.param("\ufeffTime,Carbon Intensity\n2020-01-01 00:00:00,4\n2020-01-01 00:15:00,\n", "direct", [4.0],
                     id="bom-and-empty-value"),
    ],
)
def test_layouts(tmp_path: Path, text: str, column: str, expected: list[float]) -> None:
    path = tmp_path / "series.csv"
    path.write_bytes(text.encode())
    _, values = load_carbon_series(path, column=column)
    assert values.tolist() == expected


@pytest.mark.parametrize(
    "text",
    [pytest.param("", id="empty"), pytest.param("Time,Price\n2020-01-01 00:00:00,4\n", id="no-intensity-column"),
     pytest.param("Time,Carbon Intensity\n", id="no-rows")],
)
def test_unreadable_series(tmp_path: Path, text: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(CarbonFeedError):
        load_carbon_series(path)


def test_feed_is_stepwise_and_wraps() -> None:
    t0 = np.datetime64("2020-01-01T00:00:00", "s")
    feed = CarbonFeed(t0 + np.array([0, 3600, 7200], dtype="timedelta64[s]"), np.array([100.0, 200.0, 300.0]))
    base = float(t0.astype(np.int64))
    # sample in force: the last one at or before t; the cycle is 3 h (span 2 h + one 1 h step)
    assert feed.intensity_at(base) == 100.0
    assert feed.intensity_at(base + 3599) == 100.0
    assert feed.intensity_at(base + 3600) == 200.0
    assert feed.intensity_at(base + 3 * 3600 + 10) == 100.0  # wrapped
    assert np.asarray(feed.intensity_at(np.array([base, base + 7300]))).tolist() == [100.0, 300.0]
    shifted = CarbonFeed(feed.timestamps, feed.g_per_kwh, offset_s=3600)
    assert shifted.intensity_at(base) == 200.0


@pytest.mark.parametrize("kind", ["memory", "redis"])
def test_redis_key_source_follows_the_feeder(kind: str, redis_url: str, key_prefix: str) -> None:
    bus = InProcessStreamBus(key_prefix=key_prefix) if kind == "memory" else RedisStreamBus(redis_url,
                                                                                          key_prefix=key_prefix)
    t0 = np.datetime64("2020-01-01T00:00:00", "s")
    feed = CarbonFeed(t0 + np.array([0, 3600], dtype="timedelta64[s]"), np.array([150.0, 250.0]))
    collector = CarbonCollector(source="redis", bus=bus, zone="DE", static_g_per_kwh=999.0)
    assert collector.read(0.0) == (999.0, pb.CARBON_SOURCE_STATIC)  # nothing fed yet: the static fallback
    feeder = CarbonFeeder(bus, feed, "DE")
    feeder.publish_once(float(t0.astype(np.int64)) + 3600)
    assert bus.get_value(carbon_key("DE")) == b"250.0"
    assert collector.read(0.0) == (250.0, pb.CARBON_SOURCE_REDIS_KEY)
    bus.set_value(carbon_key("DE"), b"garbage")
    assert collector.read(0.0) == (250.0, pb.CARBON_SOURCE_REDIS_KEY)  # keeps the last good value
    assert collector.errors_total == 1
    bus.close()


def test_file_source(traces_dir: Path) -> None:
    collector = CarbonCollector.from_file(traces_dir / "carbon/lets-wait-awhile/fr_ci.csv")
    value, source = collector.read(1_600_000_000.0)
    assert source == pb.CARBON_SOURCE_FEED_FILE
    assert 19.5 <= value <= 116.4  # the series' range (README)


@pytest.mark.parametrize(("collector", "expected"), [
    pytest.param(CarbonCollector(), (0.0, pb.CARBON_SOURCE_NONE), id="nothing-configured"),
    pytest.param(CarbonCollector(source="redis", bus=InProcessStreamBus(), zone="DE"), (0.0, pb.CARBON_SOURCE_NONE),
                 id="redis-before-the-first-read"),
    pytest.param(CarbonCollector(static_g_per_kwh=0.0), (0.0, pb.CARBON_SOURCE_STATIC), id="a-configured-zero"),
])
def test_no_carbon_source_is_said_not_reported_as_zero(collector: CarbonCollector, expected: tuple[float, int]) -> None:
    assert collector.read(0.0) == expected
