"""Loaders for the shared grid traces: hourly carbon intensity and day-ahead electricity prices.

Every loader returns an :class:`HourlySeries`: one value per UTC hour on a gap-free grid, as a
``datetime64[h]`` start array and a ``float64`` value array, so the simulator and the energy
accounting index it by hour with integer arithmetic.

Formats (see ``../shared/traces/README.md``):

* **Electricity Maps** (``carbon/electricitymaps/<ZONE>_<YEAR>_hourly.csv``): CRLF line endings and a
  non-ASCII ``₂`` in the header, so columns are matched by position and prefix, never by their full
  name. The ``direct`` (operational) intensity is the default; ``lca`` selects the life-cycle column.
* **Let's Wait Awhile** (``carbon/lets-wait-awhile/{ger,gb,fr}_ci.csv``): 15- or 30-minute samples,
  resampled to the hourly mean of the samples whose timestamp falls in that hour. The source does not
  state a time zone; the samples are taken as UTC.
* **ENTSO-E day-ahead prices** (``prices/entsoe_dayahead_hourly_*.csv``): ``dd.mm.yyyy`` dates and
  ``HH:MM - HH:MM`` hours in CET (UTC+1; the file covers December, so no summer time), converted to
  UTC here. Rows without a price (countries that publish none) are skipped; an area listed under two
  countries (``BZN DE-LU``) keeps its first value per hour.

Hours missing inside a series are filled by carrying the last value forward (and the first value
backward), and the number of filled hours is kept in :attr:`HourlySeries.filled_hours`.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np

HOUR = np.timedelta64(1, "h")

# Let's Wait Awhile file stems → the zone names used across Meridian.
LWA_ZONES = {"ger": "DE", "gb": "GB", "fr": "FR"}


class GridDataError(ValueError):
    """A grid trace that cannot be read; the message names the file and the row."""


@dataclass(frozen=True)
class HourlySeries:
    """A value per UTC hour: ``hours[i]`` is the start of the hour that ``values[i]`` covers."""

    zone: str
    unit: str
    hours: np.ndarray  # datetime64[h], strictly increasing by one hour
    values: np.ndarray  # float64
    source: str = ""
    filled_hours: int = 0
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.hours.shape != self.values.shape or self.hours.ndim != 1:
            raise GridDataError(f"{self.zone}: hours and values differ in shape")
        if len(self.hours) > 1 and not (np.diff(self.hours) == HOUR).all():
            raise GridDataError(f"{self.zone}: hours are not a gap-free hourly grid")

    def __len__(self) -> int:
        return len(self.values)

    @property
    def start(self) -> datetime:
        return to_datetime(self.hours[0])

    @property
    def end(self) -> datetime:
        """The end of the last hour covered (exclusive)."""
        return to_datetime(self.hours[-1] + HOUR)

    def index_of(self, when: datetime | np.datetime64) -> int:
        """Index of the hour containing ``when``; raises ``KeyError`` outside the series."""
        hour = to_hour(when)
        i = int((hour - self.hours[0]) // HOUR)
        if i < 0 or i >= len(self.values):
            raise KeyError(f"{self.zone}: {hour} is outside {self.hours[0]}..{self.hours[-1]}")
        return i

    def at(self, when: datetime | np.datetime64) -> float:
        return float(self.values[self.index_of(when)])

    def window(self, start: datetime | np.datetime64, hours: int) -> HourlySeries:
        """``hours`` consecutive hours from ``start``; raises ``KeyError`` if they are not all covered."""
        i = self.index_of(start)
        if i + hours > len(self.values):
            raise KeyError(f"{self.zone}: {hours} h from {to_hour(start)} runs past {self.hours[-1]}")
        return HourlySeries(self.zone, self.unit, self.hours[i:i + hours].copy(), self.values[i:i + hours].copy(),
                            self.source, 0, dict(self.meta))

    def values_for(self, hours: np.ndarray) -> np.ndarray:
        """Values at arbitrary ``datetime64[h]`` hours; hours outside the series raise ``KeyError``."""
        idx = ((hours.astype("datetime64[h]") - self.hours[0]) // HOUR).astype(np.int64)
        if len(idx) and (idx.min() < 0 or idx.max() >= len(self.values)):
            raise KeyError(f"{self.zone}: requested hours outside {self.hours[0]}..{self.hours[-1]}")
        return self.values[idx]


def to_hour(when: datetime | np.datetime64) -> np.datetime64:
    if isinstance(when, datetime):
        if when.tzinfo is not None:
            when = when.astimezone(UTC).replace(tzinfo=None)
        return np.datetime64(when, "h")
    return np.datetime64(when, "h")


def to_datetime(hour: np.datetime64) -> datetime:
    seconds = int(hour.astype("datetime64[s]").astype(np.int64))
    return datetime.fromtimestamp(seconds, tz=UTC)


def _regularise(zone: str, unit: str, points: dict[np.datetime64, float], source: str,
                meta: dict[str, str] | None = None) -> HourlySeries:
    if not points:
        raise GridDataError(f"{source}: no values for {zone}")
    keys = sorted(points)
    first, last = keys[0], keys[-1]
    n = int((last - first) // HOUR) + 1
    hours = first + np.arange(n) * HOUR
    values = np.full(n, np.nan)
    idx = ((np.array(keys) - first) // HOUR).astype(np.int64)
    values[idx] = [points[k] for k in keys]
    missing = np.isnan(values)
    filled = int(missing.sum())
    if filled:
        # Carry the last known value forward (the first value is known by construction).
        last_known = np.where(~missing, np.arange(n), 0)
        np.maximum.accumulate(last_known, out=last_known)
        values = values[last_known]
    return HourlySeries(zone, unit, hours.astype("datetime64[h]"), values, source, filled, meta or {})


def _read_rows(path: Path) -> tuple[list[str], Iterable[list[str]]]:
    # newline="" lets csv handle CRLF; utf-8-sig drops a BOM if a re-export adds one.
    text = path.read_text(encoding="utf-8-sig")
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader)
    except StopIteration:
        raise GridDataError(f"{path}: empty file") from None
    return header, reader


def _parse_time(text: str, path: Path, line: int) -> np.datetime64:
    try:
        return np.datetime64(datetime.fromisoformat(text.strip().replace("Z", "")).replace(tzinfo=None), "m")
    except ValueError:
        raise GridDataError(f"{path}:{line}: bad timestamp {text!r}") from None


def _parse_float(text: str, path: Path, line: int, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise GridDataError(f"{path}:{line}: bad {what} {text!r}") from None
    if not np.isfinite(value):
        raise GridDataError(f"{path}:{line}: {what} is not finite")
    return value


def load_electricitymaps(path: str | Path, *, column: str = "direct") -> HourlySeries:
    """One Electricity Maps hourly file; ``column`` is ``direct`` (default) or ``lca``."""
    path = Path(path)
    header, rows = _read_rows(path)
    if column not in ("direct", "lca"):
        raise ValueError(f"column must be 'direct' or 'lca', got {column!r}")
    wanted = "(direct)" if column == "direct" else "(lca)"
    ci_cols = [i for i, name in enumerate(header) if name.startswith("Carbon Intensity") and
               name.lower().endswith(wanted)]
    if not header or not header[0].startswith("Datetime") or not ci_cols:
        raise GridDataError(f"{path}: not an Electricity Maps hourly file (header {header[:5]!r})")
    ci = ci_cols[0]
    zone_col = next((i for i, name in enumerate(header) if name.startswith("Zone Id")), None)
    points: dict[np.datetime64, float] = {}
    zone = ""
    for line, row in enumerate(rows, start=2):
        if not row or not row[0].strip():
            continue
        if zone_col is not None and not zone:
            zone = row[zone_col].strip()
        hour = _parse_time(row[0], path, line).astype("datetime64[h]")
        points.setdefault(hour, _parse_float(row[ci], path, line, "carbon intensity"))
    zone = zone or path.name.split("_")[0]
    return _regularise(zone, "gCO2eq/kWh", points, str(path), {"column": column})


def load_lets_wait_awhile(path: str | Path, *, zone: str | None = None) -> HourlySeries:
    """One Let's Wait Awhile file (``Time,Carbon Intensity``), resampled to hourly means."""
    path = Path(path)
    header, rows = _read_rows(path)
    if len(header) < 2 or not header[0].strip().lower().startswith("time") or \
            not header[1].strip().lower().startswith("carbon intensity"):
        raise GridDataError(f"{path}: not a Let's Wait Awhile file (header {header!r})")
    sums: dict[np.datetime64, float] = defaultdict(float)
    counts: dict[np.datetime64, int] = defaultdict(int)
    for line, row in enumerate(rows, start=2):
        if not row or not row[0].strip():
            continue
        hour = _parse_time(row[0], path, line).astype("datetime64[h]")
        sums[hour] += _parse_float(row[1], path, line, "carbon intensity")
        counts[hour] += 1
    points = {h: sums[h] / counts[h] for h in sums}
    stem = path.name.split("_")[0]
    return _regularise(zone or LWA_ZONES.get(stem, stem.upper()), "gCO2/kWh", points, str(path),
                       {"resampled_from": "sub-hourly samples, hourly mean"})


def load_carbon_file(path: str | Path, *, column: str = "direct") -> HourlySeries:
    """Either format, told apart by the header."""
    path = Path(path)
    with path.open(encoding="utf-8-sig", newline="") as fh:
        first = fh.readline()
    if first.startswith("Datetime"):
        return load_electricitymaps(path, column=column)
    return load_lets_wait_awhile(path)


def concat(series: list[HourlySeries]) -> HourlySeries:
    """Join series of one zone (e.g. several years) into one; overlapping hours keep the first value."""
    if not series:
        raise GridDataError("nothing to concatenate")
    points: dict[np.datetime64, float] = {}
    for s in sorted(series, key=lambda s: s.hours[0]):
        for h, v in zip(s.hours, s.values, strict=True):
            points.setdefault(h, float(v))
    first = series[0]
    return _regularise(first.zone, first.unit, points, ";".join(s.source for s in series), dict(first.meta))


def load_carbon_dir(directory: str | Path, *, column: str = "direct") -> dict[str, HourlySeries]:
    """Every carbon file under ``directory`` (recursively), one series per zone (years joined).

    Works on the shared ``carbon/`` tree or any folder of files in the same two formats, which is how a
    different carbon series is swapped into the simulator.
    """
    directory = Path(directory)
    by_zone: dict[str, list[HourlySeries]] = defaultdict(list)
    for path in sorted(directory.rglob("*.csv")):
        s = load_carbon_file(path, column=column)
        by_zone[s.zone].append(s)
    if not by_zone:
        raise GridDataError(f"{directory}: no carbon CSV files")
    return {zone: (parts[0] if len(parts) == 1 else concat(parts)) for zone, parts in sorted(by_zone.items())}


CET = timedelta(hours=1)


def load_entsoe_prices(path: str | Path) -> dict[str, HourlySeries]:
    """ENTSO-E day-ahead prices, one EUR/MWh series per bidding area (``"NO1"``, ``"DE-LU"``, ``"FR"``)."""
    path = Path(path)
    header, rows = _read_rows(path)
    names = [h.strip().lower() for h in header]
    try:
        c_date, c_area, c_mtu = names.index("date"), names.index("area"), names.index("mtu")
        c_price = next(i for i, n in enumerate(names) if n.startswith("price"))
    except (ValueError, StopIteration):
        raise GridDataError(f"{path}: not an ENTSO-E price file (header {header!r})") from None
    by_area: dict[str, dict[np.datetime64, float]] = defaultdict(dict)
    for line, row in enumerate(rows, start=2):
        if len(row) <= c_price or not row[c_price].strip():
            continue
        try:
            day = datetime.strptime(row[c_date].strip(), "%d.%m.%Y")
            start_hm = row[c_mtu].split("-")[0].strip()
            hh, mm = (int(x) for x in start_hm.split(":"))
        except ValueError:
            raise GridDataError(f"{path}:{line}: bad date/hour {row[c_date]!r} {row[c_mtu]!r}") from None
        utc = day + timedelta(hours=hh, minutes=mm) - CET
        area = row[c_area].strip().removeprefix("BZN ").strip()
        by_area[area].setdefault(np.datetime64(utc, "h"),
                                 _parse_float(row[c_price], path, line, "price"))
    if not by_area:
        raise GridDataError(f"{path}: no prices")
    return {area: _regularise(area, "EUR/MWh", points, str(path), {"timezone_in_file": "CET"})
            for area, points in sorted(by_area.items())}
