"""Cluster state from live telemetry: consume a cluster's report stream into numpy arrays.

Design
------
:class:`TelemetryState` owns the regional :class:`~meridian.cluster_state.ClusterState` and applies
whole batches of decoded reports in a few vectorised steps:

1. names → node indices (one dict lookup per report; nodes never seen are appended column-wise by
   :func:`meridian.telemetry.extend_cluster_state`, once per node lifetime);
2. idempotence by node and sequence: a report is applied only if its sequence is greater than the
   node's ``last_seq``; identical ``(node, sequence)`` pairs inside a batch count once; of several
   fresh reports of one node in a batch the newest wins (``np.lexsort`` + last-of-group);
3. fancy-indexed assignment of the winners' columns into the state arrays, and liveness
   (``last_seen_s`` is the *consumer's* clock at application, so node clock skew cannot make a node
   look alive or dead);
4. :meth:`TelemetryState.mark_stale`: a node silent for ``stale_after_s`` becomes unschedulable,
   and schedulable again with its next report (unless cordoned).

:class:`TelemetryConsumer` is the stream worker (kopf-like: keyword-only parameters, one worker per
stream, back-off over a sequence of delays): claim what a dead consumer left pending
(``XAUTOCLAIM``, every ``claim_interval_s``, before new entries so redelivered reports keep their
order), read a large batch, decode in bulk, dead-letter the malformed, apply, and only then ``XACK``
the whole batch in one call.

Hazards
-------
* A consumer killed after applying but before acknowledging leaves its batch pending; whoever claims
  it re-applies nothing (sequence check), so redelivery is harmless. A consumer killed before
  applying loses nothing either: the entries stay pending until claimed.
* ``requests_from_reports`` (default on) makes the node's own view of requested resources the truth.
  A pod this scheduler just bound may be missing from a report made before the bind; a scheduler
  that binds must keep its assumed pods on top (kube-scheduler's "assume" cache) or turn this off.
* Sequences must increase across agent restarts: agents start their counter at ``unix_ms × 1000``.
* Growing the state replaces the ``ClusterState`` object: read ``TelemetryState.state`` under
  ``TelemetryState.lock`` each time instead of keeping a reference.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar

import numpy as np
from pydantic import Field
from pydantic_settings import SettingsConfigDict

from meridian import observability
from meridian.bus import BusError, BusUnavailableError, StreamBus, StreamEntry, telemetry_stream
from meridian.bus.consumer import run_with_backoff
from meridian.bus.health import GroupGauges
from meridian.bus.settings import ConsumerSettings, StreamConsumerSettings
from meridian.cluster_state import ClusterState
from meridian.telemetry import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    TelemetryBatch,
    assign_measurements,
    decode_reports,
    extend_cluster_state,
)

log = logging.getLogger(__name__)

REPORTS = observability.counter("meridian_telemetry_reports_total", "Node reports seen by the regional consumer, by "
                                "outcome (applied, duplicate, stale_sequence, dead_letter).", ["cluster", "outcome"])
NODES_STALE = observability.gauge("meridian_telemetry_nodes_stale", "Nodes that missed their heartbeat and are "
                                  "unschedulable.", ["cluster"])
BATCH_SECONDS = observability.histogram("meridian_telemetry_batch_seconds", "Wall time to decode and apply one batch "
                                        "of reports.", ["cluster"])


TelemetryBus = ConsumerSettings.tailored("TelemetryBus", batch=5000, block_ms=1000,
                                         backoff_s=(0.1, 0.2, 0.5, 1.0, 2.0, 5.0))
"""The telemetry consumer's stream settings: large batches (5000 reports of ~300 bytes are ~1.5 MB per read,
amortising the round trip and the numpy calls), a 1 s wait (bounds shutdown time), and a first retry sooner
than the other workers' (the regional state goes stale while the bus is away)."""


class TelemetryConsumerSettings(StreamConsumerSettings):
    """The regional telemetry consumer (environment: ``MERIDIAN_TELEMETRY_*``; the stream settings
    ``MERIDIAN_TELEMETRY_BUS__*``, and the flat ``MERIDIAN_TELEMETRY_BATCH_COUNT``, ``_BLOCK_MS``,
    ``_CLAIM_MIN_IDLE_MS`` and ``_BACKOFF_S``, also read)."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_TELEMETRY_")
    flat_bus_names: ClassVar[Mapping[str, str]] = {"batch_count": "batch", "block_ms": "block_ms", "claim_min_idle_ms": "claim_idle_ms",
                      "backoff_s": "backoff_s"}

    cluster: str = Field("local", description="Cluster whose stream (meridian:{<cluster>}:telemetry) is consumed.")
    bus_url: str = Field("redis://127.0.0.1:6379/0", description="Redis URL, or memory:// for the embedded bus.")
    key_prefix: str = Field("", description="Prefix of every Redis key, to share one Redis between environments.")
    group: str = Field("regional", description="Consumer group; all replicas of a regional scheduler share it.")
    consumer: str = Field(default_factory=socket.gethostname, description="This consumer's name in the group "
                          "(the pod name in Kubernetes).")
    bus: TelemetryBus = Field(default_factory=TelemetryBus, description="Reading the telemetry stream: batch, "
                              "block_ms, claim_idle_ms, backoff_s (meridian.bus.settings.ConsumerSettings).")
    claim_interval_s: float = Field(5.0, ge=0, description="How often (s) to look for such entries.")
    stale_after_s: float = Field(10.0, gt=0, description="A node silent this long (s) is unschedulable: five missed "
                                 "reports at the agents' default 2 s interval.")
    max_payload_bytes: int = Field(DEFAULT_MAX_PAYLOAD_BYTES, ge=256, description="Larger reports are dead-lettered "
                                   "as oversized (bytes).")
    max_nodes: int = Field(200_000, ge=1, description="Most nodes one cluster's state holds; reports of further new "
                           "node names are dead-lettered. Above the largest clusters run anywhere (Kubernetes "
                           "supports 5,000; the biggest managed ones 65,000-130,000), far below what invented "
                           "names could cost in memory and summaries.")
    requests_from_reports: bool = Field(True, description="Take requested CPU/memory/GPU from the nodes' reports "
                                        "(see the module's hazards).")


class TelemetryState:
    """The regional cluster state, fed by telemetry batches (see module docstring)."""

    def __init__(self, *, cluster: str, state: ClusterState | None = None, stale_after_s: float = 10.0,
                 requests_from_reports: bool = True, clock: Callable[[], float] = time.time,
                 max_nodes: int = 200_000) -> None:
        self.cluster = cluster
        self.max_nodes = max_nodes
        self.state = state if state is not None else ClusterState.from_nodes([])
        self.stale_after_s = stale_after_s
        self.requests_from_reports = requests_from_reports
        self.clock = clock
        self.started_s = clock()
        self.lock = threading.RLock()
        n = self.state.n_nodes
        self.cordoned = ~self.state.schedulable.copy() if n else np.zeros(0, dtype=bool)
        self.stale = np.zeros(n, dtype=bool)
        self.pue = np.full(n, np.nan)
        self.observed_s = np.full(n, np.nan)
        self.applied_total = 0
        self.duplicate_total = 0  # same (node, sequence) again: redelivery
        self.stale_sequence_total = 0  # older than what the node already reported

    # ------------------------------------------------------------------ application
    def beyond_capacity(self, batch: TelemetryBatch) -> np.ndarray:
        """Rows of ``batch`` from nodes new to the state that would take it past ``max_nodes``: invented
        node names must not grow the state (and every summary) without bound."""
        with self.lock:
            index = self.state.index
            room = self.max_nodes - self.state.n_nodes
            new = dict.fromkeys(name for name in batch.node if name not in index)
            if len(new) <= room:
                return np.zeros(0, dtype=np.int64)
            refused = set(list(new)[max(room, 0):])
            return np.fromiter((r for r, name in enumerate(batch.node) if name in refused), dtype=np.int64)

    def _grow(self, batch: TelemetryBatch, rows: np.ndarray) -> None:
        self.state = extend_cluster_state(self.state, batch, rows)
        k = rows.size
        self.cordoned = np.concatenate([self.cordoned, np.zeros(k, dtype=bool)])
        self.stale = np.concatenate([self.stale, np.zeros(k, dtype=bool)])
        self.pue = np.concatenate([self.pue, np.full(k, np.nan)])
        self.observed_s = np.concatenate([self.observed_s, np.full(k, np.nan)])

    def apply(self, batch: TelemetryBatch, *, now_s: float | None = None) -> np.ndarray:
        """Apply a batch; returns the rows of ``batch`` that were applied (fresh, first of their pair)."""
        now = self.clock() if now_s is None else now_s
        m = len(batch)
        if m == 0:
            return np.zeros(0, dtype=np.int64)
        with self.lock:
            index = self.state.index
            idx = np.fromiter((index.get(name, -1) for name in batch.node), dtype=np.int64, count=m)
            unknown = np.flatnonzero(idx < 0)
            if unknown.size:
                first_rows: dict[str, int] = {}
                # A node joins with a report that carries its labels when the batch has one.
                for r in sorted(unknown.tolist(), key=lambda r: r not in batch.labels):
                    first_rows.setdefault(batch.node[r], r)
                self._grow(batch, np.fromiter(first_rows.values(), dtype=np.int64, count=len(first_rows)))
                index = self.state.index
                idx[unknown] = [index[batch.node[r]] for r in unknown.tolist()]
            st = self.state
            seq = batch.sequence
            # Sort by (node, sequence): identical pairs are adjacent, the newest of a node is last.
            order = np.lexsort((seq, idx))
            s_idx, s_seq = idx[order], seq[order]
            new_pair = np.ones(m, dtype=bool)
            new_pair[1:] = (s_idx[1:] != s_idx[:-1]) | (s_seq[1:] != s_seq[:-1])
            fresh = s_seq > st.last_seq[s_idx]
            applied_sorted = fresh & new_pair
            duplicates = int((~new_pair).sum()) + int((new_pair & ~fresh & (s_seq == st.last_seq[s_idx])).sum())
            stale_sequences = int((new_pair & (s_seq < st.last_seq[s_idx])).sum())
            self.applied_total += int(applied_sorted.sum())
            self.duplicate_total += duplicates
            self.stale_sequence_total += stale_sequences
            if duplicates:
                REPORTS.labels(cluster=self.cluster, outcome="duplicate").inc(duplicates)
            if stale_sequences:
                REPORTS.labels(cluster=self.cluster, outcome="stale_sequence").inc(stale_sequences)
            last_of_node = np.ones(m, dtype=bool)
            last_of_node[:-1] = s_idx[1:] != s_idx[:-1]
            win = last_of_node & fresh
            rows, nodes = order[win], s_idx[win]
            if rows.size:
                self._assign(batch, rows, nodes, now)
            REPORTS.labels(cluster=self.cluster, outcome="applied").inc(int(applied_sorted.sum()))
            return np.sort(order[applied_sorted])

    def _assign(self, batch: TelemetryBatch, rows: np.ndarray, nodes: np.ndarray, now: float) -> None:
        st = self.state
        before = (st.alloc_milli_cpu[nodes], st.alloc_memory_bytes[nodes], st.req_milli_cpu[nodes],
                  st.req_memory_bytes[nodes], st.gpu_free_milli[nodes], st.schedulable[nodes])
        self.pue[nodes] = assign_measurements(st, batch, rows, nodes, now)
        self.observed_s[nodes] = batch.observed_s[rows]
        st.alloc_milli_cpu[nodes] = batch.alloc_milli_cpu[rows]
        st.alloc_memory_bytes[nodes] = batch.alloc_memory_bytes[rows]
        if self.requests_from_reports:
            st.req_milli_cpu[nodes] = np.minimum(batch.req_milli_cpu[rows], st.alloc_milli_cpu[nodes])
            st.req_memory_bytes[nodes] = np.minimum(batch.req_memory_bytes[rows], st.alloc_memory_bytes[nodes])
            gpu = batch.gpu_reported[rows]
            if gpu.any():
                g_nodes, g_rows = nodes[gpu], rows[gpu]
                st.gpu_free_milli[g_nodes] = np.where(st.gpu_exists[g_nodes], batch.gpu_free_milli[g_rows], 0)
        self.cordoned[nodes] = batch.unschedulable[rows]
        self.stale[nodes] = False
        st.schedulable[nodes] = ~self.cordoned[nodes]
        if batch.labels:
            self._relabel(batch, rows, nodes)
        if hasattr(st, "node_version"):  # tell score caches which nodes changed for scheduling
            after = (st.alloc_milli_cpu[nodes], st.alloc_memory_bytes[nodes], st.req_milli_cpu[nodes],
                     st.req_memory_bytes[nodes], st.gpu_free_milli[nodes], st.schedulable[nodes])
            changed = np.zeros(nodes.size, dtype=bool)
            for old, new in zip(before, after, strict=True):
                changed |= (old != new).reshape(nodes.size, -1).any(axis=1)
            st.node_version[nodes[changed]] += 1

    def _relabel(self, batch: TelemetryBatch, rows: np.ndarray, nodes: np.ndarray) -> None:
        """Move nodes whose reported labels/taints changed to the matching constraint group."""
        st = self.state
        position = {int(r): int(n) for r, n in zip(rows.tolist(), nodes.tolist(), strict=True)}
        for row, labels in batch.labels.items():  # only reports that carry labels (one in N)
            node = position.get(row)
            if node is None:
                continue
            taints = batch.taints.get(row, ())
            group = int(st.constraint_group[node])
            if st.group_labels[group] == labels and st.group_taints[group] == taints:
                continue
            for g, (lab, tnt) in enumerate(zip(st.group_labels, st.group_taints, strict=True)):
                if lab == labels and tnt == taints:
                    st.constraint_group[node] = g
                    break
            else:
                st.group_labels.append(dict(labels))
                st.group_taints.append(taints)
                st.constraint_group[node] = len(st.group_labels) - 1

    def mark_stale(self, *, now_s: float | None = None) -> int:
        """Nodes silent for ``stale_after_s`` become unschedulable; returns how many are stale now."""
        now = self.clock() if now_s is None else now_s
        with self.lock:
            st = self.state
            never = np.isnan(st.last_seen_s)
            silent = np.where(never, now - self.started_s, now - np.where(never, now, st.last_seen_s))
            stale = silent > self.stale_after_s
            newly = stale & ~self.stale
            self.stale = stale
            schedulable = ~stale & ~self.cordoned
            if hasattr(st, "node_version"):
                st.node_version[schedulable != st.schedulable] += 1
            st.schedulable[:] = schedulable
            count = int(stale.sum())
            if newly.any():
                log.warning("cluster %s: %d node(s) missed their heartbeat for %.0f s and are unschedulable",
                            self.cluster, int(newly.sum()), self.stale_after_s)
            NODES_STALE.labels(cluster=self.cluster).set(count)
            return count


class TelemetryConsumer:
    """The worker that feeds a :class:`TelemetryState` from its cluster's stream."""

    def __init__(self, *, bus: StreamBus, state: TelemetryState, settings: TelemetryConsumerSettings,
                 clock: Callable[[], float] = time.time,
                 on_applied: Callable[[TelemetryBatch, np.ndarray], None] | None = None) -> None:
        self.bus = bus
        self.state = state
        self.settings = settings
        self.clock = clock
        self.on_applied = on_applied
        self.stream = telemetry_stream(settings.cluster)
        self.dead_lettered_total = 0
        self.batches_total = 0
        self._next_claim_s = 0.0
        self._group_ready = False
        self._gauges = GroupGauges(bus, self.stream, settings.group)

    def _ensure_group(self) -> None:
        if not self._group_ready:
            self.bus.ensure_group(self.stream, self.settings.group, start_id="0")
            self._group_ready = True

    def step(self) -> int:
        """One round: claim (when due) or read, then process. Returns entries handled."""
        s = self.settings
        self._ensure_group()
        entries: list[StreamEntry] = []
        now = self.clock()
        if now >= self._next_claim_s:
            self._next_claim_s = now + s.claim_interval_s
            entries = self.bus.claim_stale(self.stream, s.group, s.consumer, min_idle_ms=s.bus.claim_idle_ms,
                                           count=s.bus.batch)
            if entries:
                log.info("cluster %s: claimed %d pending report(s) from a dead consumer", s.cluster, len(entries))
        if not entries:
            entries = self.bus.read_group(self.stream, s.group, s.consumer, count=s.bus.batch, block_ms=s.bus.block_ms)
        if entries:
            self.process(entries)
        self.state.mark_stale()
        self._gauges.maybe_update()
        return len(entries)

    def process(self, entries: Sequence[StreamEntry]) -> None:
        """Decode, dead-letter the unusable, apply, acknowledge — in that order."""
        s = self.settings
        started = time.perf_counter()
        batch, rejected = decode_reports(entries, cluster=s.cluster, max_payload_bytes=s.max_payload_bytes)
        for bad in rejected:
            self.bus.dead_letter(self.stream, bad.entry, reason=bad.reason, group=s.group, consumer=s.consumer)
            observability.STREAM_DEAD_LETTERS.labels(stream=self.stream, reason=bad.reason_class).inc()
            REPORTS.labels(cluster=s.cluster, outcome="dead_letter").inc()
            log.warning("cluster %s: dead-lettered entry %s: %s", s.cluster, bad.entry.entry_id, bad.reason)
        self.dead_lettered_total += len(rejected)
        refused = self.state.beyond_capacity(batch)
        if refused.size:
            for row in refused.tolist():
                self.bus.dead_letter(self.stream, batch.entries[row], group=s.group, consumer=s.consumer,
                                     reason=f"too many nodes: cluster {s.cluster} is at its limit of "
                                            f"{self.state.max_nodes} (MERIDIAN_TELEMETRY_MAX_NODES)")
            observability.STREAM_DEAD_LETTERS.labels(stream=self.stream, reason="too_many_nodes").inc(refused.size)
            REPORTS.labels(cluster=s.cluster, outcome="dead_letter").inc(refused.size)
            self.dead_lettered_total += int(refused.size)
            keep = np.ones(len(batch), dtype=bool)
            keep[refused] = False
            batch = batch.select(np.flatnonzero(keep))
        applied = self.state.apply(batch)
        if self.on_applied is not None:
            self.on_applied(batch, applied)
        self.bus.ack(self.stream, s.group, [e.entry_id for e in entries])
        self.batches_total += 1
        BATCH_SECONDS.labels(cluster=s.cluster).observe(time.perf_counter() - started)

    def run(self, stop: threading.Event) -> None:
        """Loop until ``stop`` is set, backing off while the bus is unreachable; any other bus error is
        logged and retried after the longest delay."""
        def step() -> None:
            try:
                self.step()
            except BusUnavailableError:
                raise
            except BusError:
                log.exception("cluster %s: bus error; retrying", self.settings.cluster)
                stop.wait(self.settings.bus.backoff_s[-1])

        def say(exc: Exception, delay: float) -> None:
            self._group_ready = False
            log.warning("cluster %s: bus unavailable (%s); retrying in %.1f s", self.settings.cluster, exc, delay)

        run_with_backoff(stop, step, delays=self.settings.bus.backoff_s, on_failure=say, retry_on=(BusUnavailableError,))
