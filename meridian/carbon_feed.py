"""Grid carbon intensity as a feed: raw series from the shared traces, read at any instant.

:func:`load_carbon_series` is deliberately generic — ``(timestamps, g_per_kwh)`` at the file's own
resolution, no resampling — so agents, the simulator and the global scheduler can all use it:

* Electricity Maps exports (``Datetime (UTC),…,Carbon Intensity gCO₂eq/kWh (direct),…``): CRLF
  line endings and a non-ASCII ``₂`` in the header, so the column is found by the prefix
  ``Carbon Intensity`` plus the ``(direct)``/``(LCA)`` suffix, never by its full name.
* Let's Wait Awhile (``Time,Carbon Intensity``): 15- or 30-minute samples; the source states no
  time zone, taken as UTC (as :mod:`meridian.grid_data` does).

For hourly grids with gap filling and prices, see :mod:`meridian.grid_data`; this module is the
cheap raw reader behind a live feed. :class:`CarbonFeed` replays a series: ``intensity_at(t)`` is
the sample in force at ``t`` (step-wise, the last sample at or before ``t``), with an optional
offset so a run "now" replays a chosen day of the trace, wrapping around its length.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np


class CarbonFeedError(ValueError):
    """A carbon series that cannot be read; the message names the file."""


def _column(header: list[str], column: str, path: Path) -> int:
    names = [h.strip() for h in header]
    candidates = [i for i, h in enumerate(names) if h.lower().startswith("carbon intensity")]
    if not candidates:
        raise CarbonFeedError(f"{path}: no 'Carbon Intensity' column in header {names}")
    wanted = [i for i in candidates if f"({column.lower()})" in names[i].lower()]
    return wanted[0] if wanted else candidates[0]


def load_carbon_series(path: str | Path, *, column: str = "direct") -> tuple[np.ndarray, np.ndarray]:
    """Timestamps (``datetime64[s]``, UTC, sorted) and intensities in gCO2/kWh from one CSV file.

    ``column`` picks ``direct`` or ``LCA`` in Electricity Maps files and is ignored where a file has
    a single intensity column. Rows with an empty or non-numeric intensity are skipped.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise CarbonFeedError(f"{path}: {exc}") from exc
    lines = raw.decode("utf-8-sig").replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if not lines or not lines[0].strip():
        raise CarbonFeedError(f"{path}: empty file")
    header = lines[0].split(",")
    col = _column(header, column, path)
    stamps: list[str] = []
    values: list[float] = []
    for line in lines[1:]:
        if not line:
            continue
        cells = line.split(",")
        if len(cells) <= col:
            continue
        try:
            value = float(cells[col])
        except ValueError:
            continue
        if not np.isfinite(value):
            continue
        stamps.append(cells[0].strip().replace(" ", "T").rstrip("Z"))
        values.append(value)
    if not values:
        raise CarbonFeedError(f"{path}: no intensity values")
    try:
        timestamps = np.array(stamps, dtype="datetime64[s]")
    except ValueError as exc:
        raise CarbonFeedError(f"{path}: unreadable timestamp: {exc}") from exc
    order = np.argsort(timestamps, kind="stable")
    return timestamps[order], np.array(values, dtype=np.float64)[order]


@dataclass
class CarbonFeed:
    """Replays a carbon series: the sample in force at a Unix time, wrapping around the series."""

    timestamps: np.ndarray  # datetime64[s]
    g_per_kwh: np.ndarray  # float64
    offset_s: float = 0.0  # added to the query time before wrapping (pick where the replay starts)
    zone: str = ""

    @classmethod
    def from_file(cls, path: str | Path, *, column: str = "direct", offset_s: float = 0.0) -> CarbonFeed:
        ts, values = load_carbon_series(path, column=column)
        return cls(ts, values, offset_s, Path(path).stem)

    @property
    def _seconds(self) -> np.ndarray:
        return self.timestamps.astype(np.int64)

    def intensity_at(self, unix_s: float | np.ndarray) -> np.ndarray | float:
        """gCO2/kWh in force at ``unix_s`` (scalar or array), replaying the series cyclically."""
        secs = self._seconds
        span = max(int(secs[-1] - secs[0]), 1)
        # The cycle length is the covered span plus one sampling step so the last sample lasts too.
        step = int(np.median(np.diff(secs))) if len(secs) > 1 else 1
        cycle = span + step
        t = np.asarray(unix_s, dtype=float) + self.offset_s
        rel = np.mod(t - secs[0], cycle) + secs[0]
        idx = np.clip(np.searchsorted(secs, rel, side="right") - 1, 0, len(secs) - 1)
        out = self.g_per_kwh[idx]
        return float(out) if np.ndim(out) == 0 else out
