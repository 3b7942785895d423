"""Kubernetes Pods and Nodes (their JSON, as the API server sends them) as Meridian's data model.

The scheduler reads raw JSON rather than the official client's generated classes: a backlog of
thousands of pods arrives through one watch, and building ``V1Pod`` objects costs more than the
decision itself.

What Meridian understands, with Kubernetes semantics:

* requests of ``cpu``, ``memory``, ``ephemeral-storage`` and extended resources (any other name:
  integer counts), summed over containers, raised to the largest init container
  (``max(sum(containers), max(init))``, with restartable init containers, sidecars, added to both
  sides as kube-scheduler does) plus ``spec.overhead``; every pod also takes one of the node's
  ``pods``;
* ``nodeSelector``, required node affinity (``requiredDuringSchedulingIgnoredDuringExecution``),
  taints and tolerations; ``spec.unschedulable`` is the taint
  ``node.kubernetes.io/unschedulable:NoSchedule``, as kube-scheduler's NodeUnschedulable plugin
  treats it;
* GPUs as the ecosystem writes them: whole devices as ``nvidia.com/gpu``, the model from the label
  ``nvidia.com/gpu.product`` (NVIDIA GPU Feature Discovery's), and a **share of one device** as the
  extended resource ``meridian.io/gpu-milli`` (milli-GPU, 1–1000, the openb traces' 0.81-GPU pods ask
  for 810). A node advertises ``meridian.io/gpu-milli`` as 1000 × its devices (a device plugin's job).
  The device a share was put on is written to the pod's annotation ``meridian.io/gpu-devices`` when
  Meridian binds it (the Binding's annotations are copied onto the pod), so every replica of the
  scheduler rebuilds exact per-device allocation from the API server.

Anything else that constrains placement is refused with :class:`UnsupportedPodError`, which names
each feature, rather than silently ignored: pod (anti-)affinity, topology spread constraints,
preferred node affinity, host ports, volumes that need binding (persistent volume claims and
ephemeral volumes), scheduling gates and dynamic resource claims.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from meridian import quantity
from meridian.model import (
    MILLI_GPU_PER_DEVICE,
    GpuDevice,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    Resources,
    Taint,
    TaintEffect,
    Toleration,
)

GPU_RESOURCE = "nvidia.com/gpu"
GPU_SHARE_RESOURCE = "meridian.io/gpu-milli"
GPU_MODEL_LABEL = "nvidia.com/gpu.product"
GPU_DEVICES_ANNOTATION = "meridian.io/gpu-devices"
PODS_RESOURCE = "pods"
UNSCHEDULABLE_TAINT = Taint(key="node.kubernetes.io/unschedulable", effect=TaintEffect.NO_SCHEDULE)

# Volume kinds that never constrain placement (no binding, no topology).
_PLAIN_VOLUMES = frozenset({"configMap", "secret", "emptyDir", "projected", "downwardAPI", "hostPath", "name",
                            "image", "nfs", "csi"})


class UnsupportedPodError(ValueError):
    """A pod asks for placement features Meridian does not implement; ``features`` names each."""

    def __init__(self, pod: str, features: list[str]) -> None:
        self.features = features
        super().__init__(f"pod {pod} uses {', '.join(features)}, which Meridian's scheduler does not support; "
                         "remove it or use schedulerName default-scheduler")


class InvalidObjectError(ValueError):
    """A Pod or Node whose fields cannot be read (a bad quantity, a missing name)."""


def pod_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _quantities(resources: Mapping[str, Any] | None, where: str) -> dict[str, int]:
    """A requests map in integer units: milli for cpu, plain integers for everything else."""
    out: dict[str, int] = {}
    for name, value in (resources or {}).items():
        try:
            out[name] = quantity.to_milli(value, field=f"{where}.{name}") if name == "cpu" else \
                quantity.to_int(value, field=f"{where}.{name}")
        except quantity.QuantityError as exc:
            raise InvalidObjectError(str(exc)) from None
    return out


def _add(into: dict[str, int], more: Mapping[str, int]) -> None:
    for name, value in more.items():
        into[name] = into.get(name, 0) + value


def effective_requests(spec: Mapping[str, Any]) -> dict[str, int]:
    """The pod's requests as the scheduler counts them (kube-scheduler's ``computePodResourceRequest``)."""
    total: dict[str, int] = {}
    for i, c in enumerate(spec.get("containers") or []):
        _add(total, _quantities((c.get("resources") or {}).get("requests"), f"spec.containers[{i}].resources.requests"))
    sidecars: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(spec.get("initContainers") or []):
        req = _quantities((c.get("resources") or {}).get("requests"), f"spec.initContainers[{i}].resources.requests")
        if c.get("restartPolicy") == "Always":
            _add(sidecars, req)
            continue
        for name, value in req.items():  # an init container runs beside the sidecars started before it
            init_peak[name] = max(init_peak.get(name, 0), value + sidecars.get(name, 0))
    _add(total, sidecars)
    for name, value in init_peak.items():
        total[name] = max(total.get(name, 0), value)
    _add(total, _quantities(spec.get("overhead"), "spec.overhead"))
    return total


def unsupported_features(spec: Mapping[str, Any]) -> list[str]:
    found: list[str] = []
    affinity = spec.get("affinity") or {}
    if affinity.get("podAffinity"):
        found.append("pod affinity (spec.affinity.podAffinity)")
    if affinity.get("podAntiAffinity"):
        found.append("pod anti-affinity (spec.affinity.podAntiAffinity)")
    if (affinity.get("nodeAffinity") or {}).get("preferredDuringSchedulingIgnoredDuringExecution"):
        found.append("preferred node affinity (spec.affinity.nodeAffinity.preferredDuringScheduling…)")
    if spec.get("topologySpreadConstraints"):
        found.append("topology spread constraints (spec.topologySpreadConstraints)")
    if spec.get("schedulingGates"):
        found.append("scheduling gates (spec.schedulingGates)")
    if spec.get("resourceClaims"):
        found.append("dynamic resource claims (spec.resourceClaims)")
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if any(p.get("hostPort") for p in c.get("ports") or []):
            found.append(f"host ports (container {c.get('name', '?')})")
            break
    for v in spec.get("volumes") or []:
        kinds = set(v) - _PLAIN_VOLUMES
        if kinds & {"persistentVolumeClaim", "ephemeral"}:
            found.append(f"volume {v.get('name', '?')} ({', '.join(sorted(kinds))}) that needs volume binding")
    return found


def _requirements(terms: Iterable[Mapping[str, Any]]) -> tuple[NodeSelectorTerm, ...]:
    out = []
    for term in terms:
        if term.get("matchFields"):
            # matchFields only selects by metadata.name: fold it into a label requirement on the
            # hostname label every node carries.
            raise InvalidObjectError("node affinity matchFields is not supported; use the kubernetes.io/hostname label")
        out.append(NodeSelectorTerm(match_expressions=tuple(
            NodeSelectorRequirement(key=e["key"], operator=e["operator"], values=tuple(e.get("values") or ()))
            for e in term.get("matchExpressions") or [])))
    return tuple(out)


def _timestamp(value: str | None) -> float | None:
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def pod_from_api(obj: Mapping[str, Any], *, check_supported: bool = True) -> Pod:
    """Meridian's :class:`Pod` for a Kubernetes pod; raises :class:`UnsupportedPodError` or
    :class:`InvalidObjectError` with a message for the pod's event. ``check_supported=False`` reads a
    pod that is bound already (by anyone) only for what it takes from its node."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    key = pod_key(obj)
    features = unsupported_features(spec) if check_supported else []
    if features:
        raise UnsupportedPodError(key, features)
    req = effective_requests(spec)
    gpu = req.pop(GPU_RESOURCE, 0)
    gpu_milli = req.pop(GPU_SHARE_RESOURCE, 0)
    if gpu and gpu_milli:
        raise InvalidObjectError(f"pod {key} asks for both {GPU_RESOURCE} and {GPU_SHARE_RESOURCE}; "
                                 "a pod takes whole GPUs or a share of one")
    if gpu_milli > MILLI_GPU_PER_DEVICE:
        raise InvalidObjectError(f"pod {key}: {GPU_SHARE_RESOURCE} is a share of one device (1-1000), got {gpu_milli}")
    milli_cpu = req.pop("cpu", 0)
    memory = req.pop("memory", 0)
    req[PODS_RESOURCE] = req.get(PODS_RESOURCE, 0) + 1
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution") or {} if check_supported else {}
    try:
        return Pod(
            name=key,
            requests=Resources(milli_cpu=milli_cpu, memory_bytes=memory, gpu=gpu, gpu_milli=gpu_milli),
            priority=int(spec.get("priority") or 0),
            labels=dict(meta.get("labels") or {}),
            node_selector=dict(spec.get("nodeSelector") or {}),
            tolerations=tuple(Toleration(key=t.get("key") or "", operator=t.get("operator") or "Equal",
                                         value=t.get("value") or "", effect=t.get("effect") or None)
                              for t in spec.get("tolerations") or []),
            required_affinity=_requirements(affinity.get("nodeSelectorTerms") or []),
            tenant=meta.get("namespace") or "default",
            creation_time_s=_timestamp(meta.get("creationTimestamp")),
            scalar_requests=req,
        )
    except InvalidObjectError:
        raise
    except ValueError as exc:
        raise InvalidObjectError(f"pod {key}: {exc}") from None


def gpu_devices_of(obj: Mapping[str, Any]) -> tuple[int, ...] | None:
    """The device slots Meridian recorded on a bound pod, or None when it has none (bound by another
    scheduler, or not a GPU pod)."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(GPU_DEVICES_ANNOTATION)
    if not raw:
        return None
    try:
        return tuple(int(d) for d in raw.split(","))
    except ValueError:
        return None


def node_from_api(obj: Mapping[str, Any]) -> Node:
    """Meridian's :class:`Node` for a Kubernetes node (allocatable from its status)."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    name = meta.get("name") or ""
    alloc = _quantities(status.get("allocatable") or status.get("capacity"), f"node {name} status.allocatable")
    capacity = _quantities(status.get("capacity") or status.get("allocatable"), f"node {name} status.capacity")
    gpus = alloc.pop(GPU_RESOURCE, 0)
    capacity.pop(GPU_RESOURCE, None)
    share_milli = alloc.pop(GPU_SHARE_RESOURCE, 0)
    # A node advertises whole GPUs, or only shares (a sharing device plugin): devices are whichever is
    # larger, so a pod of either kind sees the same devices.
    devices = max(gpus, share_milli // MILLI_GPU_PER_DEVICE)
    try:
        taints = [Taint(key=t["key"], value=t.get("value") or "", effect=t["effect"]) for t in spec.get("taints") or []]
    except (KeyError, ValueError) as exc:
        raise InvalidObjectError(f"node {name}: malformed taint: {exc}") from None
    if spec.get("unschedulable"):
        taints.append(UNSCHEDULABLE_TAINT)
    labels = dict(meta.get("labels") or {})
    milli_cpu = alloc.pop("cpu", 0)
    memory = alloc.pop("memory", 0)
    try:
        return Node(
            name=name,
            capacity=Resources(milli_cpu=max(milli_cpu, capacity.get("cpu", 0)),
                               memory_bytes=max(memory, capacity.get("memory", 0)), gpu=devices),
            allocatable=Resources(milli_cpu=milli_cpu, memory_bytes=memory, gpu=devices),
            labels=labels,
            taints=tuple(taints),
            gpu_model=labels.get(GPU_MODEL_LABEL, "") if devices else "",
            gpus=tuple(GpuDevice(index=d) for d in range(devices)),
            scalar_allocatable=alloc,
        )
    except ValueError as exc:
        raise InvalidObjectError(f"node {name}: {exc}") from None

