"""``meridian bench kubernetes``: the stock kube-scheduler and Meridian on one real API server, in turn.

The question: on a real control plane, how fast does each scheduler bind a backlog of pending pods,
and are its bindings ones a node could really hold? Placement benchmarks in the simulator
(``meridian bench placement``) cannot answer it: there the binding path, the informers, the client's
rate limits and the process's CPU are not in the loop.

The run, for one mix of Nodes and pods (``synthetic``: identical CPU nodes for throughput;
``seed-50x200``: the simulator's seed cluster and pods; ``openb``: the Alibaba GPU nodes and pods):

1. start the test control plane (:mod:`meridian.envtest`: etcd + kube-apiserver, no kubelet) or use
   the cluster ``MERIDIAN_TEST_KUBECONFIG`` names, and create the Nodes once;
2. for each scheduler **in turn**, with the same client QPS and burst: a fresh namespace (and its
   ``default`` ServiceAccount, which pod admission requires and only kube-controller-manager would
   otherwise create); a watch on its pods, opened *before* the backlog so that no event is missed; the
   whole backlog created as fast as the API server takes it, *before* the scheduler starts; the
   scheduler as a subprocess (kube-scheduler through :meth:`ControlPlane.start_kube_scheduler`, Meridian
   as ``meridian regional-scheduler``); wait until every pod is bound or the scheduler stops making
   progress; read its CPU time; stop it; read every Node and Pod back; delete the pods with grace period
   0 (without a kubelet a graceful deletion of a bound pod never completes) and wait until they are
   gone, so the next scheduler starts on empty Nodes.

What is measured never comes from a scheduler: binding times from our own watch (client clock:
the creation's acknowledgement to the first event showing ``spec.nodeName``), feasibility from an
independent read-back (:func:`check_bindings`), CPU from the process (psutil), reasons from the
``FailedScheduling`` Events.

Hazards: the harness shares the machine with the API server, etcd and the scheduler, so it keeps its
own work small (raw JSON, no client models); pods created before the scheduler starts include its
start-up in their latency (``first_binding_s`` says how much); on a cluster that has other Nodes the
pods select the benchmark's Nodes by label, and kube-scheduler runs under its own profile name so that
the cluster's own scheduler leaves the pods alone.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import re
import secrets
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import psutil
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from pydantic import BaseModel, Field

from meridian import __version__ as meridian_version
from meridian import envtest, quantity
from meridian.envtest import ControlPlane, NodeSpec, discard_reply
from meridian.model import MILLI_GPU_PER_DEVICE, Node, Pod
from meridian.simulator import seed_cluster, seed_pods
from meridian.traces import TraceFormatError, openb
from regional_scheduler import kube_objects as ko
from regional_scheduler.informer import Informer

MIXES = ("synthetic", "seed-50x200", "openb")
Mix = Literal["synthetic", "seed-50x200", "openb"]
KUBE_SCHEDULER = "kube-scheduler"
MERIDIAN_PREFIX = "meridian-"
RUN_LABEL = "meridian.io/bench-run"
SYNTHETIC_NODE_CPU = "32"
SYNTHETIC_NODE_MEMORY = "128Gi"
NODE_PODS = "110"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
NO_MESSAGE = "(no FailedScheduling event)"

# Default sizes per mix: (nodes, pods). None = everything the source has.
MIX_DEFAULTS: dict[str, tuple[int | None, int | None]] = {
    "synthetic": (1000, 5000),
    "seed-50x200": (50, 200),
    "openb": (None, None),
}


class BenchError(RuntimeError):
    """The benchmark cannot go on; the message says what to do."""


class SchedulerDiedError(BenchError):
    """A scheduler subprocess exited during its run; the message carries its log tail."""


# ------------------------------------------------------------------------------------------ settings


class BenchKubernetesSettings(BaseModel):
    """What one ``meridian bench kubernetes`` run does."""

    mix: Mix = Field("synthetic", description="Nodes and pods: synthetic (N identical 32-CPU/128Gi nodes, the "
                     "seed mix's pod shapes: every pod fits, so it measures throughput), seed-50x200 (the "
                     "simulator's 50 × 8-CPU nodes and 200 pods: CPU packing) or openb (the Alibaba GPU "
                     "nodes and pods: GPU shares, device by device).")
    nodes: int | None = Field(None, ge=1, description="Nodes to create; default per mix (synthetic 1000, "
                              "seed-50x200 50, openb all 1,213); openb takes the first N of its list.")
    pods: int | None = Field(None, ge=1, description="Pods in the backlog; default per mix (synthetic 5000, "
                             "seed-50x200 200, openb the whole default pod list, 8,152); openb takes the first N.")
    seed: int = Field(0, ge=0, description="Seed of the generated pod shapes (synthetic, seed-50x200).")
    qps: float = Field(50.0, gt=0, description="Client QPS of every scheduler (kube-scheduler's "
                       "clientConnection.qps and Meridian's --kube-api-qps): kube-scheduler's default.")
    burst: int = Field(100, ge=1, description="Client burst of every scheduler: kube-scheduler's default.")
    schedulers: list[str] = Field(default_factory=lambda: [KUBE_SCHEDULER, "meridian-fgd"],
                                  description="Run in this order: kube-scheduler, or meridian-<policy> for any "
                                  "policy of regional_scheduler.policies.registry.")
    timeout_s: float = Field(1800.0, gt=0, description="Longest a scheduler may take over its backlog; at 50 "
                             "bindings/s 5,000 pods take 100 s, so this leaves room for a slow one.")
    idle_s: float = Field(15.0, gt=0, description="A scheduler that bound nothing new for this long, once it "
                          "has bound a pod, has stopped making progress.")
    settle_s: float = Field(2.0, ge=0, description="Once every pod is bound or reported unschedulable, wait "
                            "this long without change before stopping the scheduler.")
    start_timeout_s: float = Field(180.0, gt=0, description="A scheduler that binds nothing and reports "
                                   "nothing for this long after its start is stuck (Meridian's Python start "
                                   "takes ~6 s on 2 cores; listing a large backlog takes longer).")
    create_workers: int = Field(32, ge=1, le=256, description="Threads creating Nodes and the backlog: the API "
                                "server, not the client, should set the pace.")


def parse_schedulers(text: str) -> list[str]:
    """``kube-scheduler,meridian-fgd`` → names, each checked against the policy registry."""
    from regional_scheduler.policies.registry import REGISTRY

    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ValueError("no scheduler named")
    for name in names:
        if name == KUBE_SCHEDULER:
            continue
        if not name.startswith(MERIDIAN_PREFIX) or name[len(MERIDIAN_PREFIX):] not in REGISTRY:
            raise ValueError(f"unknown scheduler {name!r}: use {KUBE_SCHEDULER} or meridian-<policy> with a "
                             f"policy of {', '.join(REGISTRY)}")
    if len(set(names)) != len(names):
        raise ValueError(f"a scheduler is named twice in {text!r}")
    return names


# ------------------------------------------------------------------------------------------ results


class MachineInfo(BaseModel):
    cpus: int | None = Field(description="Logical CPUs of the machine every process shares.")
    physical_cpus: int | None = None
    cpu_model: str = ""
    memory_gib: float
    platform: str


class RunSettings(BaseModel):
    """The settings as run, with what they resolved to and where."""

    mix: str
    nodes: int
    pods: int
    seed: int
    qps: float
    burst: int
    schedulers: list[str]
    timeout_s: float
    idle_s: float
    api_server: str = Field(description="local (meridian.envtest) or external (MERIDIAN_TEST_KUBECONFIG)")
    pods_select_bench_nodes: bool = Field(description="The cluster had other Nodes, so pods carry a "
                                          "nodeSelector on the benchmark's run label.")
    gpus: int = Field(description="GPU devices over all Nodes.")
    machine: MachineInfo
    versions: dict[str, str]


class SchedulerResult(BaseModel):
    """One scheduler's run over the backlog. Times are client times of the benchmark's own watch."""

    scheduler: str
    pod_scheduler_name: str = Field(description="spec.schedulerName of its pods")
    namespace: str
    pods: int
    bound: int = Field(description="Pods bound at the end (read back from the API server).")
    unschedulable: int = Field(description="Pods left unbound at the end.")
    unschedulable_reasons: dict[str, int] = Field(description="Unbound pods per reason of their last "
                                                  "FailedScheduling event (a pod can count under several).")
    failed_scheduling_reports: int = Field(description="FailedScheduling Events in the namespace with their "
                                           "repeat counts: the failed attempts the scheduler reported (each "
                                           "costs API requests, under the same client QPS as its bindings).")
    infeasible_bindings: int = Field(description="Bound pods that their node cannot hold, checked device by "
                                     "device for GPUs on the read-back Nodes and Pods.")
    infeasible_reasons: dict[str, int]
    pods_per_s: float | None = Field(description="Bound pods / (last binding − first binding).")
    p50_ms: float | None = Field(description="Median of creation acknowledged → binding seen, over bound pods.")
    p99_ms: float | None
    first_binding_s: float | None = Field(description="Scheduler start → first binding seen (its start-up and "
                                          "initial list of the backlog).")
    binding_span_s: float | None = Field(description="First → last binding seen.")
    cpu_s: float | None = Field(description="The scheduler process's user + system CPU seconds, start to stop.")
    cpu_s_per_pod: float | None = Field(description="cpu_s / bound.")
    cpu_s_after_first_binding: float | None = Field(description="CPU seconds from the first binding seen to "
                                                    "the end: the scheduling work without start-up.")
    cpu_ms_per_pod_after_first_binding: float | None
    apiserver_cpu_s: float | None = Field(description="kube-apiserver's CPU seconds over the same interval "
                                          "(a local control plane only).")
    etcd_cpu_s: float | None = Field(description="etcd's CPU seconds over the same interval (local only).")
    harness_cpu_s: float = Field(description="This benchmark's own CPU seconds over the interval (its watch).")
    foreign_cpu_s: float = Field(description="CPU seconds the rest of the machine used over the interval: "
                                 "busy time minus the scheduler, the control plane and the harness. Well above "
                                 "zero means the machine was shared and the figures are noisy.")
    gpu_allocated_ratio: float | None = Field(description="GPU milli of feasible placements / GPU milli of all "
                                              "Nodes (null without GPUs).")
    cpu_allocated_ratio: float = Field(description="CPU requests of feasible placements / allocatable CPU.")
    stopped: str = Field(description="all-bound, rest-unschedulable, no-progress or timeout")
    backlog_create_s: float = Field(description="Time to create the backlog (before the scheduler started).")
    wall_s: float = Field(description="Scheduler start → stop.")
    log: str = Field(description="The scheduler's log file (removed with a local control plane).")


class BenchKubernetesReport(BaseModel):
    settings: RunSettings
    schedulers: dict[str, SchedulerResult]


# ------------------------------------------------------------------------------------------ workload


@dataclass(frozen=True)
class PodShape:
    """What a backlog pod requests: whole GPUs (``gpus``) or a share of one (``gpu_milli``)."""

    cpu_milli: int
    memory_bytes: int
    gpus: int = 0
    gpu_milli: int = 0
    gpu_models: tuple[str, ...] = ()


@dataclass(frozen=True)
class Workload:
    mix: str
    nodes: list[NodeSpec]
    pods: list[PodShape]

    @property
    def gpus(self) -> int:
        return sum(int(n["capacity"].get(ko.GPU_RESOURCE, 0)) for n in self.nodes)


def node_spec(node: Node) -> NodeSpec:
    """A Node of Meridian's model as a NodeSpec: whole GPUs as ``nvidia.com/gpu``, the same devices as
    shares (``meridian.io/gpu-milli`` = 1000 × GPUs, a sharing device plugin's advertisement) and the
    model as NVIDIA GPU Feature Discovery's label."""
    res = node.allocatable_resources
    capacity: dict[str, str | int] = {"cpu": f"{res.milli_cpu}m", "memory": str(res.memory_bytes), "pods": NODE_PODS}
    labels: dict[str, str] = {}
    if res.gpu:
        capacity[ko.GPU_RESOURCE] = str(res.gpu)
        capacity[ko.GPU_SHARE_RESOURCE] = str(res.gpu * MILLI_GPU_PER_DEVICE)
        if node.gpu_model:
            labels[ko.GPU_MODEL_LABEL] = node.gpu_model
    return NodeSpec(name=node.name.lower(), capacity=capacity, labels=labels)


def pod_shape(pod: Pod) -> PodShape:
    r = pod.requests
    return PodShape(cpu_milli=r.milli_cpu, memory_bytes=r.memory_bytes, gpus=r.gpu, gpu_milli=r.gpu_milli,
                    gpu_models=pod.allowed_gpu_models)


def build_workload(mix: str, *, nodes: int | None = None, pods: int | None = None, seed: int = 0) -> Workload:
    """The Nodes and the backlog of a mix, from the project's loaders."""
    default_nodes, default_pods = MIX_DEFAULTS[mix]
    n_nodes, n_pods = nodes or default_nodes, pods or default_pods
    if mix == "synthetic":
        assert n_nodes is not None and n_pods is not None
        specs = [NodeSpec(name=f"bench-node-{i:05d}",
                          capacity={"cpu": SYNTHETIC_NODE_CPU, "memory": SYNTHETIC_NODE_MEMORY, "pods": NODE_PODS})
                 for i in range(n_nodes)]
        return Workload(mix, specs, [pod_shape(p) for p in seed_pods(seed, n_pods)])
    if mix == "seed-50x200":
        assert n_nodes is not None and n_pods is not None
        return Workload(mix, [node_spec(n) for n in seed_cluster(n_nodes)],
                        [pod_shape(p) for p in seed_pods(seed, n_pods)])
    if mix == "openb":
        directory = openb.openb_dir()
        try:
            node_list = openb.load_nodes()
            pod_list = openb.load_pods(directory / "openb_pod_list_default.csv")
        except FileNotFoundError as exc:
            raise BenchError(f"the openb trace is missing ({exc.filename}): put the Alibaba "
                             f"alibaba-gpu-v2023 files under {directory} (see shared/traces/README.md) or "
                             "choose --mix synthetic") from None
        except TraceFormatError as exc:
            raise BenchError(str(exc)) from None
        return Workload(mix, [node_spec(n) for n in node_list[:n_nodes]],
                        [pod_shape(p) for p in pod_list[:n_pods]])
    raise ValueError(f"unknown mix {mix!r}; choose {', '.join(MIXES)}")


def pod_body(name: str, shape: PodShape, *, scheduler_name: str, run_id: str,
             node_selector: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A pending pod: one container; extended resources (GPUs, GPU shares) set as limits too, which the
    API server requires for resources that cannot be overcommitted."""
    requests: dict[str, str] = {"cpu": f"{shape.cpu_milli}m", "memory": str(shape.memory_bytes)}
    limits: dict[str, str] = {}
    if shape.gpus:
        requests[ko.GPU_RESOURCE] = limits[ko.GPU_RESOURCE] = str(shape.gpus)
    if shape.gpu_milli:
        requests[ko.GPU_SHARE_RESOURCE] = limits[ko.GPU_SHARE_RESOURCE] = str(shape.gpu_milli)
    resources: dict[str, Any] = {"requests": requests}
    if limits:
        resources["limits"] = limits
    spec: dict[str, Any] = {
        "schedulerName": scheduler_name,
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [{"name": "main", "image": PAUSE_IMAGE, "resources": resources}],
    }
    if node_selector:
        spec["nodeSelector"] = dict(node_selector)
    if shape.gpu_models:
        spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": ko.GPU_MODEL_LABEL, "operator": "In", "values": list(shape.gpu_models)}]}]}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {RUN_LABEL: run_id}},
            "spec": spec}


# ------------------------------------------------------------------------- feasibility (read-back)


@dataclass(frozen=True)
class InfeasibleBinding:
    pod: str
    node: str
    reasons: tuple[str, ...]


@dataclass
class FeasibilityReport:
    """What the read-back Nodes can really hold of the bindings on them."""

    bound: int = 0
    infeasible: list[InfeasibleBinding] = field(default_factory=list)
    gpu_milli_allocated: int = 0  # feasible placements only
    gpu_milli_total: int = 0
    cpu_milli_allocated: int = 0  # feasible placements only
    cpu_milli_total: int = 0

    @property
    def reasons(self) -> dict[str, int]:
        counts: Counter[str] = Counter()
        for bad in self.infeasible:
            counts.update(bad.reasons)
        return dict(counts.most_common())

    @property
    def gpu_allocated_ratio(self) -> float | None:
        return self.gpu_milli_allocated / self.gpu_milli_total if self.gpu_milli_total else None

    @property
    def cpu_allocated_ratio(self) -> float:
        return self.cpu_milli_allocated / self.cpu_milli_total if self.cpu_milli_total else 0.0


_GPU_RESOURCES = (ko.GPU_RESOURCE, ko.GPU_SHARE_RESOURCE)


def _amounts(resources: Mapping[str, Any] | None) -> dict[str, int]:
    """A quantity map in integer units (milli-CPU, bytes, counts), Kubernetes' rounding."""
    return {name: quantity.to_milli(value, field=name) if name == "cpu" else quantity.to_int(value, field=name)
            for name, value in (resources or {}).items()}


def _requirement_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), list(expr.get("values") or [])
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    if op in ("Gt", "Lt") and key in labels and len(values) == 1:
        try:
            label, bound = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return label > bound if op == "Gt" else label < bound
    return False


def _placement_violations(spec: Mapping[str, Any], node: Mapping[str, Any]) -> list[str]:
    """nodeSelector, required node affinity and NoSchedule/NoExecute taints, as kube-scheduler's filters."""
    labels = (node.get("metadata") or {}).get("labels") or {}
    out = []
    selector = spec.get("nodeSelector") or {}
    terms = ((((spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    if any(labels.get(k) != v for k, v in selector.items()) or (terms and not any(
            all(_requirement_matches(e, labels) for e in t.get("matchExpressions") or []) for t in terms)):
        out.append("node(s) didn't match Pod's node affinity/selector")
    tolerations = spec.get("tolerations") or []

    def tolerated(taint: Mapping[str, Any]) -> bool:
        for t in tolerations:
            if t.get("effect") and t.get("effect") != taint.get("effect"):
                continue
            if t.get("operator") == "Exists":
                if not t.get("key") or t.get("key") == taint.get("key"):
                    return True
            elif t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
                return True
        return False

    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(taint):
            out.append(f"node(s) had untolerated taint {{{taint.get('key')}: {taint.get('value') or ''}}}")
    if (node.get("spec") or {}).get("unschedulable"):
        out.append("node(s) were unschedulable")
    return out


def _exact_share_packing(items: Sequence[int], free: Sequence[int], budget: int = 200_000) -> bool:
    """Whether every share in ``items`` fits onto devices with ``free`` milli each (depth-first, largest
    share first, devices with equal room tried once). Gives up (False) after ``budget`` steps."""
    order = sorted(items, reverse=True)
    room = list(free)
    steps = 0

    def place(k: int) -> bool:
        nonlocal steps
        if k == len(order):
            return True
        steps += 1
        if steps > budget:
            return False
        tried: set[int] = set()
        for d in range(len(room)):
            if room[d] >= order[k] and room[d] not in tried:
                tried.add(room[d])
                room[d] -= order[k]
                if place(k + 1):
                    return True
                room[d] += order[k]
        return False

    return place(0)


def _gpu_feasibility(pods: Sequence[tuple[str, dict[str, int], str | None]], devices: int) -> dict[str, str]:
    """Device-by-device GPU check of one node's pods ``(key, requests, devices annotation)`` in binding
    order; returns the infeasible ones with a reason.

    Pods with Meridian's annotation are checked exactly where it says (whole-GPU pods need that many
    distinct, whole-free devices; a share needs room on its one device). The rest are placed as any
    device plugin could: whole-GPU pods onto whole-free devices, then shares first-fit decreasing onto
    what is left; when first-fit leaves shares over, an exhaustive search gets the last word.
    """
    room = [MILLI_GPU_PER_DEVICE] * devices
    bad: dict[str, str] = {}
    free_shares: list[tuple[str, int]] = []
    whole_free: list[tuple[str, int]] = []
    for key, req, annotation in pods:
        gpus, share = req.get(ko.GPU_RESOURCE, 0), req.get(ko.GPU_SHARE_RESOURCE, 0)
        if not gpus and not share:
            continue
        if gpus and share:
            bad[key] = "pod asks for whole GPUs and a GPU share"
            continue
        if share > MILLI_GPU_PER_DEVICE:
            bad[key] = f"GPU share {share} larger than one device"
            continue
        if annotation is None:
            (whole_free if gpus else free_shares).append((key, gpus or share))
            continue
        try:
            slots = [int(d) for d in annotation.split(",")]
        except ValueError:
            bad[key] = f"unreadable {ko.GPU_DEVICES_ANNOTATION} {annotation!r}"
            continue
        want = gpus or 1
        if len(slots) != want or len(set(slots)) != want or not all(0 <= d < devices for d in slots):
            bad[key] = f"{ko.GPU_DEVICES_ANNOTATION} {annotation!r} does not name {want} device(s) of {devices}"
            continue
        need = MILLI_GPU_PER_DEVICE if gpus else share
        if any(room[d] < need for d in slots):
            bad[key] = "annotated GPU device(s) over-committed"
            continue
        for d in slots:
            room[d] -= need
    for key, gpus in whole_free:
        whole = [d for d in range(devices) if room[d] == MILLI_GPU_PER_DEVICE][:gpus]
        if len(whole) < gpus:
            bad[key] = "Insufficient whole GPU devices"
            continue
        for d in whole:
            room[d] = 0
    before_shares = list(room)
    left: list[tuple[str, int]] = []
    for key, share in sorted(free_shares, key=lambda p: -p[1]):  # stable: binding order among equal shares
        d = next((d for d in range(devices) if room[d] >= share), None)
        if d is None:
            left.append((key, share))
        else:
            room[d] -= share
    if left and not _exact_share_packing([s for _, s in free_shares], before_shares):
        for key, _ in left:
            bad[key] = "no GPU device can hold the share"
    return bad


def check_bindings(nodes: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], *,
                   bound_order: Mapping[str, float] | None = None) -> FeasibilityReport:
    """Which bound pods their Node can really hold, from Node and Pod objects as the API server returns
    them — never from a scheduler's own state.

    Per Node, in binding order (``bound_order``: pod key → time; else by name): node selector, required
    node affinity and taints; the summed requests of every resource other than GPUs (cpu, memory,
    ephemeral-storage, ``pods``, extended resources) against allocatable, a pod that would exceed it
    being the infeasible one; GPUs device by device (:func:`_gpu_feasibility`). kube-scheduler counts
    ``meridian.io/gpu-milli`` as one pool per node, so a share it binds may fit the pool and no device:
    that binding is infeasible here. Pods bound to an unknown Node are infeasible.
    """
    report = FeasibilityReport()
    by_name: dict[str, Mapping[str, Any]] = {}
    allocatable: dict[str, dict[str, int]] = {}
    for node in nodes:
        name = (node.get("metadata") or {}).get("name", "")
        status = node.get("status") or {}
        alloc = _amounts(status.get("allocatable") or status.get("capacity"))
        by_name[name], allocatable[name] = node, alloc
        devices = max(alloc.get(ko.GPU_RESOURCE, 0), alloc.get(ko.GPU_SHARE_RESOURCE, 0) // MILLI_GPU_PER_DEVICE)
        report.gpu_milli_total += devices * MILLI_GPU_PER_DEVICE
        report.cpu_milli_total += alloc.get("cpu", 0)
    on_node: dict[str, list[tuple[str, Mapping[str, Any], dict[str, int]]]] = defaultdict(list)
    order = bound_order or {}
    for pod in pods:
        spec = pod.get("spec") or {}
        node = spec.get("nodeName")
        if not node:
            continue
        report.bound += 1
        key = ko.pod_key(pod)
        if node not in by_name:
            report.infeasible.append(InfeasibleBinding(key, node, ("bound to a Node that does not exist",)))
            continue
        requests = ko.effective_requests(spec)
        requests[ko.PODS_RESOURCE] = requests.get(ko.PODS_RESOURCE, 0) + 1
        on_node[node].append((key, pod, requests))
    for node, bound in on_node.items():
        bound.sort(key=lambda entry: (order.get(entry[0], float("inf")), entry[0]))
        alloc = allocatable[node]
        devices = max(alloc.get(ko.GPU_RESOURCE, 0), alloc.get(ko.GPU_SHARE_RESOURCE, 0) // MILLI_GPU_PER_DEVICE)
        gpu_bad = _gpu_feasibility([(key, req, ((pod.get("metadata") or {}).get("annotations") or {}).get(
            ko.GPU_DEVICES_ANNOTATION)) for key, pod, req in bound], devices)
        used: Counter[str] = Counter()
        for key, pod, req in bound:
            reasons = _placement_violations(pod.get("spec") or {}, by_name[node])
            short = [r for r, v in req.items() if v and r not in _GPU_RESOURCES and used[r] + v > alloc.get(r, 0)]
            reasons += [f"Insufficient {r}" for r in sorted(short)]
            if key in gpu_bad:
                reasons.append(gpu_bad[key])
            if reasons:
                report.infeasible.append(InfeasibleBinding(key, node, tuple(reasons)))
                continue
            used.update({r: v for r, v in req.items() if r not in _GPU_RESOURCES})
            report.cpu_milli_allocated += req.get("cpu", 0)
            report.gpu_milli_allocated += (req.get(ko.GPU_RESOURCE, 0) * MILLI_GPU_PER_DEVICE
                                           + req.get(ko.GPU_SHARE_RESOURCE, 0))
    return report


_AVAILABLE = re.compile(r"nodes are available: (.*?)(?:\.\s|\.$|$)")
_COUNT = re.compile(r"^\d+\s+")


def failure_reasons(message: str) -> list[str]:
    """``0/50 nodes are available: 3 Insufficient cpu, 47 Insufficient memory. preemption: …`` →
    ``["Insufficient cpu", "Insufficient memory"]`` (kube-scheduler's FitError, which Meridian copies)."""
    match = _AVAILABLE.search(message)
    if not match:
        return [message.strip()[:160] or NO_MESSAGE]
    parts = [_COUNT.sub("", p.strip()) for p in match.group(1).split(", ") if p.strip()]
    return parts or [message.strip()[:160]]


# ------------------------------------------------------------------------------------ measurement


class PodWatch:
    """Our own watch on one namespace's pods: when each pod was first seen bound, and which pods a
    scheduler reported unschedulable (``PodScheduled=False``). Opened from the resourceVersion of a
    list taken before the backlog exists, so no event is missed however late the stream connects."""

    def __init__(self, api: k8s.ApiClient, namespace: str) -> None:
        self.core = k8s.CoreV1Api(api)
        self.namespace = namespace
        self.lock = threading.Lock()
        self.created_at: dict[str, float] = {}
        self.bound_at: dict[str, float] = {}
        self.unschedulable: set[str] = set()
        self.last_change = time.monotonic()
        self.last_binding: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # The same list-and-watch as the scheduler's informers (resume, bookmarks, 410 relist), with
        # state of its own: what the benchmark reports never comes from a scheduler's view.
        self._informer = Informer(name=f"bench-{namespace}",
                                  list_fn=lambda **kw: self.core.list_namespaced_pod(namespace, **kw),
                                  handler=self, watch_timeout_s=60)

    def start(self) -> PodWatch:
        self._informer.list()  # before the backlog exists: the watch starts from this version
        self._thread = threading.Thread(target=self._informer.run, args=(self._stop,),
                                        name=f"bench-watch-{self.namespace}", daemon=True)
        self._thread.start()
        return self

    # the informer's handler (regional_scheduler.informer.InformerHandler)
    def relisted(self, items: list[dict[str, Any]]) -> None:
        for obj in items:
            self._observe(obj)

    def event(self, kind: str, obj: dict[str, Any]) -> None:
        if kind in ("ADDED", "MODIFIED"):
            self._observe(obj)

    def created(self, name: str) -> None:
        with self.lock:
            self.created_at.setdefault(name, time.monotonic())

    def _observe(self, obj: Mapping[str, Any]) -> None:
        name = (obj.get("metadata") or {}).get("name", "")
        now = time.monotonic()
        with self.lock:
            if name in self.bound_at:
                return
            if (obj.get("spec") or {}).get("nodeName"):
                self.bound_at[name] = now
                self.unschedulable.discard(name)
                self.last_binding = self.last_change = now
                return
            conditions = (obj.get("status") or {}).get("conditions") or []
            if name not in self.unschedulable and any(
                    c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions):
                self.unschedulable.add(name)
                self.last_change = now

    def stop(self) -> None:
        self._stop.set()
        self._informer.interrupt()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def snapshot(self) -> tuple[int, int, float, float | None]:
        """(bound, unschedulable, last change, last binding)."""
        with self.lock:
            return len(self.bound_at), len(self.unschedulable), self.last_change, self.last_binding


def _percentile_ms(values_s: Sequence[float], q: float) -> float | None:
    return float(np.percentile(np.asarray(values_s) * 1e3, q)) if values_s else None


# ------------------------------------------------------------------------------------- schedulers


def _log_tail(path: Path, lines: int = 40) -> str:
    return envtest.tail(path, lines)


class SchedulerProcess(Protocol):
    name: str
    pod_scheduler_name: str
    log: Path

    def start(self) -> int:
        """Start the process; returns its pid."""
        ...

    def exit_code(self) -> int | None:
        """None while it runs."""
        ...

    def stop(self) -> None: ...


class KubeSchedulerProcess:
    """The stock kube-scheduler through :meth:`ControlPlane.start_kube_scheduler`: one profile, client
    limits as given, leader election off."""

    def __init__(self, plane: ControlPlane, *, qps: float, burst: int, profile: str) -> None:
        self.plane, self.qps, self.burst = plane, qps, burst
        self.name = KUBE_SCHEDULER
        self.pod_scheduler_name = profile
        self.log = Path()
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> int:
        config = {"clientConnection": {"qps": self.qps, "burst": self.burst},
                  "leaderElection": {"leaderElect": False},
                  "profiles": [{"schedulerName": self.pod_scheduler_name}]}
        try:
            self._proc = self.plane.start_kube_scheduler(config)
        except envtest.AssetsNotFoundError as exc:
            raise BenchError(str(exc)) from None
        self.log = self.plane.process_log(self._proc)
        return self._proc.pid

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def stop(self) -> None:
        if self._proc is not None:
            self.plane.stop_process(self._proc)


class MeridianProcess:
    """``python -m regional_scheduler.kube_cli`` (``meridian regional-scheduler`` without the other
    components' imports) as a subprocess, as it is deployed: its own informers, queue and binding
    cycle, against the admin kubeconfig."""

    def __init__(self, plane: ControlPlane, *, policy: str, qps: float, burst: int, profile: str) -> None:
        self.plane, self.policy, self.qps, self.burst = plane, policy, qps, burst
        self.name = f"{MERIDIAN_PREFIX}{policy}"
        self.pod_scheduler_name = profile
        self.log = plane.workdir / "logs" / f"bench-{self.name}-{secrets.token_hex(3)}.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        return [sys.executable, "-m", "regional_scheduler.kube_cli", "--kubeconfig", str(self.plane.admin_kubeconfig),
                "--policy", self.policy, "--scheduler-name", self.pod_scheduler_name, "--no-leader-elect",
                "--kube-api-qps", str(self.qps), "--kube-api-burst", str(self.burst), "--metrics-port", "0",
                "--cluster", "bench"]

    def start(self) -> int:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log, "ab") as out:
            self._proc = subprocess.Popen(
                envtest.with_parent_death_signal(self.argv()), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        return self._proc.pid

    def exit_code(self) -> int | None:
        return None if self._proc is None else self._proc.poll()

    def stop(self) -> None:
        if self._proc is not None:
            envtest.stop_process(self._proc, timeout=20)


def _cpu_seconds(pid: int) -> float | None:
    try:
        t = psutil.Process(pid).cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(t.user + t.system + t.children_user + t.children_system)


@dataclass(frozen=True)
class CpuSample:
    """CPU seconds so far: the machine's busy time and each of our processes by role."""

    machine_busy_s: float
    by_role: dict[str, float]

    @classmethod
    def take(cls, scheduler_pid: int) -> CpuSample:
        t = psutil.cpu_times()
        busy = t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)
        by_role: dict[str, float] = defaultdict(float)
        me = psutil.Process()
        for proc in [me, *me.children(recursive=True)]:
            try:
                with proc.oneshot():
                    times = proc.cpu_times()
                    name = proc.name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            if proc.pid == me.pid:
                role = "harness"
            elif proc.pid == scheduler_pid:
                role = "scheduler"
            elif name in ("kube-apiserver", "etcd"):
                role = name
            else:
                role = "other-children"
            by_role[role] += times.user + times.system
        return cls(busy, dict(by_role))

    def since(self, start: CpuSample) -> dict[str, float]:
        """Per-role deltas, and ``foreign``: machine busy time not spent in any of our processes."""
        roles = set(self.by_role) | set(start.by_role)
        out = {r: self.by_role.get(r, 0.0) - start.by_role.get(r, 0.0) for r in roles}
        # The scheduler was not running at the start sample: all of its CPU counts.
        out["foreign"] = max(0.0, (self.machine_busy_s - start.machine_busy_s) - sum(out.values()))
        return out


# -------------------------------------------------------------------------------------- progress


class ProgressSink(Protocol):
    """Where a run reports what it is doing (the CLI's rich progress bars; nothing in tests)."""

    def begin(self, description: str, total: int) -> Any: ...

    def update(self, task: Any, completed: int, description: str | None = None) -> None: ...

    def end(self, task: Any) -> None: ...


class NoProgress:
    def begin(self, description: str, total: int) -> Any:
        return None

    def update(self, task: Any, completed: int, description: str | None = None) -> None:
        return None

    def end(self, task: Any) -> None:
        return None


# ------------------------------------------------------------------------------------------- run


def _retrying(call: Callable[[], Any], *, attempts: int = 6) -> Any:
    """An API call retried on 429 and 5xx (the API server sheds load under a burst of creates)."""
    for attempt in range(attempts):
        try:
            return call()
        except ApiException as exc:
            if exc.status not in (429, 500, 502, 503, 504) or attempt == attempts - 1:
                raise
            time.sleep(0.1 * 2**attempt)
    raise AssertionError("unreachable")


def _machine() -> MachineInfo:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return MachineInfo(cpus=os.cpu_count(), physical_cpus=psutil.cpu_count(logical=False), cpu_model=model,
                       memory_gib=round(psutil.virtual_memory().total / 2**30, 1), platform=platform.platform())


def _versions(api: k8s.ApiClient, plane: ControlPlane) -> dict[str, str]:
    import kubernetes

    versions = {"meridian": meridian_version, "python": platform.python_version(),
                "kubernetes-python-client": kubernetes.__version__}
    with contextlib.suppress(Exception):
        versions["kube-apiserver"] = k8s.VersionApi(api).get_code().git_version
    with contextlib.suppress(Exception):
        out = subprocess.run([str(plane.assets / "kube-scheduler"), "--version"], capture_output=True, text=True,
                             timeout=20, check=False)
        versions["kube-scheduler"] = out.stdout.strip().split()[-1]
    return versions


def _list_raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> list[dict[str, Any]]:
    """Every item of a list call, page by page, as raw JSON."""
    items: list[dict[str, Any]] = []
    cont: str | None = None
    while True:
        body = json.loads(call(*args, limit=1000, _continue=cont, _preload_content=False, **kwargs).data)
        items.extend(body.get("items") or [])
        cont = (body.get("metadata") or {}).get("continue")
        if not cont:
            return items


def _event_time(event: Mapping[str, Any]) -> str:
    series = event.get("series") or {}
    return (series.get("lastObservedTime") or event.get("lastTimestamp") or event.get("eventTime")
            or (event.get("metadata") or {}).get("creationTimestamp") or "")


def unschedulable_reasons(unbound: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> dict[str, int]:
    """Unbound pods per reason of their latest FailedScheduling event (else their PodScheduled message)."""
    latest: dict[str, Mapping[str, Any]] = {}
    for event in events:
        involved = event.get("involvedObject") or event.get("regarding") or {}
        name = involved.get("name", "")
        if name not in latest or _event_time(event) >= _event_time(latest[name]):
            latest[name] = event
    counts: Counter[str] = Counter()
    for pod in unbound:
        name = (pod.get("metadata") or {}).get("name", "")
        message = (latest.get(name) or {}).get("message") or (latest.get(name) or {}).get("note") or ""
        if not message:
            for c in (pod.get("status") or {}).get("conditions") or []:
                if c.get("type") == "PodScheduled" and c.get("status") == "False":
                    message = c.get("message") or ""
        counts.update(set(failure_reasons(message)) if message else {NO_MESSAGE})
    return dict(counts.most_common())


class KubernetesBench:
    """One run: the Nodes once, then each scheduler in turn on its own copy of the backlog."""

    def __init__(self, settings: BenchKubernetesSettings, plane: ControlPlane, *,
                 progress: ProgressSink | None = None) -> None:
        self.settings = settings
        self.plane = plane
        self.progress = progress or NoProgress()
        self.run_id = secrets.token_hex(4)
        self.workload = build_workload(settings.mix, nodes=settings.nodes, pods=settings.pods, seed=settings.seed)
        self.node_selector: dict[str, str] | None = None
        self._pid = 0

    # -- stages

    def create_nodes(self, api: k8s.ApiClient) -> None:
        core = k8s.CoreV1Api(api)
        others = [n for n in _list_raw(core.list_node)
                  if ((n.get("metadata") or {}).get("labels") or {}).get(RUN_LABEL) != self.run_id]
        if others:  # pods must not land on Nodes that are not the benchmark's (a shared or real cluster)
            self.node_selector = {RUN_LABEL: self.run_id}
        specs = self.workload.nodes
        task = self.progress.begin(f"creating {len(specs)} Nodes", len(specs))
        batch = 10 * self.settings.create_workers
        for first in range(0, len(specs), batch):
            envtest.create_ready_nodes(api, specs[first:first + batch], labels={RUN_LABEL: self.run_id},
                                       workers=self.settings.create_workers)
            self.progress.update(task, min(first + batch, len(specs)))
        self.progress.end(task)

    def delete_nodes(self, api: k8s.ApiClient) -> None:
        with contextlib.suppress(ApiException):
            envtest.delete_nodes(api, f"{RUN_LABEL}={self.run_id}")

    def _create_backlog(self, api: k8s.ApiClient, namespace: str, scheduler_name: str, watch: PodWatch,
                        label: str) -> float:
        core = k8s.CoreV1Api(api)
        total = len(self.workload.pods)
        task = self.progress.begin(f"{label}: creating the backlog", total)
        done = 0
        lock = threading.Lock()
        started = time.monotonic()

        def one(item: tuple[int, PodShape]) -> None:
            nonlocal done
            i, shape = item
            name = f"pod-{i:05d}"
            body = pod_body(name, shape, scheduler_name=scheduler_name, run_id=self.run_id,
                            node_selector=self.node_selector)

            def create() -> None:
                try:
                    discard_reply(core.create_namespaced_pod(namespace, body, _preload_content=False))
                except ApiException as exc:
                    if exc.status != 409:  # 409: an earlier attempt was applied
                        raise

            _retrying(create)
            watch.created(name)
            with lock:
                done += 1
                if done % 50 == 0 or done == total:
                    self.progress.update(task, done)

        with ThreadPoolExecutor(self.settings.create_workers, thread_name_prefix="bench-pods") as pool:
            list(pool.map(one, enumerate(self.workload.pods)))
        self.progress.end(task)
        return time.monotonic() - started

    def _wait(self, proc: SchedulerProcess, watch: PodWatch, started: float, label: str) -> tuple[str, float | None]:
        """Until every pod is bound, or the rest are reported unschedulable, or no progress; returns why it
        stopped and the process's CPU seconds at the first binding."""
        s = self.settings
        total = len(self.workload.pods)
        task = self.progress.begin(f"{label}: pods bound", total)
        cpu_at_first: float | None = None
        try:
            while True:
                time.sleep(0.2)
                code = proc.exit_code()
                if code is not None:
                    raise SchedulerDiedError(f"{proc.name} exited with status {code} during its run; last lines of "
                                             f"{proc.log}:\n{_log_tail(proc.log)}")
                bound, unschedulable, last_change, last_binding = watch.snapshot()
                self.progress.update(task, bound, f"{label}: pods bound ({unschedulable} unschedulable)"
                                     if unschedulable else None)
                now = time.monotonic()
                if bound and cpu_at_first is None:
                    cpu_at_first = _cpu_seconds(self._pid)
                if bound >= total:
                    return "all-bound", cpu_at_first
                if bound + unschedulable >= total and now - last_change >= s.settle_s:
                    return "rest-unschedulable", cpu_at_first
                if last_binding is not None and now - last_binding >= s.idle_s:
                    return "no-progress", cpu_at_first
                if last_binding is None and not unschedulable and now - started >= s.start_timeout_s:
                    raise SchedulerDiedError(f"{proc.name} bound nothing and reported nothing within "
                                             f"{s.start_timeout_s:.0f} s; last lines of {proc.log}:\n"
                                             f"{_log_tail(proc.log)}")
                if now - started >= s.timeout_s:
                    return "timeout", cpu_at_first
        finally:
            self.progress.end(task)

    def _clear_namespace(self, api: k8s.ApiClient, namespace: str) -> None:
        core = k8s.CoreV1Api(api)
        _retrying(lambda: discard_reply(core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0,
                                                                         _preload_content=False)))
        envtest.wait_for(lambda: not json.loads(core.list_namespaced_pod(
            namespace, limit=1, _preload_content=False).data).get("items"), timeout=300, interval=0.5,
            message=f"the pods of namespace {namespace} to be deleted")
        with contextlib.suppress(ApiException):
            discard_reply(core.delete_collection_namespaced_event(namespace, _preload_content=False))
        with contextlib.suppress(ApiException):
            discard_reply(core.delete_namespace(namespace, _preload_content=False))

    def run_scheduler(self, api: k8s.ApiClient, index: int, name: str) -> SchedulerResult:
        s = self.settings
        core = k8s.CoreV1Api(api)
        external = self.plane.external
        if name == KUBE_SCHEDULER:
            proc: SchedulerProcess = KubeSchedulerProcess(
                self.plane, qps=s.qps, burst=s.burst,
                profile="meridian-bench-kube-scheduler" if external else "default-scheduler")
        else:
            proc = MeridianProcess(self.plane, policy=name[len(MERIDIAN_PREFIX):], qps=s.qps, burst=s.burst,
                                   profile="meridian-bench" if external else "meridian")
        namespace = f"bench-{self.run_id}-{index}-{name}"[:63].rstrip("-")
        core.create_namespace({"metadata": {"name": namespace, "labels": {RUN_LABEL: self.run_id}}})
        try:
            with contextlib.suppress(ApiException):  # 409: kube-controller-manager made it first
                core.create_namespaced_service_account(namespace, {"metadata": {"name": "default"}})
            watch = PodWatch(api, namespace).start()
            try:
                create_s = self._create_backlog(api, namespace, proc.pod_scheduler_name, watch, name)
                started = time.monotonic()
                cpu_start = CpuSample.take(0)
                self._pid = proc.start()
                cpu_end: float | None = None
                try:
                    stopped, cpu_first = self._wait(proc, watch, started, name)
                    cpu_end = _cpu_seconds(self._pid)
                    cpu_used = CpuSample.take(self._pid).since(cpu_start)
                finally:
                    proc.stop()
                wall_s = time.monotonic() - started
                time.sleep(0.5)  # the last bindings' events
            finally:
                watch.stop()
            return self._result(api, proc, namespace, watch, stopped=stopped, started=started,
                                cpu_first=cpu_first, cpu_end=cpu_end, cpu_used=cpu_used, create_s=create_s,
                                wall_s=wall_s)
        finally:
            self._clear_namespace(api, namespace)

    def _result(self, api: k8s.ApiClient, proc: SchedulerProcess, namespace: str, watch: PodWatch, *,
                stopped: str, started: float, cpu_first: float | None, cpu_end: float | None,
                cpu_used: dict[str, float], create_s: float, wall_s: float) -> SchedulerResult:
        core = k8s.CoreV1Api(api)
        nodes = _list_raw(core.list_node, label_selector=f"{RUN_LABEL}={self.run_id}")
        pods = _list_raw(core.list_namespaced_pod, namespace)
        events = _list_raw(core.list_namespaced_event, namespace, field_selector="reason=FailedScheduling")
        with watch.lock:
            bound_at = dict(watch.bound_at)
            created_at = dict(watch.created_at)
        report = check_bindings(nodes, pods, bound_order={f"{namespace}/{k}": v for k, v in bound_at.items()})
        unbound = [p for p in pods if not (p.get("spec") or {}).get("nodeName")]
        times = sorted(bound_at.values())
        span = times[-1] - times[0] if len(times) > 1 else None
        latencies = [bound_at[n] - created_at[n] for n in bound_at if n in created_at]
        bound = report.bound
        return SchedulerResult(
            scheduler=proc.name, pod_scheduler_name=proc.pod_scheduler_name, namespace=namespace,
            pods=len(pods), bound=bound, unschedulable=len(unbound),
            unschedulable_reasons=unschedulable_reasons(unbound, events),
            failed_scheduling_reports=sum(max(int(e.get("count") or 1), int((e.get("series") or {}).get("count") or 1))
                                          for e in events),
            infeasible_bindings=len(report.infeasible), infeasible_reasons=report.reasons,
            pods_per_s=len(times) / span if span else None,
            p50_ms=_percentile_ms(latencies, 50), p99_ms=_percentile_ms(latencies, 99),
            first_binding_s=times[0] - started if times else None, binding_span_s=span,
            cpu_s=cpu_end, cpu_s_per_pod=cpu_end / bound if cpu_end is not None and bound else None,
            cpu_s_after_first_binding=(cpu_end - cpu_first) if cpu_end is not None and cpu_first is not None
            else None,
            cpu_ms_per_pod_after_first_binding=(cpu_end - cpu_first) * 1e3 / (bound - 1)
            if cpu_end is not None and cpu_first is not None and bound > 1 else None,
            apiserver_cpu_s=None if self.plane.external else cpu_used.get("kube-apiserver"),
            etcd_cpu_s=None if self.plane.external else cpu_used.get("etcd"),
            harness_cpu_s=cpu_used.get("harness", 0.0), foreign_cpu_s=cpu_used["foreign"],
            gpu_allocated_ratio=report.gpu_allocated_ratio, cpu_allocated_ratio=report.cpu_allocated_ratio,
            stopped=stopped, backlog_create_s=create_s, wall_s=wall_s, log=str(proc.log))

    def run(self) -> BenchKubernetesReport:
        s = self.settings
        with self.plane.api_client(pool_maxsize=2 * s.create_workers + 8) as api:
            self.create_nodes(api)
            try:
                settings = RunSettings(
                    mix=s.mix, nodes=len(self.workload.nodes), pods=len(self.workload.pods), seed=s.seed, qps=s.qps,
                    burst=s.burst, schedulers=list(s.schedulers), timeout_s=s.timeout_s, idle_s=s.idle_s,
                    api_server="external" if self.plane.external else "local",
                    pods_select_bench_nodes=self.node_selector is not None, gpus=self.workload.gpus,
                    machine=_machine(), versions=_versions(api, self.plane))
                results = {name: self.run_scheduler(api, i, name) for i, name in enumerate(s.schedulers)}
            finally:
                self.delete_nodes(api)
        return BenchKubernetesReport(settings=settings, schedulers=results)


@contextlib.contextmanager
def control_plane() -> Iterator[ControlPlane]:
    """The cluster ``MERIDIAN_TEST_KUBECONFIG`` names, else a local etcd + kube-apiserver (no
    kube-controller-manager: the benchmark creates the ServiceAccounts pods need itself)."""
    plane = envtest.from_environment(controller_manager=False)
    try:
        plane.start()
    except envtest.AssetsNotFoundError as exc:
        raise BenchError(str(exc)) from None
    except envtest.ControlPlaneError as exc:
        raise BenchError(f"the test control plane did not start: {exc}") from None
    try:
        yield plane
    finally:
        plane.stop()


def run_benchmark(settings: BenchKubernetesSettings, *, plane: ControlPlane | None = None,
                  progress: ProgressSink | None = None) -> BenchKubernetesReport:
    """Run the benchmark on ``plane`` (started), or on a control plane of its own."""
    if plane is not None:
        return KubernetesBench(settings, plane, progress=progress).run()
    with control_plane() as own:
        return KubernetesBench(settings, own, progress=progress).run()


def write_json(path: Path, report: BenchKubernetesReport) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report.model_dump(mode="json"), indent=2) + "\n")


# ------------------------------------------------------------------------------------------- CLI


def _fmt(value: float | int | None, digits: int = 1) -> str:
    if value is None:
        return "–"
    if isinstance(value, int):
        return str(value)
    return f"{value:.{digits}f}"


def render_table(report: BenchKubernetesReport) -> Any:
    from rich.table import Table

    s = report.settings
    table = Table(title=f"meridian bench kubernetes — {s.mix}: {s.nodes} nodes, {s.pods} pods, "
                  f"QPS {s.qps:g} / burst {s.burst}, {s.machine.cpus} CPUs")
    columns = ("scheduler", "bound", "unsched", "infeasible", "pods/s", "p50 ms", "p99 ms", "1st bind s",
               "CPU s/pod", "CPU ms/pod after 1st", "apiserver CPU s", "other CPU s", "GPU alloc", "CPU alloc",
               "stopped")
    for col in columns:
        table.add_column(col, justify="left" if col in ("scheduler", "stopped") else "right")
    for name, r in report.schedulers.items():
        table.add_row(name, str(r.bound), str(r.unschedulable), str(r.infeasible_bindings), _fmt(r.pods_per_s),
                      _fmt(r.p50_ms, 0), _fmt(r.p99_ms, 0), _fmt(r.first_binding_s), _fmt(r.cpu_s_per_pod, 4),
                      _fmt(r.cpu_ms_per_pod_after_first_binding, 2), _fmt(r.apiserver_cpu_s),
                      _fmt(r.foreign_cpu_s),
                      "–" if r.gpu_allocated_ratio is None else f"{100 * r.gpu_allocated_ratio:.1f} %",
                      f"{100 * r.cpu_allocated_ratio:.1f} %", r.stopped)
    return table
