"""Small synthetic series in the shared traces' formats, so tests stay fast and self-contained."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest


def write_per_minute(path: Path, days: int = 4, seed: int = 0, gap_minutes: tuple[int, int] | None = None) -> Path:
    rng = np.random.default_rng(seed)
    minutes = np.arange(days * 1440)
    rate = 200 + 150 * np.sin(2 * np.pi * (minutes % 1440) / 1440 - np.pi / 2) + 150
    counts = rng.poisson(rate)
    start = datetime(2021, 8, 1, tzinfo=UTC)
    lines = ["minute_index,assumed_minute_start_utc,events"]
    for i, c in zip(minutes, counts, strict=True):
        missing = gap_minutes is not None and gap_minutes[0] <= i % 1440 < gap_minutes[1]
        stamp = (start + timedelta(minutes=int(i))).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines.append(f"{i},{stamp},{'' if missing else c}")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def series_writer() -> Callable[..., Path]:
    """``write_per_minute(path, days=4, seed=0, gap_minutes=None)``: a synthetic per-minute series."""
    return write_per_minute


@pytest.fixture
def per_minute_csv(tmp_path: Path) -> Path:
    return write_per_minute(tmp_path / "synthetic_events_per_minute.csv")


@pytest.fixture
def hourly_csv(tmp_path: Path) -> Path:
    start = datetime(2016, 1, 1, tzinfo=UTC)
    lines = ["hour_start_utc,requests,distinct_pages,bytes"]
    for h in range(4 * 24):
        stamp = (start + timedelta(hours=h)).strftime("%Y-%m-%dT%H:%M:%SZ")
        lines.append(f"{stamp},{6000 + 3000 * np.sin(2 * np.pi * (h % 24) / 24):.0f},1,1")
    path = tmp_path / "synthetic_requests_per_hour.csv"
    path.write_text("\n".join(lines) + "\n")
    return path
