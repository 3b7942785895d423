"""Utilisation → power model for nodes without RAPL counters (and for simulated fleets).

Model (Fan, Weber and Barroso, "Power Provisioning for a Warehouse-sized Computer", ISCA '07, the
empirical curve that fits their fleet within about 1 %)::

    P_host(u) = P_idle + (P_max − P_idle) · (2u − u^r),      u ∈ [0, 1] CPU utilisation, r = 1.4
    P_gpu(g)  = Σ_devices  G_idle + (G_max − G_idle) · g_d,   g_d ∈ [0, 1] per-device utilisation
    P(u, g)   = P_host(u) + P_gpu(g)

Coefficients per node type (:data:`HOST_PROFILES`, watts for the whole host without GPUs): chosen
from SPECpower_ssj2008 results of common two-socket servers of the size class (idle about 30 % of
the maximum), documented here so a report can be traced back to them:

=========  ============  ======  ======
profile    vCPUs          idle W  max W
=========  ============  ======  ======
small      ≤ 16             60     180
standard   17 – 64         120     400
large      > 64            200     700
=========  ============  ======  ======

GPU boards (:data:`GPU_PROFILES`): idle and board power limit (TDP) from the vendors' data sheets:
T4 10/70 W, P100 30/250 W, V100 (16 and 32 GB) 40/300 W, A10 30/150 W, A100 50/400 W; the trace's
undisclosed models (G1, G2, G3) and unknown ones use 40/300 W, a V100-class board.

:class:`NodePowerModel` is the model for a fixed set of nodes, coefficients looked up once: the one
node power model of the simulated fleet (:mod:`meridian.fleet`), the federation simulator and the
regional scheduler's simulated clusters.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Exponent of Fan et al.'s curve.
FAN_EXPONENT = 1.4


@dataclass(frozen=True)
class HostProfile:
    name: str
    max_vcpus: float  # the profile applies up to this many vCPUs
    idle_watts: float
    max_watts: float


HOST_PROFILES: tuple[HostProfile, ...] = (
    HostProfile("small", 16, 60.0, 180.0),
    HostProfile("standard", 64, 120.0, 400.0),
    HostProfile("large", float("inf"), 200.0, 700.0),
)
#: (idle watts, max watts) per GPU board.
GPU_PROFILES: dict[str, tuple[float, float]] = {
    "T4": (10.0, 70.0),
    "P100": (30.0, 250.0),
    "V100M16": (40.0, 300.0),
    "V100M32": (40.0, 300.0),
    "V100": (40.0, 300.0),
    "A10": (30.0, 150.0),
    "A100": (50.0, 400.0),
}
DEFAULT_GPU_PROFILE = (40.0, 300.0)


def host_profile(vcpus: float) -> HostProfile:
    """The profile for a host of ``vcpus`` virtual CPUs."""
    for profile in HOST_PROFILES:
        if vcpus <= profile.max_vcpus:
            return profile
    return HOST_PROFILES[-1]


def host_coefficients(vcpus: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Idle and max watts per node for an array of vCPU counts (vectorised profile lookup)."""
    bounds = np.array([p.max_vcpus for p in HOST_PROFILES])
    which = np.minimum(np.searchsorted(bounds, np.asarray(vcpus, dtype=float), side="left"), len(HOST_PROFILES) - 1)
    idle = np.array([p.idle_watts for p in HOST_PROFILES])[which]
    peak = np.array([p.max_watts for p in HOST_PROFILES])[which]
    return idle, peak


def gpu_coefficients(models: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Idle and max watts per device for a list of GPU model names ('' → no GPU → 0 W)."""
    idle = np.array([GPU_PROFILES.get(m, DEFAULT_GPU_PROFILE)[0] if m else 0.0 for m in models])
    peak = np.array([GPU_PROFILES.get(m, DEFAULT_GPU_PROFILE)[1] if m else 0.0 for m in models])
    return idle, peak


def host_power_watts(cpu_utilisation: np.ndarray | float, idle_watts: np.ndarray | float,
                     max_watts: np.ndarray | float, *, exponent: float = FAN_EXPONENT) -> np.ndarray:
    """Fan et al.'s curve; utilisation is clipped to [0, 1]."""
    u = np.clip(np.asarray(cpu_utilisation, dtype=float), 0.0, 1.0)
    return np.asarray(idle_watts) + (np.asarray(max_watts) - np.asarray(idle_watts)) * (2 * u - u**exponent)


def gpu_power_watts(gpu_utilisation: np.ndarray, device_exists: np.ndarray, idle_watts: np.ndarray,
                    max_watts: np.ndarray) -> np.ndarray:
    """Linear board power summed per node: ``(n, devices)`` utilisation → ``(n,)`` watts."""
    g = np.clip(np.asarray(gpu_utilisation, dtype=float), 0.0, 1.0)
    per_device = idle_watts[:, None] + (max_watts - idle_watts)[:, None] * g
    return np.where(device_exists, per_device, 0.0).sum(axis=1)


@dataclass(frozen=True)
class NodePowerModel:
    """The model's coefficients for a fixed set of nodes, looked up once.

    ``watts_at(cpu, gpu)`` is host power on Fan et al.'s curve plus board power of each existing device,
    vectorised over nodes. ``watts(used)`` reads requested resources as load: requested CPU over allocatable
    as host utilisation, the node's ``used`` GPUs busy (utilisation 1) and the rest idle (0); nodes with
    nothing on them draw 0 W when ``power_off_empty``.
    """

    alloc: np.ndarray  # (n, 3) milli-CPU, memory bytes, GPUs
    host_idle_watts: np.ndarray  # (n,)
    host_max_watts: np.ndarray  # (n,)
    gpu_idle_watts: np.ndarray  # (n,) per device
    gpu_max_watts: np.ndarray  # (n,) per device
    gpu_exists: np.ndarray  # (n, slots) bool

    @classmethod
    def for_nodes(cls, alloc: np.ndarray, gpu_models: Sequence[str], *,
                  gpu_exists: np.ndarray | None = None) -> NodePowerModel:
        """``alloc`` (n, 3): milli-CPU (which picks the host profile), memory bytes, GPUs; ``gpu_models``: the
        board of each node ('' → none). ``gpu_exists`` (n, slots): which device slots hold a board; by default
        the first ``alloc[:, 2]`` of ``max(GPUs, 1)`` slots."""
        alloc = np.asarray(alloc, dtype=np.int64)
        host_idle, host_max = host_coefficients(alloc[:, 0] / 1000.0)
        gpu_idle, gpu_max = gpu_coefficients(list(gpu_models))
        if gpu_exists is None:
            slots = max(int(alloc[:, 2].max(initial=0)), 1)
            gpu_exists = np.arange(slots)[None, :] < alloc[:, 2][:, None]
        return cls(alloc, host_idle, host_max, gpu_idle, gpu_max, gpu_exists)

    def watts_at(self, cpu_utilisation: np.ndarray, gpu_utilisation: np.ndarray) -> np.ndarray:
        """(n,) watts per node at ``cpu_utilisation`` (n,) and per-device ``gpu_utilisation`` (n, slots)."""
        host = host_power_watts(cpu_utilisation, self.host_idle_watts, self.host_max_watts)
        return host + gpu_power_watts(gpu_utilisation, self.gpu_exists, self.gpu_idle_watts, self.gpu_max_watts)

    def watts(self, used: np.ndarray, *, power_off_empty: bool = True) -> np.ndarray:
        """(n,) watts per node for ``used`` (n, 3) requested milli-CPU, memory bytes, GPUs."""
        n = len(self.alloc)
        cpu_util = np.divide(used[:, 0], self.alloc[:, 0], out=np.zeros(n), where=self.alloc[:, 0] > 0)
        busy = np.arange(self.gpu_exists.shape[1])[None, :] < used[:, 2][:, None]
        node_w = self.watts_at(cpu_util, busy.astype(np.float64))
        if power_off_empty:
            node_w = np.where((used > 0).any(axis=1), node_w, 0.0)
        return node_w
