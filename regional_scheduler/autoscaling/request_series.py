"""Request-rate series: load any CSV in the shared traces' formats onto a per-minute grid.

The shared series differ in step (per minute, per hour), timestamp column and value column. A series is
recognised by its columns, not its file name, so a new file in the same format works unchanged:

* the timestamp is the first column whose name contains ``minute_start`` or ``hour_start``
  (``minute_start_utc``, ``assumed_minute_start_utc``, ``minute_start_anon``, ``hour_start_utc``);
* the value is the first of ``requests`` / ``events`` / ``count`` present;
* the step is the median difference between consecutive timestamps (60 s or 3600 s, any multiple of a
  minute is accepted). An hourly count is spread evenly over its 60 minutes (the rate is held constant
  within the hour; nothing is interpolated across hours).

Empty cells are *missing* data (Twitter's 23:31-23:59 gaps): kept as NaN so the simulator can hold the
last known rate and leave those minutes out of the SLO accounting rather than inventing zeros.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

TIME_COLUMN_MARKERS = ("minute_start", "hour_start")
VALUE_COLUMNS = ("requests", "events", "count")
MINUTES_PER_DAY = 1440


class SeriesFormatError(ValueError):
    """The file is not a request-rate series in a recognised format."""


@dataclass(frozen=True)
class RequestSeries:
    """Requests per minute on a regular minute grid (NaN = missing), starting at ``start``."""

    name: str
    start: datetime
    requests_per_minute: np.ndarray
    source_step_s: int

    @property
    def minutes(self) -> int:
        return int(self.requests_per_minute.shape[0])

    @property
    def whole_days(self) -> int:
        return self.minutes // MINUTES_PER_DAY

    def minute_of_day(self) -> np.ndarray:
        """Minute of the (series-local) day for every minute, 0..1439."""
        first = self.start.hour * 60 + self.start.minute
        return (first + np.arange(self.minutes)) % MINUTES_PER_DAY

    def day_of_week(self) -> np.ndarray:
        """Day of week (Monday = 0) for every minute."""
        first = self.start.hour * 60 + self.start.minute
        return (self.start.weekday() + (first + np.arange(self.minutes)) // MINUTES_PER_DAY) % 7

    def slice_minutes(self, begin: int, end: int) -> RequestSeries:
        from datetime import timedelta

        return RequestSeries(self.name, self.start + timedelta(minutes=begin),
                             self.requests_per_minute[begin:end].copy(), self.source_step_s)


@dataclass(frozen=True)
class DaySplit:
    """Whole-day split: minutes ``[0, train_end)`` train, ``[train_end, minutes)`` are held back."""

    train_end_minute: int
    total_minutes: int
    train_days: int
    held_back_days: float


def _parse_time(text: str) -> datetime:
    value = text.strip().replace("Z", "+00:00")
    parsed = datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def load_request_series(path: Path) -> RequestSeries:
    """Read one series; see the module docstring for the recognised formats."""
    with path.open(newline="") as handle:
        reader = csv.reader(handle)
        try:
            header = [h.strip() for h in next(reader)]
        except StopIteration as exc:
            raise SeriesFormatError(f"{path}: empty file") from exc
        rows = [row for row in reader if row]
    time_idx = next((i for i, h in enumerate(header) if any(m in h for m in TIME_COLUMN_MARKERS)), None)
    value_idx = next((header.index(v) for v in VALUE_COLUMNS if v in header), None)
    if time_idx is None or value_idx is None:
        raise SeriesFormatError(
            f"{path}: need a '*minute_start*' or '*hour_start*' column and one of {VALUE_COLUMNS}; got {header}")
    if len(rows) < 2:
        raise SeriesFormatError(f"{path}: fewer than two rows")
    epoch = np.array([_parse_time(r[time_idx]).timestamp() for r in rows], dtype=np.int64)
    values = np.array([float(r[value_idx]) if r[value_idx].strip() else np.nan for r in rows])
    order = np.argsort(epoch, kind="stable")
    epoch, values = epoch[order], values[order]
    step_s = int(np.median(np.diff(epoch)))
    if step_s <= 0 or step_s % 60:
        raise SeriesFormatError(f"{path}: step of {step_s} s is not a whole number of minutes")
    minutes_per_step = step_s // 60
    slot = (epoch - epoch[0]) // step_s
    grid = np.full(int(slot[-1]) + 1, np.nan)
    grid[slot] = values  # a missing row is a missing value, as an empty cell is
    per_minute = np.repeat(grid / minutes_per_step, minutes_per_step)
    start = datetime.fromtimestamp(int(epoch[0]), tz=UTC)
    return RequestSeries(name=path.stem, start=start, requests_per_minute=per_minute, source_step_s=step_s)


def split_days(series: RequestSeries, held_back_fraction: float) -> DaySplit:
    """Hold back the last ``ceil(fraction × whole days)`` days (at least one; at least one day trains)."""
    days = max(series.whole_days, 2)
    held = min(max(1, int(np.ceil(held_back_fraction * days))), days - 1)
    train_end = (days - held) * MINUTES_PER_DAY
    if train_end >= series.minutes:
        raise SeriesFormatError(f"{series.name}: too short to hold back a day ({series.minutes} minutes)")
    return DaySplit(train_end_minute=train_end, total_minutes=series.minutes,
                    train_days=days - held, held_back_days=(series.minutes - train_end) / MINUTES_PER_DAY)


def split_requests(series: RequestSeries, parts: int, *, seed: int = 0) -> list[RequestSeries]:
    """``series`` shared among ``parts`` regions: every request goes to one region, uniformly at random.

    This is how one service's users split over regions by where they are: each region sees the same
    daily and weekly shape with its own noise, and no request is in two regions. The shares are drawn
    per minute (a multinomial of the minute's rounded count), missing minutes stay missing in every part,
    and a seed gives the same split. Region ``i`` is named ``<series>-<i+1>``."""
    if parts < 1:
        raise ValueError(f"parts must be at least 1, got {parts}")
    values = series.requests_per_minute
    observed = np.isfinite(values)
    counts = np.where(observed, np.rint(np.maximum(values, 0.0)), 0).astype(np.int64)
    shares = np.random.default_rng(seed).multinomial(counts, np.full(parts, 1.0 / parts))
    return [RequestSeries(f"{series.name}-{i + 1}", series.start,
                          np.where(observed, shares[:, i].astype(float), np.nan), series.source_step_s)
            for i in range(parts)]


def shared_series_paths(traces_dir: Path) -> list[Path]:
    """The per-minute / per-hour request series under ``traces_dir/requests``."""
    return sorted(p for p in (traces_dir / "requests").glob("*/*.csv"))
