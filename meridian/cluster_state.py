"""Cluster state as a structure of numpy arrays over nodes and GPU devices.

Every per-node quantity is one array indexed by node position, so filters, scorers and metrics
work over all nodes in one vectorised pass. GPU devices are a dense ``(n_nodes, MAX_GPUS)`` matrix
of free milli-GPU; slots past a node's device count hold 0 and are masked by ``gpu_exists``.

``allocate`` and ``release`` are exact inverses (integer arithmetic only) and refuse to take a node
past its allocatable resources. Telemetry-driven fields (measured usage, power, carbon, liveness)
live beside the scheduling fields so one state serves the simulator and a live regional scheduler.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from meridian.model import MILLI_GPU_PER_DEVICE, Node, Pod

MAX_GPUS = 8
# GPU shape classes of placed pods, counted per node (GPU-clustering affinity): share, 1, 2, 4, 8 GPUs.
N_SHAPE_CLASSES = 5


def gpu_shape_class(pod: Pod) -> int:
    """0 for a shared-GPU pod, 1..4 for 1/2/4/8 whole GPUs, -1 for a CPU-only pod."""
    r = pod.requests
    if r.gpu_milli:
        return 0
    if r.gpu:
        return min(int(r.gpu).bit_length(), N_SHAPE_CLASSES - 1)
    return -1


class AllocationError(ValueError):
    """An allocate/release that would break conservation (over-commit, double release)."""


@dataclass(frozen=True)
class Placement:
    """Where a pod went: the node index and, for GPU pods, the device slots and milli-GPU taken on each."""

    node: int
    devices: tuple[int, ...] = ()
    milli_per_device: int = 0


@dataclass
class ClusterState:
    names: list[str]
    alloc_milli_cpu: np.ndarray  # int64 (n,)
    alloc_memory_bytes: np.ndarray  # int64 (n,)
    gpu_count: np.ndarray  # int64 (n,)
    gpu_model_id: np.ndarray  # int64 (n,), index into gpu_models; -1 = no GPU
    gpu_models: list[str]
    req_milli_cpu: np.ndarray  # int64 (n,), requested by placed pods
    req_memory_bytes: np.ndarray  # int64 (n,)
    gpu_free_milli: np.ndarray  # int64 (n, MAX_GPUS)
    gpu_exists: np.ndarray  # bool (n, MAX_GPUS)
    schedulable: np.ndarray  # bool (n,): False for cordoned or stale nodes
    # Scheduling constraints, grouped: nodes with identical labels and taints share a group id so
    # label/taint filters are evaluated once per group and broadcast (few groups, many nodes).
    constraint_group: np.ndarray  # int64 (n,)
    group_labels: list[dict[str, str]]
    group_taints: list[tuple]  # tuple[Taint, ...] per group
    # Telemetry (NaN until a report arrives).
    used_milli_cpu: np.ndarray = field(default_factory=lambda: np.zeros(0))
    used_memory_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    power_watts: np.ndarray = field(default_factory=lambda: np.zeros(0))
    energy_joules: np.ndarray = field(default_factory=lambda: np.zeros(0))
    carbon_g_per_kwh: np.ndarray = field(default_factory=lambda: np.zeros(0))
    last_seen_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    last_seq: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # Bumped on every allocate/release so score caches know which nodes changed.
    node_version: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    shape_class_count: np.ndarray = field(default_factory=lambda: np.zeros((0, N_SHAPE_CLASSES), dtype=np.int64))
    # Scalar resources (``pods``, ``ephemeral-storage``, extended resources): one column per name.
    # Empty for simulated clusters, which count only CPU, memory and GPUs.
    scalar_names: list[str] = field(default_factory=list)
    alloc_scalar: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    req_scalar: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))

    def __post_init__(self) -> None:
        n = len(self.names)
        for name in ("used_milli_cpu", "used_memory_bytes", "power_watts", "energy_joules", "carbon_g_per_kwh",
                     "last_seen_s"):
            if getattr(self, name).shape != (n,):
                setattr(self, name, np.full(n, np.nan))
        if self.last_seq.shape != (n,):
            self.last_seq = np.full(n, -1, dtype=np.int64)
        if self.node_version.shape != (n,):
            self.node_version = np.zeros(n, dtype=np.int64)
        if self.shape_class_count.shape != (n, N_SHAPE_CLASSES):
            self.shape_class_count = np.zeros((n, N_SHAPE_CLASSES), dtype=np.int64)
        shape = (n, len(self.scalar_names))
        if self.alloc_scalar.shape != shape:
            self.alloc_scalar = np.zeros(shape, dtype=np.int64)
        if self.req_scalar.shape != shape:
            self.req_scalar = np.zeros(shape, dtype=np.int64)
        self.index = {name: i for i, name in enumerate(self.names)}
        self.scalar_index = {name: j for j, name in enumerate(self.scalar_names)}

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_nodes(cls, nodes: Sequence[Node]) -> ClusterState:
        n = len(nodes)
        if len({node.name for node in nodes}) != n:
            raise ValueError("node names must be unique")
        models = sorted({node.gpu_model for node in nodes if node.gpu_model})
        model_id = {m: i for i, m in enumerate(models)}
        gpu_free = np.zeros((n, MAX_GPUS), dtype=np.int64)
        gpu_exists = np.zeros((n, MAX_GPUS), dtype=bool)
        groups: dict[tuple, int] = {}
        group_of = np.zeros(n, dtype=np.int64)
        group_labels: list[dict[str, str]] = []
        group_taints: list[tuple] = []
        for i, node in enumerate(nodes):
            count = node.allocatable_resources.gpu
            if count > MAX_GPUS:
                raise ValueError(f"node {node.name} has {count} GPUs; at most {MAX_GPUS} are supported")
            gpu_exists[i, :count] = True
            gpu_free[i, :count] = [d.free_milli for d in node.gpus] if node.gpus else MILLI_GPU_PER_DEVICE
            key = (tuple(sorted(node.labels.items())), node.taints)
            if key not in groups:
                groups[key] = len(group_labels)
                group_labels.append(dict(node.labels))
                group_taints.append(node.taints)
            group_of[i] = groups[key]
        alloc = [node.allocatable_resources for node in nodes]
        scalar_names = sorted({name for node in nodes for name in node.scalar_allocatable})
        alloc_scalar = np.array([[node.scalar_allocatable.get(name, 0) for name in scalar_names] for node in nodes],
                                dtype=np.int64).reshape(n, len(scalar_names))
        return cls(
            names=[node.name for node in nodes],
            alloc_milli_cpu=np.array([a.milli_cpu for a in alloc], dtype=np.int64),
            alloc_memory_bytes=np.array([a.memory_bytes for a in alloc], dtype=np.int64),
            gpu_count=np.array([a.gpu for a in alloc], dtype=np.int64),
            gpu_model_id=np.array([model_id.get(node.gpu_model, -1) for node in nodes], dtype=np.int64),
            gpu_models=models,
            req_milli_cpu=np.zeros(n, dtype=np.int64),
            req_memory_bytes=np.zeros(n, dtype=np.int64),
            gpu_free_milli=gpu_free,
            gpu_exists=gpu_exists,
            schedulable=np.ones(n, dtype=bool),
            constraint_group=group_of,
            group_labels=group_labels,
            group_taints=group_taints,
            scalar_names=scalar_names,
            alloc_scalar=alloc_scalar,
        )

    def copy(self) -> ClusterState:
        arrays = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in self.__dict__.items()
                  if k not in ("index", "scalar_index")}
        return ClusterState(**arrays)

    # ------------------------------------------------------------------ derived views
    @property
    def n_nodes(self) -> int:
        return len(self.names)

    @property
    def free_milli_cpu(self) -> np.ndarray:
        return self.alloc_milli_cpu - self.req_milli_cpu

    @property
    def free_memory_bytes(self) -> np.ndarray:
        return self.alloc_memory_bytes - self.req_memory_bytes

    @property
    def gpu_free_total_milli(self) -> np.ndarray:
        return self.gpu_free_milli.sum(axis=1)

    @property
    def gpu_full_free(self) -> np.ndarray:
        """Number of completely idle GPU devices per node."""
        return ((self.gpu_free_milli == MILLI_GPU_PER_DEVICE) & self.gpu_exists).sum(axis=1)

    @property
    def gpu_max_free_milli(self) -> np.ndarray:
        """The largest free share on any single device of each node."""
        return self.gpu_free_milli.max(axis=1) if self.n_nodes else np.zeros(0, dtype=np.int64)

    def scalar_columns(self, pod: Pod) -> tuple[np.ndarray, np.ndarray] | None:
        """The state's columns of the pod's scalar requests and the amounts, or None when the pod asks
        for a scalar resource no node has (so no node can hold it)."""
        try:
            cols = np.array([self.scalar_index[name] for name in pod.scalar_requests], dtype=np.int64)
        except KeyError:
            return None
        return cols, np.fromiter(pod.scalar_requests.values(), dtype=np.int64, count=len(cols))

    def scalar_fit_mask(self, pod: Pod) -> np.ndarray:
        """Nodes with room for each of the pod's scalar requests."""
        if not pod.scalar_requests:
            return np.ones(self.n_nodes, dtype=bool)
        found = self.scalar_columns(pod)
        if found is None:
            return np.zeros(self.n_nodes, dtype=bool)
        cols, amount = found
        return ((self.alloc_scalar[:, cols] - self.req_scalar[:, cols]) >= amount).all(axis=1)

    # ------------------------------------------------------------------ mutation
    def choose_devices(self, node: int, pod: Pod, device_scores: np.ndarray | None = None) -> Placement:
        """Pick GPU device slots on ``node`` for ``pod``.

        Whole-GPU pods take the lowest-index idle devices. A shared-GPU pod takes the device with
        the highest ``device_scores`` among those that fit, or by default the tightest fit (least
        free milli-GPU that still fits), the FGD simulator's best-fit device rule.
        """
        r = pod.requests
        if r.gpu:
            idle = np.flatnonzero((self.gpu_free_milli[node] == MILLI_GPU_PER_DEVICE) & self.gpu_exists[node])
            if idle.size < r.gpu:
                raise AllocationError(f"node {self.names[node]} has {idle.size} idle GPUs, pod needs {r.gpu}")
            return Placement(node, tuple(int(d) for d in idle[: r.gpu]), MILLI_GPU_PER_DEVICE)
        if r.gpu_milli:
            free = self.gpu_free_milli[node]
            fits = (free >= r.gpu_milli) & self.gpu_exists[node]
            if not fits.any():
                raise AllocationError(f"node {self.names[node]} has no GPU with {r.gpu_milli} milli free")
            score = -free.astype(float) if device_scores is None else device_scores.astype(float)
            score = np.where(fits, score, -np.inf)
            return Placement(node, (int(np.argmax(score)),), r.gpu_milli)
        return Placement(node)

    def allocate(self, pod: Pod, placement: Placement, *, strict: bool = True) -> None:
        """Take the pod's requests on its node. ``strict=False`` records a pod that is already there
        whatever it costs (one bound by another scheduler, or before a node shrank): the state must
        show the node as it is, over-committed or not, and release takes exactly as much back."""
        i, r = placement.node, pod.requests
        dev = list(placement.devices)
        scalar = self.scalar_columns(pod) if pod.scalar_requests else None
        if pod.scalar_requests and scalar is None:
            known = [name for name in pod.scalar_requests if name in self.scalar_index]
            scalar = (np.array([self.scalar_index[n] for n in known], dtype=np.int64),
                      np.array([pod.scalar_requests[n] for n in known], dtype=np.int64))
            if strict:
                raise AllocationError(f"pod {pod.name} asks for a resource node {self.names[i]} does not have")
        if strict:
            self._check_fits(pod, placement, scalar)
        self.req_milli_cpu[i] += r.milli_cpu
        self.req_memory_bytes[i] += r.memory_bytes
        if dev:
            self.gpu_free_milli[i, dev] -= placement.milli_per_device
        if scalar is not None:
            self.req_scalar[i, scalar[0]] += scalar[1]
        self._count_shape(i, pod, +1)

    def _check_fits(self, pod: Pod, placement: Placement, scalar: tuple[np.ndarray, np.ndarray] | None) -> None:
        i, r = placement.node, pod.requests
        dev = list(placement.devices)
        if scalar is not None and ((self.alloc_scalar[i, scalar[0]] - self.req_scalar[i, scalar[0]]) < scalar[1]).any():
            raise AllocationError(f"pod {pod.name} does not fit {', '.join(pod.scalar_requests)} on node {self.names[i]}")
        if self.free_milli_cpu[i] < r.milli_cpu or self.free_memory_bytes[i] < r.memory_bytes:
            raise AllocationError(f"pod {pod.name} does not fit CPU/memory on node {self.names[i]}")
        if dev and (self.gpu_free_milli[i, dev] < placement.milli_per_device).any():
            raise AllocationError(f"pod {pod.name} does not fit on GPU devices {dev} of node {self.names[i]}")
        if dev and not self.gpu_exists[i, dev].all():
            raise AllocationError(f"node {self.names[i]} has no GPU device among {dev}")

    def release(self, pod: Pod, placement: Placement) -> None:
        i, r = placement.node, pod.requests
        dev = list(placement.devices)
        if self.req_milli_cpu[i] < r.milli_cpu or self.req_memory_bytes[i] < r.memory_bytes:
            raise AllocationError(f"release of pod {pod.name} would make node {self.names[i]} negative")
        if dev and (self.gpu_free_milli[i, dev] + placement.milli_per_device > MILLI_GPU_PER_DEVICE).any():
            raise AllocationError(f"release of pod {pod.name} would free more GPU than node {self.names[i]} has")
        self.req_milli_cpu[i] -= r.milli_cpu
        self.req_memory_bytes[i] -= r.memory_bytes
        if dev:
            self.gpu_free_milli[i, dev] += placement.milli_per_device
        if pod.scalar_requests:
            for name, amount in pod.scalar_requests.items():
                j = self.scalar_index.get(name)
                if j is not None:
                    self.req_scalar[i, j] -= amount
        self._count_shape(i, pod, -1)

    def _count_shape(self, i: int, pod: Pod, sign: int) -> None:
        cls = gpu_shape_class(pod)
        if cls >= 0:
            self.shape_class_count[i, cls] += sign
        self.node_version[i] += 1
