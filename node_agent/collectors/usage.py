"""CPU and memory usage from procfs (the whole node) and cgroup v2 (the pods).

Both read cumulative counters and report the rate over the interval since the previous read, so
the first read of CPU returns ``None``. Paths are roots so the agent can read the host's through
read-only mounts (``/host/proc``, ``/host/sys``) and tests can point at a fake tree.

* procfs: ``/proc/stat``'s first ``cpu`` line, busy = total − idle − iowait (jiffies), times the
  number of ``cpuN`` lines × 1000 → milli-CPU; memory = ``MemTotal − MemAvailable`` of
  ``/proc/meminfo`` (what the kernel could not hand to a new workload without reclaim).
* cgroup v2: ``<root>/<slice>/cpu.stat`` ``usage_usec`` and ``memory.current`` of the kubepods
  slice (``kubepods.slice`` with the systemd cgroup driver, ``kubepods`` with cgroupfs).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path


@dataclass
class UsageSample:
    used_milli_cpu: float | None  # None on the first read
    used_memory_bytes: float | None
    cpu_utilisation: float | None  # 0..1


class ProcUsage:
    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.root = Path(proc_root)
        self._last: tuple[int, int] | None = None  # (busy, total) jiffies

    def _cpu(self) -> tuple[int, int, int]:
        lines = (self.root / "stat").read_text().splitlines()
        fields = [int(x) for x in lines[0].split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
        total = sum(fields[:8])  # guest time is already inside user/nice
        n_cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        return total - idle, total, max(n_cpus, 1)

    def _memory(self) -> float | None:
        info = {}
        for line in (self.root / "meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts:
                info[key] = int(parts[0]) * (1024 if len(parts) > 1 and parts[1] == "kB" else 1)
        if "MemTotal" not in info or "MemAvailable" not in info:
            return None
        return float(info["MemTotal"] - info["MemAvailable"])

    def read(self) -> UsageSample:
        try:
            busy, total, n_cpus = self._cpu()
        except (OSError, ValueError, IndexError):
            busy = total = n_cpus = 0
        utilisation = used = None
        if total and self._last is not None and total > self._last[1]:
            utilisation = min(max((busy - self._last[0]) / (total - self._last[1]), 0.0), 1.0)
            used = utilisation * n_cpus * 1000
        if total:
            self._last = (busy, total)
        try:
            memory = self._memory()
        except (OSError, ValueError):
            memory = None
        return UsageSample(used, memory, utilisation)


class CgroupUsage:
    def __init__(self, cgroup_root: str | Path = "/sys/fs/cgroup",
                 slices: tuple[str, ...] = ("kubepods.slice", "kubepods")) -> None:
        self.root = Path(cgroup_root)
        self.slice = next((self.root / s for s in slices if (self.root / s / "cpu.stat").exists()), None)
        self._last: tuple[float, int] | None = None  # (now_s, usage_usec)

    @property
    def available(self) -> bool:
        return self.slice is not None

    def read(self, now_s: float) -> UsageSample:
        if self.slice is None:
            return UsageSample(None, None, None)
        used = memory = None
        try:
            stat = dict(line.split() for line in (self.slice / "cpu.stat").read_text().splitlines() if line.strip())
            usage_usec = int(stat["usage_usec"])
            if self._last is not None and now_s > self._last[0] and usage_usec >= self._last[1]:
                used = (usage_usec - self._last[1]) / 1e6 / (now_s - self._last[0]) * 1000
            self._last = (now_s, usage_usec)
        except (OSError, ValueError, KeyError):
            pass
        with contextlib.suppress(OSError, ValueError):
            memory = float(int((self.slice / "memory.current").read_text().strip()))
        return UsageSample(used, memory, None)
