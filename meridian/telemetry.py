"""Node telemetry between the wire and the numpy cluster state: bulk decode, validation, growth.

``decode_reports`` turns a batch of stream entries (one ``NodeTelemetry`` protobuf each) into a
:class:`TelemetryBatch` — one numpy array per field, a row per valid report — plus the entries it
rejected with a short reason class (``oversized``, ``decode``, ``invalid``, ``foreign``) and a
readable reason. Each report is parsed by protobuf's upb backend and its fields are read into the
columns in bulk; validation, de-duplication and application are array arithmetic. A hand-written
numpy decoder of the wire format measured only 1.22–1.27× faster end to end than upb, below the 2×
that would pay for keeping a second parser (see docs/capacity.md), and was removed.

``extend_cluster_state`` grows a :class:`~meridian.cluster_state.ClusterState` by the nodes that
reported for the first time, column-wise (no pydantic ``Node`` per node), so a regional scheduler
can start empty and learn its cluster from the stream.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from operator import attrgetter, itemgetter

import numpy as np
from google.protobuf.message import DecodeError

from meridian.bus.base import StreamEntry
from meridian.cluster_state import MAX_GPUS, ClusterState
from meridian.model import MILLI_GPU_PER_DEVICE, Taint
from protos import telemetry_pb2

#: Default upper bound on one report (a node with 8 GPUs and 100 labels is about 6 KiB).
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024

#: Physical limits of one node's report. Each value is valid alone up to far beyond any machine, but
#: sums over nodes must stay finite and inside int64 (two nodes claiming 2**62 milli-CPU wrapped a
#: summary to -9.2e18; one power of 1e308 made a cluster's carbon infinite, and an energy counter
#: of 1e308 stayed infinite in every later summary). Reports beyond them are dead-lettered.
MAX_NODE_NAME_CHARS = 253  # a Kubernetes node name is a DNS subdomain
MAX_NODE_MILLI_CPU = 2**20 * 1000  # 1,048,576 cores
MAX_NODE_MEMORY_BYTES = 2**50  # 1 PiB
MAX_NODE_POWER_WATTS = 1e5  # 100 kW: a rack, not a node
MAX_NODE_ENERGY_JOULES = 1e15  # 100 kW for 300 years
MAX_CARBON_G_PER_KWH = 5000.0  # the dirtiest grids are near 1,000
MAX_PUE = 10.0


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
    carbon_known: np.ndarray  # bool: carbon_source is not CARBON_SOURCE_NONE
    gpu_reported: np.ndarray  # bool: the report listed its GPU devices
    gpu_free_milli: np.ndarray  # int64 (m, MAX_GPUS); slots past the device count hold 0
    gpu_devices_listed: np.ndarray  # int64: devices the report listed (may exceed MAX_GPUS: invalid)
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
        arrays = {name: getattr(self, name)[rows] for name in ARRAY_FIELDS}
        return TelemetryBatch(
            node=[self.node[r] for r in rows], gpu_model=[self.gpu_model[r] for r in rows],
            labels={position[r]: v for r, v in self.labels.items() if r in position},
            taints={position[r]: v for r, v in self.taints.items() if r in position},
            entries=[self.entries[r] for r in rows] if self.entries else [], **arrays,
        )


ARRAY_FIELDS = ("sequence", "observed_s", "alloc_milli_cpu", "alloc_memory_bytes", "gpu_count", "req_milli_cpu",
                 "req_memory_bytes", "used_milli_cpu", "used_memory_bytes", "power_watts", "energy_joules",
                 "carbon_g_per_kwh", "pue", "unschedulable", "gpu_reported", "gpu_free_milli", "gpu_devices_listed",
                 "carbon_known")


# The fields read from every report, in one C-level attrgetter call; node first, labels_included last.
_READ_NAMES = ("node", "cluster", "sequence", "observed_unix_ms", "capacity_milli_cpu", "capacity_memory_bytes",
               "capacity_gpu", "allocatable_milli_cpu", "allocatable_memory_bytes", "allocatable_gpu",
               "requested_milli_cpu", "requested_memory_bytes", "used_milli_cpu", "used_memory_bytes",
               "power_watts", "energy_joules", "carbon_g_per_kwh", "pue", "unschedulable", "gpu_model",
               "carbon_source", "labels_included")
_READ_FIELDS = attrgetter(*_READ_NAMES)
_GPU_FREE = attrgetter("gpu_free_milli")
_PAYLOAD_OF = itemgetter(1)  # StreamEntry.payload
_PARSE = telemetry_pb2.NodeTelemetry.FromString


@lru_cache(maxsize=4096)
def _taints(key: tuple[tuple[str, str, str], ...]) -> tuple[Taint, ...]:
    return tuple(Taint(key=k, value=v, effect=e) for k, v, e in key)


def _parse_each(entries: list[StreamEntry], rejected: list[Rejected]) -> tuple[list[StreamEntry], list]:
    """Parse one by one (the slow path, taken only when a batch holds an unparsable payload)."""
    parse = telemetry_pb2.NodeTelemetry.FromString
    kept, messages = [], []
    for entry in entries:
        try:
            messages.append(parse(entry.payload))
            kept.append(entry)
        except (DecodeError, RuntimeError, ValueError) as exc:
            rejected.append(Rejected(entry, "decode", f"decode error: {exc}"))
    return kept, messages


def decode_batch(entries: list[StreamEntry], rejected: list[Rejected]) -> tuple[TelemetryBatch, list[str]]:
    """Decode without validating (upb, one parse per report) into a batch, row ``k`` from the
    ``k``-th parsable entry, and each report's cluster; unparsable payloads go to ``rejected``."""
    try:
        messages = list(map(_PARSE, map(_PAYLOAD_OF, entries)))
    except (DecodeError, RuntimeError, ValueError):
        entries, messages = _parse_each(entries, rejected)
    n = len(messages)
    rows = list(map(_READ_FIELDS, messages))
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(_READ_NAMES)
    col = dict(zip(_READ_NAMES, columns, strict=True))

    def ints(name: str) -> np.ndarray:
        if name == "sequence":  # uint64 on the wire: above 2**63 it reads as negative and is rejected
            return np.fromiter(col[name], dtype=np.uint64, count=n).view(np.int64)
        return np.fromiter(col[name], dtype=np.int64, count=n)

    def floats(name: str) -> np.ndarray:
        return np.fromiter(col[name], dtype=np.float64, count=n)

    gpu_lists = list(map(_GPU_FREE, messages))
    counts = np.fromiter(map(len, gpu_lists), dtype=np.int64, count=n)
    values = np.fromiter(chain.from_iterable(gpu_lists), dtype=np.int64, count=int(counts.sum()))
    labels: dict[int, dict[str, str]] = {}
    taints: dict[int, tuple[Taint, ...]] = {}
    for row in np.flatnonzero(np.fromiter(col["labels_included"], dtype=bool, count=n)).tolist():
        m = messages[row]
        labels[row] = dict(m.labels)
        taints[row] = _taints(tuple((t.key, t.value, t.effect) for t in m.taints))
    batch = _assemble(
        node=list(col["node"]), gpu_model=list(col["gpu_model"]), entries=entries, int_col=ints, float_col=floats,
        gpu_counts=counts, gpu_values=values, labels=labels, taints=taints)
    return batch, list(col["cluster"])


def _assemble(*, node: list[str], gpu_model: list[str], entries: list[StreamEntry],
              int_col: Callable[[str], np.ndarray], float_col: Callable[[str], np.ndarray],
              gpu_counts: np.ndarray, gpu_values: np.ndarray, labels: dict[int, dict[str, str]],
              taints: dict[int, tuple[Taint, ...]]) -> TelemetryBatch:
    n = len(node)
    alloc_cpu, alloc_mem = int_col("allocatable_milli_cpu"), int_col("allocatable_memory_bytes")
    gpu_count = int_col("allocatable_gpu")
    unset = (alloc_cpu == 0) & (alloc_mem == 0)  # no allocatable: capacity is allocatable
    if unset.any():
        alloc_cpu = np.where(unset, int_col("capacity_milli_cpu"), alloc_cpu)
        alloc_mem = np.where(unset, int_col("capacity_memory_bytes"), alloc_mem)
        gpu_count = np.where(unset, int_col("capacity_gpu"), gpu_count)
    gpu_free = np.zeros((n, MAX_GPUS), dtype=np.int64)
    if gpu_values.size:
        row_idx = np.repeat(np.arange(n), gpu_counts)
        slots = np.arange(gpu_values.size) - np.repeat(np.cumsum(gpu_counts) - gpu_counts, gpu_counts)
        ok = slots < MAX_GPUS
        gpu_free[row_idx[ok], slots[ok]] = np.clip(gpu_values[ok], 0, MILLI_GPU_PER_DEVICE)
    return TelemetryBatch(
        node=node, sequence=int_col("sequence"), observed_s=int_col("observed_unix_ms") / 1000.0,
        alloc_milli_cpu=alloc_cpu, alloc_memory_bytes=alloc_mem, gpu_count=gpu_count,
        req_milli_cpu=int_col("requested_milli_cpu"), req_memory_bytes=int_col("requested_memory_bytes"),
        used_milli_cpu=float_col("used_milli_cpu"), used_memory_bytes=float_col("used_memory_bytes"),
        power_watts=float_col("power_watts"), energy_joules=float_col("energy_joules"),
        carbon_g_per_kwh=float_col("carbon_g_per_kwh"), pue=float_col("pue"),
        unschedulable=int_col("unschedulable") != 0, gpu_reported=gpu_counts > 0, gpu_free_milli=gpu_free,
        carbon_known=int_col("carbon_source") != telemetry_pb2.CARBON_SOURCE_NONE,
        gpu_model=gpu_model, labels=labels, taints=taints, entries=entries, gpu_devices_listed=gpu_counts,
    )


def decode_reports(entries: Sequence[StreamEntry], *, cluster: str | None = None,
                   max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[TelemetryBatch, list[Rejected]]:
    """Decode and validate a batch of ``NodeTelemetry`` entries (see module docstring): reject the
    oversized, decode the rest (:func:`decode_batch`), then validate (:func:`validate_batch`).
    Validation is vectorised over the batch, and only rejected reports are looked at one by one.
    """
    rejected: list[Rejected] = []
    entries = list(entries)
    sizes = np.fromiter(map(len, map(_PAYLOAD_OF, entries)), dtype=np.int64, count=len(entries))
    if (sizes > max_payload_bytes).any():
        for i in np.flatnonzero(sizes > max_payload_bytes).tolist():
            rejected.append(Rejected(entries[i], "oversized", f"oversized: {sizes[i]} bytes > {max_payload_bytes}"))
        entries = [e for e, size in zip(entries, sizes.tolist(), strict=True) if size <= max_payload_bytes]
    batch, clusters = decode_batch(entries, rejected)
    return validate_batch(batch, clusters, cluster, rejected), rejected


def validate_batch(batch: TelemetryBatch, clusters: list[str], cluster: str | None,
                   rejected: list[Rejected]) -> TelemetryBatch:
    """Drop invalid rows into ``rejected``; the C-level min/set checks keep an all-valid batch cheap."""
    n = len(batch)
    node = batch.node
    bad = np.zeros(n, dtype=bool)
    reasons: dict[int, tuple[str, str]] = {}
    if n and min(node) == "":
        for row in (r for r in range(n) if not node[r]):
            bad[row] = True
            reasons[row] = ("invalid", "invalid: report has no node name")
    if cluster is not None and n and set(clusters) != {cluster}:
        for row in (r for r in range(n) if clusters[r] != cluster and not bad[r]):
            bad[row] = True
            reasons[row] = ("foreign", f"foreign: report for cluster {clusters[row]!r} on {cluster!r}'s stream")
    measured = np.stack([batch.used_milli_cpu, batch.used_memory_bytes, batch.power_watts, batch.energy_joules,
                         batch.carbon_g_per_kwh], axis=1)
    invalid = ~np.isfinite(measured).all(axis=1) | (measured < 0).any(axis=1) | (batch.gpu_count > MAX_GPUS)
    invalid |= (batch.alloc_milli_cpu < 0) | (batch.alloc_memory_bytes < 0) | (batch.gpu_devices_listed > MAX_GPUS)
    invalid |= batch.sequence < 0
    for row in np.flatnonzero(invalid & ~bad).tolist():
        reasons[row] = ("invalid", f"invalid: node {node[row][:64]} reports a non-finite or negative measurement, "
                                   f"more than {MAX_GPUS} GPUs or a sequence beyond 2**63")
    bad |= invalid
    limits = (
        ("node name", np.fromiter(map(len, node), dtype=np.int64, count=n), MAX_NODE_NAME_CHARS),
        ("allocatable cpu", batch.alloc_milli_cpu, MAX_NODE_MILLI_CPU),
        ("requested cpu", batch.req_milli_cpu, MAX_NODE_MILLI_CPU),
        ("used cpu", batch.used_milli_cpu, MAX_NODE_MILLI_CPU),
        ("allocatable memory", batch.alloc_memory_bytes, MAX_NODE_MEMORY_BYTES),
        ("requested memory", batch.req_memory_bytes, MAX_NODE_MEMORY_BYTES),
        ("used memory", batch.used_memory_bytes, MAX_NODE_MEMORY_BYTES),
        ("power", batch.power_watts, MAX_NODE_POWER_WATTS),
        ("energy", batch.energy_joules, MAX_NODE_ENERGY_JOULES),
        ("carbon intensity", batch.carbon_g_per_kwh, MAX_CARBON_G_PER_KWH),
        ("pue", np.nan_to_num(batch.pue), MAX_PUE),
    )
    beyond = np.zeros(n, dtype=bool)
    for _, values, limit in limits:
        beyond |= values > limit
    for row in np.flatnonzero(beyond & ~bad).tolist():
        field_name, value, limit = next((f, v[row], lim) for f, v, lim in limits if v[row] > lim)
        reasons[row] = ("invalid", f"invalid: node {node[row][:64]!r} reports {field_name} {value:.6g}, beyond the "
                                   f"physical limit {limit:.6g} (meridian.telemetry)")
    bad |= beyond
    if not bad.any():
        return batch
    for row in sorted(reasons):
        rejected.append(Rejected(batch.entries[row], *reasons[row]))
    return batch.select(np.flatnonzero(~bad))


def assign_measurements(state: ClusterState, batch: TelemetryBatch, rows: np.ndarray, nodes: np.ndarray,
                        now_s: float) -> np.ndarray:
    """Copy the measured columns of ``batch[rows]`` (usage, power, energy, carbon, sequence) onto
    ``nodes`` of ``state``, seen at ``now_s``; returns those rows' PUE, NaN where a report left it
    unset (below 1, which no facility has)."""
    state.last_seq[nodes] = batch.sequence[rows]
    state.last_seen_s[nodes] = now_s
    state.used_milli_cpu[nodes] = batch.used_milli_cpu[rows]
    state.used_memory_bytes[nodes] = batch.used_memory_bytes[rows]
    state.power_watts[nodes] = batch.power_watts[rows]
    state.energy_joules[nodes] = batch.energy_joules[rows]
    # A node with no carbon source leaves its intensity unknown (NaN), not a 0 g/kWh grid.
    state.carbon_g_per_kwh[nodes] = np.where(batch.carbon_known[rows], batch.carbon_g_per_kwh[rows], np.nan)
    return np.where(batch.pue[rows] >= 1.0, batch.pue[rows], np.nan)


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
