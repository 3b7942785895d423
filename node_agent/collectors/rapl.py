"""RAPL energy counters from the Linux powercap tree (``/sys/class/powercap``).

Each package domain ``<vendor>-rapl:<n>`` (``intel-rapl:0``; AMD exposes the same driver) has a
cumulative ``energy_uj`` counter that wraps at ``max_energy_range_uj``. Sub-zones
(``intel-rapl:0:0`` core, ``:1`` uncore, ``:2`` DRAM on some parts) are already inside their package
and a ``psys`` zone covers the whole platform including the packages, so only non-psys top-level
packages are summed — counting more would count the same joules twice.

Hazards
-------
* ``energy_uj`` is root-only since Linux 5.10 (CVE-2020-8694, "Platypus"); an unreadable zone is
  skipped and counted in ``unreadable_zones``, and with no readable zone the reader reports
  ``None`` so the agent falls back to the power model.
* A counter that goes backwards wrapped once (``cur + max_range - last``); RAPL wraps in tens of
  minutes at full load, far longer than the agent's interval, so one wrap per interval is assumed.
  A zone without ``max_energy_range_uj`` that goes backwards is taken as a reset (delta = ``cur``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

_PACKAGE = re.compile(r"^[a-z]+-rapl:\d+$")


@dataclass
class RaplSample:
    energy_joules: float  # cumulative since the reader started (wrap-corrected)
    power_watts: float | None  # mean over the last interval; None on the first read
    zones: int  # zones read this time


@dataclass
class _Zone:
    path: Path
    max_range_uj: int  # 0 when unknown
    last_uj: int | None = None


@dataclass
class RaplReader:
    root: Path = Path("/sys/class/powercap")
    zones: list[_Zone] = field(default_factory=list)
    energy_joules: float = 0.0
    unreadable_zones: int = 0
    wraps: int = 0
    _last_s: float | None = None

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        self.zones = self._discover()

    def _discover(self) -> list[_Zone]:
        if not self.root.is_dir():
            return []
        zones = []
        for path in sorted(self.root.iterdir()):
            if not _PACKAGE.match(path.name) or not (path / "energy_uj").exists():
                continue
            try:
                if (path / "name").read_text().strip() == "psys":
                    continue
            except OSError:
                pass
            try:
                max_range = int((path / "max_energy_range_uj").read_text().strip())
            except (OSError, ValueError):
                max_range = 0
            zones.append(_Zone(path, max_range))
        return zones

    @property
    def available(self) -> bool:
        return bool(self.zones)

    def read(self, now_s: float) -> RaplSample | None:
        """Energy since the last read over all readable package zones; None if none is readable."""
        delta_uj, read = 0, 0
        for zone in self.zones:
            try:
                current = int((zone.path / "energy_uj").read_text().strip())
            except (OSError, ValueError):
                self.unreadable_zones += 1
                continue
            read += 1
            if zone.last_uj is not None:
                if current >= zone.last_uj:
                    delta_uj += current - zone.last_uj
                elif zone.max_range_uj > 0:
                    delta_uj += current + zone.max_range_uj - zone.last_uj
                    self.wraps += 1
                else:
                    delta_uj += current
            zone.last_uj = current
        if read == 0:
            return None
        joules = delta_uj / 1e6
        self.energy_joules += joules
        power = None
        if self._last_s is not None and now_s > self._last_s:
            power = joules / (now_s - self._last_s)
        self._last_s = now_s
        return RaplSample(self.energy_joules, power, read)
