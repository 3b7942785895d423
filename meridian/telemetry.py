"""Node telemetry between the wire and the numpy cluster state: bulk decode, validation, growth.

``decode_reports`` turns a batch of stream entries (one ``NodeTelemetry`` protobuf each) into a
:class:`TelemetryBatch` — one numpy array per field, a row per valid report — plus the entries it
rejected with a short reason class (``oversized``, ``decode``, ``invalid``, ``foreign``) and a
readable reason. The per-message work is only protobuf parsing and field reads; everything after
(validation, de-duplication, application) is array arithmetic over the batch.

``extend_cluster_state`` grows a :class:`~meridian.cluster_state.ClusterState` by the nodes that
reported for the first time, column-wise (no pydantic ``Node`` per node), so a regional scheduler
can start empty and learn its cluster from the stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import attrgetter

import numpy as np
from google.protobuf.message import DecodeError

from meridian.bus.base import StreamEntry
from meridian.cluster_state import MAX_GPUS, ClusterState
from meridian.model import MILLI_GPU_PER_DEVICE, Taint
from protos import telemetry_pb2

#: Default upper bound on one report (a node with 8 GPUs and 100 labels is about 6 KiB).
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024


@dataclass(frozen=True)
class Rejected:
    entry: StreamEntry
    reason_class: str  # short, bounded: a metric label
    reason: str  # readable, goes to the dead-letter stream


@dataclass
class TelemetryBatch:
    """Valid reports of one batch, column-wise; row ``k`` came from ``entries[k]``."""

    node: list[str]
    sequence: np.ndarray  # int64
    observed_s: np.ndarray  # float64, Unix seconds
    alloc_milli_cpu: np.ndarray  # int64
    alloc_memory_bytes: np.ndarray  # int64
    gpu_count: np.ndarray  # int64
    req_milli_cpu: np.ndarray  # int64
    req_memory_bytes: np.ndarray  # int64
    used_milli_cpu: np.ndarray  # float64
    used_memory_bytes: np.ndarray  # float64
    power_watts: np.ndarray  # float64
    energy_joules: np.ndarray  # float64
    carbon_g_per_kwh: np.ndarray  # float64
    pue: np.ndarray  # float64
    unschedulable: np.ndarray  # bool
    gpu_reported: np.ndarray  # bool: the report listed its GPU devices
    gpu_free_milli: np.ndarray  # int64 (m, MAX_GPUS); slots past the device count hold 0
    gpu_model: list[str]
    labels: dict[int, dict[str, str]] = field(default_factory=dict)  # rows that carried labels
    taints: dict[int, tuple[Taint, ...]] = field(default_factory=dict)
    entries: list[StreamEntry] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.node)

    def select(self, rows: np.ndarray) -> TelemetryBatch:
        """The batch restricted to ``rows`` (int indices), labels re-keyed."""
        rows = np.asarray(rows, dtype=np.int64)
        position = {int(r): k for k, r in enumerate(rows)}
        arrays = {name: getattr(self, name)[rows] for name in _ARRAY_FIELDS}
        return TelemetryBatch(
            node=[self.node[r] for r in rows], gpu_model=[self.gpu_model[r] for r in rows],
            labels={position[r]: v for r, v in self.labels.items() if r in position},
            taints={position[r]: v for r, v in self.taints.items() if r in position},
            entries=[self.entries[r] for r in rows] if self.entries else [], **arrays,
        )


_ARRAY_FIELDS = ("sequence", "observed_s", "alloc_milli_cpu", "alloc_memory_bytes", "gpu_count", "req_milli_cpu",
                 "req_memory_bytes", "used_milli_cpu", "used_memory_bytes", "power_watts", "energy_joules",
                 "carbon_g_per_kwh", "pue", "unschedulable", "gpu_reported", "gpu_free_milli")


# The fields read from every report, in one C-level attrgetter call; node first, labels_included last.
_READ_NAMES = ("node", "cluster", "sequence", "observed_unix_ms", "capacity_milli_cpu", "capacity_memory_bytes",
               "capacity_gpu", "allocatable_milli_cpu", "allocatable_memory_bytes", "allocatable_gpu",
               "requested_milli_cpu", "requested_memory_bytes", "used_milli_cpu", "used_memory_bytes",
               "power_watts", "energy_joules", "carbon_g_per_kwh", "pue", "unschedulable", "gpu_model",
               "labels_included")
_READ_FIELDS = attrgetter(*_READ_NAMES)


@lru_cache(maxsize=4096)
def _taints(key: tuple[tuple[str, str, str], ...]) -> tuple[Taint, ...]:
    return tuple(Taint(key=k, value=v, effect=e) for k, v, e in key)


def decode_reports(entries: Sequence[StreamEntry], *, cluster: str | None = None,
                   max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[TelemetryBatch, list[Rejected]]:
    """Decode and validate a batch of ``NodeTelemetry`` entries (see module docstring)."""
    parse = telemetry_pb2.NodeTelemetry.FromString
    rejected: list[Rejected] = []
    kept: list[StreamEntry] = []
    rows: list[tuple] = []
    gpu_rows: list[int] = []
    gpu_lists: list = []  # the reports' packed gpu_free_milli containers, flattened once after the loop
    labels: dict[int, dict[str, str]] = {}
    taints: dict[int, tuple[Taint, ...]] = {}
    read = _READ_FIELDS
    for entry in entries:
        payload = entry.payload
        if len(payload) > max_payload_bytes:
            rejected.append(Rejected(entry, "oversized", f"oversized: {len(payload)} bytes > {max_payload_bytes}"))
            continue
        try:
            m = parse(payload)
        except (DecodeError, RuntimeError, ValueError) as exc:
            rejected.append(Rejected(entry, "decode", f"decode error: {exc}"))
            continue
        values = read(m)  # one C-level pass over the hot fields
        if not values[0]:
            rejected.append(Rejected(entry, "invalid", "invalid: report has no node name"))
            continue
        if cluster is not None and values[1] != cluster:
            rejected.append(Rejected(entry, "foreign", f"foreign: report for cluster {values[1]!r} on {cluster!r}'s stream"))
            continue
        row = len(rows)
        free = m.gpu_free_milli
        if free:
            gpu_rows.append(row)
            gpu_lists.append(free)
        if values[-1]:
            labels[row] = dict(m.labels)
            taints[row] = _taints(tuple((t.key, t.value, t.effect) for t in m.taints))
        rows.append(values)
        kept.append(entry)

    n = len(rows)
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(_READ_NAMES)
    col = dict(zip(_READ_NAMES, columns, strict=True))

    def ints(name: str) -> np.ndarray:
        return np.fromiter(col[name], dtype=np.int64, count=n)

    def floats(name: str) -> np.ndarray:
        return np.fromiter(col[name], dtype=np.float64, count=n)

    alloc_cpu, alloc_mem = ints("allocatable_milli_cpu"), ints("allocatable_memory_bytes")
    unset = (alloc_cpu == 0) & (alloc_mem == 0)  # no allocatable: capacity is allocatable
    if unset.any():
        alloc_cpu = np.where(unset, ints("capacity_milli_cpu"), alloc_cpu)
        alloc_mem = np.where(unset, ints("capacity_memory_bytes"), alloc_mem)
    gpu_count = ints("allocatable_gpu")
    if unset.any():
        gpu_count = np.where(unset, ints("capacity_gpu"), gpu_count)
    gpu_free = np.zeros((n, MAX_GPUS), dtype=np.int64)
    gpu_reported = np.zeros(n, dtype=bool)
    if gpu_rows:
        counts = np.fromiter(map(len, gpu_lists), dtype=np.int64, count=len(gpu_lists))
        values = np.fromiter(chain.from_iterable(gpu_lists), dtype=np.int64, count=int(counts.sum()))
        row_idx = np.repeat(np.array(gpu_rows, dtype=np.int64), counts)
        slots = np.arange(values.size) - np.repeat(np.cumsum(counts) - counts, counts)
        ok = slots < MAX_GPUS
        gpu_free[row_idx[ok], slots[ok]] = np.clip(values[ok], 0, MILLI_GPU_PER_DEVICE)
        gpu_reported[np.array(gpu_rows, dtype=np.int64)] = True
    batch = TelemetryBatch(
        node=list(col["node"]), sequence=ints("sequence"), observed_s=floats("observed_unix_ms") / 1000.0,
        alloc_milli_cpu=alloc_cpu, alloc_memory_bytes=alloc_mem, gpu_count=gpu_count,
        req_milli_cpu=ints("requested_milli_cpu"), req_memory_bytes=ints("requested_memory_bytes"),
        used_milli_cpu=floats("used_milli_cpu"), used_memory_bytes=floats("used_memory_bytes"),
        power_watts=floats("power_watts"), energy_joules=floats("energy_joules"),
        carbon_g_per_kwh=floats("carbon_g_per_kwh"), pue=floats("pue"),
        unschedulable=np.fromiter(col["unschedulable"], dtype=bool, count=n), gpu_reported=gpu_reported,
        gpu_free_milli=gpu_free, gpu_model=list(col["gpu_model"]), labels=labels, taints=taints, entries=kept,
    )
    node = batch.node
    measured = np.stack([batch.used_milli_cpu, batch.used_memory_bytes, batch.power_watts, batch.energy_joules,
                         batch.carbon_g_per_kwh], axis=1)
    # Vectorised validation: measurements must be finite and non-negative, GPUs within bounds.
    bad = ~np.isfinite(measured).all(axis=1) | (measured < 0).any(axis=1) | (batch.gpu_count > MAX_GPUS)
    bad |= (batch.alloc_milli_cpu < 0) | (batch.alloc_memory_bytes < 0)
    if bad.any():
        for row in np.flatnonzero(bad):
            rejected.append(Rejected(kept[row], "invalid", f"invalid: node {node[row]} reports a non-finite or "
                                     f"negative measurement or more than {MAX_GPUS} GPUs"))
        batch = batch.select(np.flatnonzero(~bad))
    return batch, rejected


def extend_cluster_state(state: ClusterState, batch: TelemetryBatch, rows: np.ndarray) -> ClusterState:
    """A new state with the nodes of ``batch[rows]`` appended (first report of each; names unseen).

    Allocatable, GPU count/model, labels and taints come from the report; requested starts at the
    reported value (or 0) and telemetry columns at NaN until the report is applied.
    """
    rows = np.asarray(rows, dtype=np.int64)
    if rows.size == 0:
        return state
    n_new = rows.size
    models = list(state.gpu_models)
    model_id = {m: i for i, m in enumerate(models)}
    new_model_ids = np.empty(n_new, dtype=np.int64)
    group_labels = list(state.group_labels)
    group_taints = list(state.group_taints)
    group_index = {(tuple(sorted(lab.items())), tnt): g for g, (lab, tnt) in enumerate(zip(group_labels, group_taints,
                                                                                           strict=True))}
    new_groups = np.empty(n_new, dtype=np.int64)
    for k, r in enumerate(rows.tolist()):  # once per node lifetime (join), not per report
        model = batch.gpu_model[r] if batch.gpu_count[r] else ""
        if model and model not in model_id:
            model_id[model] = len(models)
            models.append(model)
        new_model_ids[k] = model_id.get(model, -1) if model else -1
        lab = batch.labels.get(r, {})
        tnt = batch.taints.get(r, ())
        key = (tuple(sorted(lab.items())), tnt)
        if key not in group_index:
            group_index[key] = len(group_labels)
            group_labels.append(dict(lab))
            group_taints.append(tnt)
        new_groups[k] = group_index[key]
    gpu_count = batch.gpu_count[rows]
    gpu_exists = np.arange(MAX_GPUS)[None, :] < gpu_count[:, None]
    gpu_free = np.where(batch.gpu_reported[rows, None], batch.gpu_free_milli[rows], MILLI_GPU_PER_DEVICE)
    gpu_free = np.where(gpu_exists, gpu_free, 0)

    nan = np.full(n_new, np.nan)
    known: dict[str, np.ndarray] = {
        "alloc_milli_cpu": batch.alloc_milli_cpu[rows],
        "alloc_memory_bytes": batch.alloc_memory_bytes[rows],
        "gpu_count": gpu_count,
        "gpu_model_id": new_model_ids,
        "req_milli_cpu": np.zeros(n_new, dtype=np.int64),
        "req_memory_bytes": np.zeros(n_new, dtype=np.int64),
        "gpu_free_milli": gpu_free,
        "gpu_exists": gpu_exists,
        "schedulable": np.ones(n_new, dtype=bool),
        "constraint_group": new_groups,
        "used_milli_cpu": nan, "used_memory_bytes": nan, "power_watts": nan, "energy_joules": nan,
        "carbon_g_per_kwh": nan, "last_seen_s": nan,
        "last_seq": np.full(n_new, -1, dtype=np.int64),
    }
    n_old = state.n_nodes
    grown: dict[str, object] = {}
    for spec in dataclasses.fields(state):
        old = getattr(state, spec.name)
        if isinstance(old, np.ndarray) and old.ndim >= 1 and old.shape[0] == n_old:
            # Per-node arrays this module does not know (added to ClusterState later) start at zero.
            extra = known.get(spec.name)
            if extra is None:
                extra = np.zeros((n_new, *old.shape[1:]), dtype=old.dtype)
            grown[spec.name] = np.concatenate([old, np.asarray(extra).astype(old.dtype, copy=False)])
        else:
            grown[spec.name] = old
    grown["names"] = state.names + [batch.node[r] for r in rows.tolist()]
    grown["gpu_models"] = models
    grown["group_labels"] = group_labels
    grown["group_taints"] = group_taints
    return ClusterState(**grown)
