"""Node power: RAPL where the hardware exposes it, otherwise the documented utilisation model.

The model is :mod:`meridian.power_model` (Fan et al.'s curve with per-size-class idle/max watts).
Energy is integrated here for the model (trapezoid between reads) so the report's cumulative
``energy_joules`` is meaningful whatever the source; with RAPL it is the wrap-corrected counter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from meridian.power_model import host_power_watts, host_profile
from node_agent.collectors.rapl import RaplReader
from protos import telemetry_pb2 as pb


@dataclass
class PowerReading:
    power_watts: float
    energy_joules: float
    source: int  # pb.PowerSource


@dataclass
class PowerCollector:
    vcpus: float
    powercap_root: Path | None = Path("/sys/class/powercap")
    idle_watts: float | None = None  # override the profile
    max_watts: float | None = None
    rapl: RaplReader | None = field(init=False, default=None)
    energy_joules: float = field(init=False, default=0.0)
    _last: tuple[float, float] | None = field(init=False, default=None)  # (now_s, watts) of the model

    def __post_init__(self) -> None:
        if self.powercap_root is not None:
            reader = RaplReader(Path(self.powercap_root))
            self.rapl = reader if reader.available else None
        profile = host_profile(self.vcpus)
        self.idle_watts = profile.idle_watts if self.idle_watts is None else self.idle_watts
        self.max_watts = profile.max_watts if self.max_watts is None else self.max_watts

    def model_watts(self, cpu_utilisation: float) -> float:
        return float(host_power_watts(cpu_utilisation, self.idle_watts, self.max_watts))

    def read(self, now_s: float, cpu_utilisation: float | None) -> PowerReading:
        if self.rapl is not None:
            sample = self.rapl.read(now_s)
            if sample is not None and sample.power_watts is not None:
                return PowerReading(sample.power_watts, sample.energy_joules, pb.POWER_SOURCE_RAPL)
            if sample is not None:  # first read: no interval yet, report the model's figure once
                return PowerReading(self.model_watts(cpu_utilisation or 0.0), sample.energy_joules,
                                    pb.POWER_SOURCE_RAPL)
        watts = self.model_watts(cpu_utilisation or 0.0)
        if self._last is not None and now_s > self._last[0]:
            self.energy_joules += (watts + self._last[1]) / 2 * (now_s - self._last[0])
        self._last = (now_s, watts)
        return PowerReading(watts, self.energy_joules, pb.POWER_SOURCE_MODEL)
