"""One regional scheduler per cluster: one cluster state, one scheduling framework, whoever asks.

:class:`RegionalScheduler` owns the cluster's :class:`~meridian.cluster_state.ClusterState`. It is fed
by Kubernetes informers (every Node, and every bound Pod whoever bound it, so allocation is exact and
two schedulers sharing a cluster never over-commit it), and by node-agent telemetry (usage, power,
carbon). The same :class:`~regional_scheduler.framework.Scheduler` (filters, then the active policy)
decides for pending Kubernetes pods (:mod:`regional_scheduler.kube_scheduler`), for replicas the
global tier dispatches (:mod:`regional_scheduler.dispatch_worker`), and answers the scheduler
extender (:mod:`regional_scheduler.extender`).

Assumed pods, as kube-scheduler's cache: a decision takes the pod's resources on its node at once
(:meth:`RegionalScheduler.decide`), so the next decision sees them while the binding is still in
flight; :meth:`bound` confirms it and :meth:`forget` rolls it back when the binding fails. Records are
keyed by pod uid; the informer's view of where a pod is always wins over an assumption.

Node changes are folded in lazily: an added, removed or changed Node marks the state dirty, and the
next decision rebuilds it from the nodes and re-counts every recorded pod. Nodes change rarely and a
relist brings all of them at once, so one rebuild per burst of changes is cheaper than growing the
arrays node by node. A rebuild is a new ``ClusterState`` object, which every policy's cache treats as
a new cluster.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from meridian.cluster_state import AllocationError, ClusterState, Placement
from meridian.model import MILLI_GPU_PER_DEVICE, Node, Pod, TaintEffect
from meridian.telemetry import TelemetryBatch, assign_measurements
from regional_scheduler import kube_objects as ko
from regional_scheduler.filters import Diagnosis, run_filters
from regional_scheduler.framework import Decision, Scheduler
from regional_scheduler.policies.base import ScorePolicy
from regional_scheduler.policies.registry import get_policy

log = logging.getLogger(__name__)


@dataclass
class PodRecord:
    """A pod this cluster's state counts: bound (seen bound by the informer) or assumed (decided here,
    binding in flight). ``placement`` is None while its node is unknown to the state."""

    uid: str
    pod: Pod
    node: str
    devices: tuple[int, ...] | None
    assumed: bool
    placement: Placement | None = None
    binding_made: bool = False  # the binder succeeded; still assumed until the informer shows it bound


@dataclass
class NodeEvaluation:
    """The extender's view of some nodes for one pod: feasible nodes with the policy's score, and the
    reason each other node was rejected."""

    scores: dict[str, float] = field(default_factory=dict)
    rejected: dict[str, str] = field(default_factory=dict)


class RegionalScheduler:
    def __init__(self, *, cluster: str, policy: str | ScorePolicy = "fgd", seed: int = 0,
                 state: ClusterState | None = None, clock: Callable[[], float] = time.time) -> None:
        """``state``: a simulated cluster whose nodes are fixed (benchmarks, the demo, dispatch onto
        simulated clusters); without it, nodes come from :meth:`upsert_node` (the Node informer)."""
        self.cluster = cluster
        self.policy_name = policy if isinstance(policy, str) else policy.name
        self.scheduler = Scheduler(get_policy(policy) if isinstance(policy, str) else policy, seed=seed)
        self.clock = clock
        self.lock = threading.RLock()
        self.nodes: dict[str, Node] = {}
        self.pods: dict[str, PodRecord] = {}
        self._fixed_nodes = state is not None
        self._state = state if state is not None else ClusterState.from_nodes([])
        self._dirty = False
        self.rebuilds = 0
        n = self._state.n_nodes
        # Per-node telemetry not kept in ClusterState (the summary's PUE) and the reports applied.
        self.pue = np.full(n, np.nan)
        self.applied_total = 0
        self.stale_after_s = 10.0

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> ClusterState:
        """The current state (rebuilt first if nodes changed). Read it under :attr:`lock`."""
        with self.lock:
            if self._dirty:
                self._rebuild()
            return self._state

    def _rebuild(self) -> None:
        old, old_pue = self._state, self.pue
        ordered = sorted(self.nodes.values(), key=lambda n: n.name)
        self._state = ClusterState.from_nodes(ordered)
        self._dirty = False
        self.rebuilds += 1
        self.pue = np.full(self._state.n_nodes, np.nan)
        # Telemetry survives a rebuild: copy each kept node's columns by name.
        kept = [(i, old.index[name]) for i, name in enumerate(self._state.names) if name in old.index]
        if kept:
            new_i, old_i = (np.array(c, dtype=np.int64) for c in zip(*kept, strict=True))
            for column in _TELEMETRY_COLUMNS:
                getattr(self._state, column)[new_i] = getattr(old, column)[old_i]
            self.pue[new_i] = old_pue[old_i]
        for record in self.pods.values():
            record.placement = None
            self._account(record)

    def _account(self, record: PodRecord) -> None:
        """Count a recorded pod on its node as it is (over-committed or not)."""
        st = self._state
        i = st.index.get(record.node)
        if i is None:
            return
        r = record.pod.requests
        devices: tuple[int, ...] = ()
        milli = 0
        if r.gpu_milli_total:
            devices = self._devices_for(i, record)
            milli = MILLI_GPU_PER_DEVICE if r.gpu else r.gpu_milli
        placement = Placement(i, devices, milli)
        st.allocate(record.pod, placement, strict=False)
        record.placement = placement

    def _devices_for(self, i: int, record: PodRecord) -> tuple[int, ...]:
        """The recorded devices if valid, otherwise the state's own rule, otherwise the freest devices
        (a pod bound elsewhere that no device can hold still takes what it asked for)."""
        st = self._state
        r = record.pod.requests
        count = int(st.gpu_count[i])
        want = r.gpu if r.gpu else 1
        if record.devices is not None and len(record.devices) == want and all(0 <= d < count for d in record.devices):
            return record.devices
        if count == 0:
            return ()
        try:
            return st.choose_devices(i, record.pod).devices
        except AllocationError:
            order = np.argsort(-st.gpu_free_milli[i, :count], kind="stable")
            return tuple(int(d) for d in order[:min(want, count)])

    def _check_live(self) -> None:
        if self._fixed_nodes:
            raise RuntimeError(f"cluster {self.cluster} is simulated: its nodes are fixed")

    def upsert_node(self, node: Node) -> bool:
        """Record a node; True when it changed what scheduling sees."""
        self._check_live()
        with self.lock:
            if self.nodes.get(node.name) == node:
                return False
            self.nodes[node.name] = node
            self._dirty = True
            return True

    def remove_node(self, name: str) -> bool:
        self._check_live()
        with self.lock:
            if self.nodes.pop(name, None) is None:
                return False
            self._dirty = True
            return True

    def replace_nodes(self, nodes: Iterable[Node]) -> None:
        self._check_live()
        with self.lock:
            fresh = {n.name: n for n in nodes}
            if fresh != self.nodes:
                self.nodes = fresh
                self._dirty = True

    # ------------------------------------------------------------------ pods
    def observe_bound(self, uid: str, pod: Pod, node: str, devices: tuple[int, ...] | None = None) -> None:
        """A pod is bound to ``node`` (seen by the informer, or by the simulated binder): count it there.
        An assumption for the same pod on the same node becomes the bound record without a recount."""
        with self.lock:
            record = self.pods.get(uid)
            if record is not None:
                if record.node == node and (devices is None or record.devices == devices or record.assumed):
                    record.assumed = False
                    return
                self._uncount(record)
            record = PodRecord(uid=uid, pod=pod, node=node, devices=devices, assumed=False)
            self.pods[uid] = record
            if not self._dirty:
                self._account(record)

    def _uncount(self, record: PodRecord) -> None:
        if record.placement is not None and not self._dirty:
            self._state.release(record.pod, record.placement)
        record.placement = None

    def remove_pod(self, uid: str) -> bool:
        """A pod was deleted or finished: its resources are free again."""
        with self.lock:
            record = self.pods.pop(uid, None)
            if record is None:
                return False
            self._uncount(record)
            return True

    def replace_bound(self, bound: Mapping[str, tuple[Pod, str, tuple[int, ...] | None]]) -> None:
        """After a relist: exactly these pods are bound (assumptions in flight are kept)."""
        with self.lock:
            for uid in [u for u, r in self.pods.items() if not r.assumed and u not in bound]:
                self.remove_pod(uid)
            for uid, (pod, node, devices) in bound.items():
                self.observe_bound(uid, pod, node, devices)

    def bound(self, uid: str) -> None:
        """The binding of an assumed pod was made. It stays assumed until the informer shows it bound
        (:meth:`observe_bound`), so a relist read before the binding cannot drop it. No lock: one dict
        read and one attribute write, each atomic, and no allocation changes; binding threads must not
        queue behind a decision for it."""
        record = self.pods.get(uid)
        if record is not None:
            record.binding_made = True

    def forget(self, uid: str) -> None:
        """The binding of an assumed pod failed: give its resources back."""
        with self.lock:
            record = self.pods.get(uid)
            if record is not None and record.assumed and not record.binding_made:
                self.remove_pod(uid)

    def is_known(self, uid: str) -> bool:
        return uid in self.pods  # one atomic dict lookup: no lock, as bound()

    # ------------------------------------------------------------------ decisions
    def decide(self, uid: str, pod: Pod) -> Decision:
        """Filter, score and select a node for ``pod``; on success the pod is assumed there."""
        with self.lock:
            state = self.state
            decision = self.scheduler.schedule(state, pod)
            if decision.placement is None:
                return decision
            state.allocate(pod, decision.placement)
            self.pods[uid] = PodRecord(uid=uid, pod=pod, node=state.names[decision.placement.node],
                                       devices=decision.placement.devices or None, assumed=True,
                                       placement=decision.placement)
            return decision

    def node_name(self, decision: Decision) -> str:
        assert decision.placement is not None
        return self._state.names[decision.placement.node]

    def failure_message(self, pod: Pod, decision: Decision) -> str:
        with self.lock:
            return kube_style_diagnosis(self.state, pod, decision.diagnosis)

    def evaluate(self, pod: Pod, node_names: Sequence[str]) -> NodeEvaluation:
        """Filter and score ``node_names`` for ``pod`` without deciding (the scheduler extender)."""
        out = NodeEvaluation()
        with self.lock:
            state = self.state
            idx = []
            for name in node_names:
                i = state.index.get(name)
                if i is None:
                    out.rejected[name] = "node unknown to Meridian (not in its node informer yet)"
                else:
                    idx.append(i)
            if not idx:
                return out
            mask, diagnosis = run_filters(state, pod)
            candidates = np.asarray(idx, dtype=np.int64)
            ok = mask[candidates]
            reasons = node_reasons(state, pod, diagnosis, candidates[~ok])
            for i, reason in zip(candidates[~ok].tolist(), reasons, strict=True):
                out.rejected[state.names[i]] = reason
            feasible = candidates[ok]
            if feasible.size:
                scores = self.scheduler.policy.score(state, pod, feasible).scores
                for i, s in zip(feasible.tolist(), np.asarray(scores, dtype=float).tolist(), strict=True):
                    out.scores[state.names[i]] = s
        return out

    # ------------------------------------------------------------------ telemetry
    def apply_telemetry(self, batch: TelemetryBatch, rows: np.ndarray) -> int:
        """Measured usage, power, energy and carbon of node-agent reports (the rows a
        :class:`~regional_scheduler.telemetry_state.TelemetryConsumer` applied: fresh, newest per node)
        onto the nodes this state knows; returns how many landed. Allocation stays the informers':
        a report's view of requests can lag a binding."""
        rows = np.asarray(rows, dtype=np.int64)
        if rows.size == 0:
            return 0
        now = self.clock()
        with self.lock:
            st = self.state
            idx = np.fromiter((st.index.get(batch.node[r], -1) for r in rows.tolist()), dtype=np.int64,
                              count=rows.size)
            known = idx >= 0
            nodes, rows = idx[known], rows[known]
            self.pue[nodes] = assign_measurements(st, batch, rows, nodes, now)
            self.applied_total += int(nodes.size)
            return int(nodes.size)

    @property
    def stale(self) -> np.ndarray:
        """Nodes whose agent reported once and then fell silent for ``stale_after_s`` (the summary's
        count; Kubernetes' own Ready condition and taints decide schedulability)."""
        st = self.state
        seen = ~np.isnan(st.last_seen_s)
        return seen & (self.clock() - np.where(seen, st.last_seen_s, 0.0) > self.stale_after_s)

    # ------------------------------------------------------------------ views
    def counts(self) -> dict[str, int]:
        with self.lock:
            assumed = sum(1 for r in self.pods.values() if r.assumed)
            return {"nodes": len(self.nodes), "pods": len(self.pods) - assumed, "assumed": assumed}


# ---------------------------------------------------------------------- diagnosis in kube-scheduler's words

_TELEMETRY_COLUMNS = ("used_milli_cpu", "used_memory_bytes", "power_watts", "energy_joules", "carbon_g_per_kwh",
                      "last_seen_s", "last_seq")

_FILTER_REASON = {
    "NodeUnschedulable": "node(s) were unschedulable",
    "NodeSelector": "node(s) didn't match Pod's node affinity/selector",
    "NodeAffinity": "node(s) didn't match Pod's node affinity/selector",
    "GpuModel": "node(s) didn't have an allowed GPU model",
}


def _resource_reasons(state: ClusterState, pod: Pod, nodes: np.ndarray) -> list[list[str]]:
    """For each node, every resource it is short of (kube-scheduler's ``Insufficient <name>``)."""
    r = pod.requests
    short: list[tuple[str, np.ndarray]] = [
        ("Insufficient cpu", state.free_milli_cpu[nodes] < r.milli_cpu),
        ("Insufficient memory", state.free_memory_bytes[nodes] < r.memory_bytes),
    ]
    if r.gpu:
        short.append((f"Insufficient {ko.GPU_RESOURCE}", state.gpu_full_free[nodes] < r.gpu))
    elif r.gpu_milli:
        short.append((f"Insufficient {ko.GPU_SHARE_RESOURCE}", state.gpu_max_free_milli[nodes] < r.gpu_milli))
    for name, amount in pod.scalar_requests.items():
        j = state.scalar_index.get(name)
        free = (state.alloc_scalar[nodes, j] - state.req_scalar[nodes, j]) if j is not None else np.zeros(nodes.size)
        short.append(("Too many pods" if name == ko.PODS_RESOURCE else f"Insufficient {name}", free < amount))
    return [[label for label, mask in short if mask[k]] for k in range(nodes.size)]


def _untolerated(state: ClusterState, pod: Pod, node: int) -> str:
    for taint in state.group_taints[state.constraint_group[node]]:
        if taint.effect in (TaintEffect.NO_SCHEDULE, TaintEffect.NO_EXECUTE) and \
                not any(t.tolerates(taint) for t in pod.tolerations):
            if taint == ko.UNSCHEDULABLE_TAINT:  # a cordoned node, in kube-scheduler's NodeUnschedulable words
                return "node(s) were unschedulable"
            return f"node(s) had untolerated taint {{{taint.key}: {taint.value}}}"
    return "node(s) had untolerated taint"


def node_reasons(state: ClusterState, pod: Pod, diagnosis: Diagnosis, nodes: np.ndarray) -> list[str]:
    """Why each of ``nodes`` was rejected, in kube-scheduler's words (first failing filter). The
    first failure is found for all nodes at once; resource shortfalls are computed in one pass over
    the nodes that failed on resources, taint messages once per constraint group."""
    names = [name for name, _ in diagnosis.verdicts]
    ok = np.stack([verdict[nodes] for _, verdict in diagnosis.verdicts]) if names else np.ones((0, nodes.size))
    first = np.argmin(ok, axis=0) if names else np.zeros(nodes.size, dtype=np.int64)
    failed = ~ok.all(axis=0) if names else np.zeros(nodes.size, dtype=bool)
    out = ["rejected"] * nodes.size
    for f, name in enumerate(names):
        where = np.flatnonzero(failed & (first == f))
        if where.size == 0:
            continue
        if name == "NodeResourcesFit":
            for k, reasons in zip(where.tolist(), _resource_reasons(state, pod, nodes[where]), strict=True):
                out[k] = ", ".join(reasons) or "Insufficient resources"
        elif name == "TaintToleration":
            by_group: dict[int, str] = {}
            for k in where.tolist():
                g = int(state.constraint_group[nodes[k]])
                if g not in by_group:
                    by_group[g] = _untolerated(state, pod, int(nodes[k]))
                out[k] = by_group[g]
        else:
            reason = _FILTER_REASON.get(name, name)
            for k in where.tolist():
                out[k] = reason
    return out


def kube_style_diagnosis(state: ClusterState, pod: Pod, diagnosis: Diagnosis | None) -> str:
    """``0/1000 nodes are available: 12 Insufficient cpu, 988 node(s) had untolerated taint {…}.`` —
    kube-scheduler's ``FitError`` message: each node is charged to the first filter that rejected it,
    a node short of several resources counts once per resource, and the reasons are sorted as strings."""
    n = state.n_nodes
    if diagnosis is None or n == 0:
        return f"0/{n} nodes are available: no nodes registered."
    histogram: Counter[str] = Counter()
    remaining = np.ones(n, dtype=bool)
    for name, ok in diagnosis.verdicts:
        rejected = np.flatnonzero(remaining & ~ok)
        remaining &= ok
        if rejected.size == 0:
            continue
        if name == "NodeResourcesFit":
            for reasons in _resource_reasons(state, pod, rejected):
                histogram.update(reasons)
        elif name == "TaintToleration":  # one verdict per constraint group, counted over its nodes
            groups = np.bincount(state.constraint_group[rejected], minlength=len(state.group_taints))
            for g in np.flatnonzero(groups).tolist():
                first = rejected[state.constraint_group[rejected] == g][0]
                histogram[_untolerated(state, pod, int(first))] += int(groups[g])
        else:
            histogram[_FILTER_REASON.get(name, name)] += int(rejected.size)
    parts = sorted(f"{count} {reason}" for reason, count in histogram.items())
    return f"0/{n} nodes are available: {', '.join(parts)}."

