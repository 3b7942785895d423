"""Series in any of the shared formats land on a per-minute grid; missing stays missing."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from regional_scheduler.autoscaling.request_series import SeriesFormatError, load_request_series, split_days


def test_per_minute_series(per_minute_csv: Path) -> None:
    series = load_request_series(per_minute_csv)
    assert series.source_step_s == 60 and series.minutes == 4 * 1440
    assert series.minute_of_day()[0] == 0 and series.day_of_week()[0] == 6  # 2021-08-01 was a Sunday


def test_hourly_series_is_spread_evenly_over_its_minutes(hourly_csv: Path) -> None:
    series = load_request_series(hourly_csv)
    assert series.source_step_s == 3600 and series.minutes == 4 * 24 * 60
    # 6000 requests in the first hour → 100 per minute for each of its 60 minutes.
    np.testing.assert_allclose(series.requests_per_minute[:60], 100.0)
    assert series.requests_per_minute.sum() == pytest.approx(sum(
        6000 + 3000 * np.sin(2 * np.pi * (h % 24) / 24) for h in range(96)), abs=100)


def test_empty_cells_are_missing_not_zero(tmp_path: Path, series_writer: Callable[..., Path]) -> None:
    series = load_request_series(series_writer(tmp_path / "gappy.csv", gap_minutes=(1411, 1440)))
    assert np.isnan(series.requests_per_minute[1411:1440]).all()
    assert np.isfinite(series.requests_per_minute[:1411]).all()


@pytest.mark.parametrize(
    ("header", "row"),
    [
        pytest.param("when,requests", "2021-01-01T00:00:00Z,1", id="no-time-column"),
        pytest.param("minute_start_utc,bytes", "2021-01-01T00:00:00Z,1", id="no-value-column"),
    ],
)
def test_unrecognised_formats_are_refused(tmp_path: Path, header: str, row: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(f"{header}\n{row}\n{row}\n")
    with pytest.raises(SeriesFormatError):
        load_request_series(path)


@pytest.mark.parametrize(
    ("days", "fraction", "train_days"),
    [pytest.param(4, 0.25, 3, id="4-days"), pytest.param(20, 0.25, 15, id="20-days"),
     pytest.param(2, 0.9, 1, id="at-least-one-training-day")],
)
def test_split_holds_back_whole_days_from_the_end(tmp_path: Path, series_writer: Callable[..., Path], days: int,
                                                  fraction: float, train_days: int) -> None:
    series = load_request_series(series_writer(tmp_path / "s.csv", days=days))
    split = split_days(series, fraction)
    assert split.train_days == train_days and split.train_end_minute == train_days * 1440
