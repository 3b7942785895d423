"""A simulated fleet: many nodes' telemetry from one process, for ``meridian agent --simulate``,
the embedded demo and ``meridian bench telemetry``.

Node shapes come from the Alibaba GPU trace's node list (``openb_node_list_*.csv``: CPU milli,
memory MiB, GPU count and model), sampled with replacement, or from a small synthetic mix when no
list is given. Utilisation follows a bounded random walk per node, power follows the documented
model of :mod:`meridian.power_model`, energy is integrated per node, and grid intensity comes from a
:class:`~meridian.carbon_feed.CarbonFeed` replaying a real series (or a constant).

Everything per node is a numpy array, advanced in one vectorised step. Encoding is necessarily one
protobuf per report, made cheap by protobuf's merge semantics: the serialisation of a message is the
concatenation of its fields, so each node's static part (cluster, region, name, capacity,
allocatable, GPU model, and on every ``labels_every``-th report its labels) is serialised once and
only the changing fields are serialised per report and appended.

Simulated nodes carry no ``kubernetes.io/hostname`` label: it would make every node its own
constraint group and defeat the grouping of :class:`~meridian.cluster_state.ClusterState`.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np

from meridian.carbon_feed import CarbonFeed
from meridian.cluster_state import MAX_GPUS
from meridian.model import GIB, MILLI_GPU_PER_DEVICE
from meridian.power_model import NodePowerModel
from meridian.traces.openb import load_node_shapes
from protos import telemetry_pb2 as pb

# (milli CPU, memory bytes, GPUs, GPU model, weight) of the synthetic mix.
SYNTHETIC_SHAPES = (
    (32_000, 128 * GIB, 0, "", 0.6),
    (64_000, 256 * GIB, 0, "", 0.25),
    (96_000, 512 * GIB, 8, "V100M32", 0.15),
)
#: Kubelet's default reservations, roughly: 5 % of CPU and 2 GiB of memory are not allocatable.
SYSTEM_RESERVED_CPU_FRACTION = 0.05
SYSTEM_RESERVED_MEMORY_BYTES = 2 * GIB


class SimulatedFleet:
    def __init__(self, *, cluster: str, region: str, n_nodes: int, seed: int = 0,
                 node_list: str | Path | None = None, carbon: CarbonFeed | None = None,
                 carbon_g_per_kwh: float | None = 300.0, pue: float = 1.2, labels_every: int = 30,
                 first_index: int = 0, start_sequence: int | None = None) -> None:
        if n_nodes <= 0:
            raise ValueError("a fleet needs at least one node")
        self.cluster, self.region, self.n_nodes = cluster, region, n_nodes
        self.carbon, self.carbon_g_per_kwh, self.pue, self.labels_every = carbon, carbon_g_per_kwh, pue, labels_every
        self.boot_id = uuid.uuid4().hex[:12]
        rng = self._rng = np.random.default_rng(seed)
        if node_list is not None:
            shapes = load_node_shapes(node_list)
            cpu, mem, gpus, models = shapes.milli_cpu, shapes.memory_bytes, shapes.gpus, list(shapes.gpu_model)
            pick = rng.integers(0, len(cpu), n_nodes)
        else:
            cpu = np.array([s[0] for s in SYNTHETIC_SHAPES], dtype=np.int64)
            mem = np.array([s[1] for s in SYNTHETIC_SHAPES], dtype=np.int64)
            gpus = np.array([s[2] for s in SYNTHETIC_SHAPES], dtype=np.int64)
            models = [s[3] for s in SYNTHETIC_SHAPES]
            weights = np.array([s[4] for s in SYNTHETIC_SHAPES])
            pick = rng.choice(len(cpu), n_nodes, p=weights / weights.sum())
        self.names = [f"{cluster}-node-{i:06d}" for i in range(first_index, first_index + n_nodes)]
        self.capacity_milli_cpu = cpu[pick]
        self.capacity_memory_bytes = mem[pick]
        self.gpu_count = np.minimum(gpus[pick], MAX_GPUS)
        self.gpu_model = [models[p] if gpus[p] else "" for p in pick.tolist()]
        self.alloc_milli_cpu = (self.capacity_milli_cpu * (1 - SYSTEM_RESERVED_CPU_FRACTION)).astype(np.int64)
        self.alloc_memory_bytes = np.maximum(self.capacity_memory_bytes - SYSTEM_RESERVED_MEMORY_BYTES,
                                             self.capacity_memory_bytes // 2)
        self.request_fraction = rng.uniform(0.2, 0.9, n_nodes)
        self.cpu_utilisation = rng.uniform(0.1, 0.8, n_nodes)
        self.gpu_exists = np.arange(MAX_GPUS)[None, :] < self.gpu_count[:, None]
        self.gpu_utilisation = np.where(self.gpu_exists, rng.uniform(0.0, 1.0, (n_nodes, MAX_GPUS)), 0.0)
        self.gpu_free_milli = np.where(self.gpu_exists, rng.choice([0, 250, 500, 1000], (n_nodes, MAX_GPUS)), 0)
        self.node_power = NodePowerModel.for_nodes(
            np.column_stack([self.capacity_milli_cpu, self.capacity_memory_bytes, self.gpu_count]), self.gpu_model,
            gpu_exists=self.gpu_exists)
        # Sequences start at unix_ms × 1000 so they keep increasing across restarts (one report per
        # node per millisecond at most), as real agents do.
        first_seq = int(time.time() * 1000) * 1000 if start_sequence is None else start_sequence
        self.sequence = np.full(n_nodes, first_seq, dtype=np.int64)
        self.first_sequence = first_seq
        self.energy_joules = np.zeros(n_nodes)
        self.power_watts = self._power()
        self.last_advance_s: float | None = None
        self._static_short, self._static_full = self._static_parts()
        self._gpu_parts = self._gpu_bytes()

    # ------------------------------------------------------------------ dynamics (vectorised)
    def _power(self) -> np.ndarray:
        return self.node_power.watts_at(self.cpu_utilisation, self.gpu_utilisation)

    def advance(self, now_s: float) -> None:
        """Move utilisation one random-walk step and integrate energy up to ``now_s``."""
        if self.last_advance_s is not None:
            dt = max(now_s - self.last_advance_s, 0.0)
            self.energy_joules += self.power_watts * dt
        self.last_advance_s = now_s
        rng = self._rng
        self.cpu_utilisation = np.clip(self.cpu_utilisation + rng.normal(0, 0.02, self.n_nodes), 0.02, 0.98)
        self.power_watts = self._power()

    def intensity_now(self, now_s: float) -> float:
        if self.carbon is not None:
            return float(self.carbon.intensity_at(now_s))
        return 0.0 if self.carbon_g_per_kwh is None else self.carbon_g_per_kwh  # None: CARBON_SOURCE_NONE

    # ------------------------------------------------------------------ encoding
    def _static_parts(self) -> tuple[list[bytes], list[bytes]]:
        short, full = [], []
        zones = ("a", "b", "c")
        for i, name in enumerate(self.names):  # once, at construction
            m = pb.NodeTelemetry(
                cluster=self.cluster, region=self.region, node=name, boot_id=self.boot_id,
                capacity_milli_cpu=int(self.capacity_milli_cpu[i]),
                capacity_memory_bytes=int(self.capacity_memory_bytes[i]), capacity_gpu=int(self.gpu_count[i]),
                allocatable_milli_cpu=int(self.alloc_milli_cpu[i]),
                allocatable_memory_bytes=int(self.alloc_memory_bytes[i]), allocatable_gpu=int(self.gpu_count[i]),
                gpu_model=self.gpu_model[i], power_source=pb.POWER_SOURCE_MODEL,
                carbon_source=pb.CARBON_SOURCE_SIMULATED if self.carbon else (
                    pb.CARBON_SOURCE_STATIC if self.carbon_g_per_kwh is not None else pb.CARBON_SOURCE_NONE),
            )
            short.append(m.SerializeToString())
            m.labels_included = True
            m.labels.update({"topology.kubernetes.io/region": self.region,
                             "topology.kubernetes.io/zone": f"{self.region}-{zones[i % 3]}",
                             "meridian.io/cluster": self.cluster})
            if self.gpu_model[i]:
                m.labels["meridian.io/gpu-model"] = self.gpu_model[i]
            full.append(m.SerializeToString())
        return short, full

    def _gpu_bytes(self, rows: np.ndarray | None = None) -> list[bytes]:
        out = []
        m = pb.NodeTelemetry()
        idx = range(self.n_nodes) if rows is None else rows.tolist()
        for i in idx:
            n_dev = int(self.gpu_count[i])
            m.ClearField("gpu_free_milli")
            m.ClearField("gpu_utilisation")
            m.gpu_free_milli.extend(self.gpu_free_milli[i, :n_dev].tolist())
            m.gpu_utilisation.extend(self.gpu_utilisation[i, :n_dev].tolist())
            out.append(m.SerializeToString())
        return out

    def reports(self, now_s: float, rows: np.ndarray | slice | None = None) -> list[bytes]:
        """One serialised ``NodeTelemetry`` per node in ``rows`` (all by default), sequence advanced."""
        sel = np.arange(self.n_nodes)[rows] if rows is not None else np.arange(self.n_nodes)
        self.sequence[sel] += 1
        seq = self.sequence[sel].tolist()
        used_cpu = (self.cpu_utilisation[sel] * self.alloc_milli_cpu[sel]).astype(np.int64).tolist()
        used_mem = (self.request_fraction[sel] * 0.8 * self.alloc_memory_bytes[sel]).astype(np.int64).tolist()
        req_cpu = (self.request_fraction[sel] * self.alloc_milli_cpu[sel]).astype(np.int64).tolist()
        req_mem = (self.request_fraction[sel] * self.alloc_memory_bytes[sel]).astype(np.int64).tolist()
        power = self.power_watts[sel].tolist()
        energy = self.energy_joules[sel].tolist()
        carbon = self.intensity_now(now_s)
        now_ms = int(now_s * 1000)
        short, full, gpu, every = self._static_short, self._static_full, self._gpu_parts, self.labels_every
        first = self.first_sequence
        m = pb.NodeTelemetry(observed_unix_ms=now_ms, sent_unix_ms=now_ms, carbon_g_per_kwh=carbon, pue=self.pue)
        out = []
        append = out.append
        for k, i in enumerate(sel.tolist()):
            m.sequence = seq[k]
            m.used_milli_cpu = used_cpu[k]
            m.used_memory_bytes = used_mem[k]
            m.requested_milli_cpu = req_cpu[k]
            m.requested_memory_bytes = req_mem[k]
            m.power_watts = power[k]
            m.energy_joules = energy[k]
            static = full[i] if (seq[k] - first) % every == 1 else short[i]
            append(static + gpu[i] + m.SerializeToString())
        return out

    def set_gpu_free(self, free_milli: np.ndarray) -> None:
        """Replace the GPU free-share matrix (the simulator binds GPU pods) and re-encode GPU parts."""
        self.gpu_free_milli = np.where(self.gpu_exists, np.clip(free_milli, 0, MILLI_GPU_PER_DEVICE), 0)
        self._gpu_parts = self._gpu_bytes()
