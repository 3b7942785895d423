"""The Alibaba GPU cluster trace used by the FGD paper (``alibaba-gpu-v2023``, "openb").

Node lists: ``sn,cpu_milli,memory_mib,gpu,model``, as :class:`~meridian.model.Node` objects
(:func:`load_nodes`) or as arrays for vectorised simulators (:func:`load_node_shapes`, read through
:func:`load_nodes`: this module is the one reader of the format). Pod lists come in two layouts: 11 columns
(``name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,
deletion_time,scheduled_time``) and 5 columns (the ``multigpu*`` files). Both load into
:class:`~meridian.model.Pod`; an unreadable cell raises :class:`TraceFormatError` naming the
file, the line and the column.

The FGD paper's workload inflation (``-tune 1.3``) is :func:`inflate_pods`: the original list plus
pods resampled with replacement until the arrived GPU request reaches ``ratio`` × cluster GPUs,
then shuffled, all from one seeded generator.
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meridian.model import MIB, MILLI_GPU_PER_DEVICE, Node, Pod, QoSClass, Resources
from meridian.traces import TraceFormatError, default_traces_dir, missing_trace

NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS_11 = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                  "creation_time", "deletion_time", "scheduled_time")
POD_COLUMNS_5 = POD_COLUMNS_11[:5]
_QOS = {"LS": QoSClass.LATENCY_SENSITIVE, "BE": QoSClass.BE, "Burstable": QoSClass.BURSTABLE,
        "Guaranteed": QoSClass.GUARANTEED}


def openb_dir() -> Path:
    return default_traces_dir() / "alibaba-gpu-v2023"


def _int(path: Path, line: int, column: str, text: str, *, lo: int = 0, hi: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        try:
            f = float(text)
        except ValueError:
            raise TraceFormatError(path, line, column, f"not a number: {text!r}") from None
        if not f.is_integer():
            raise TraceFormatError(path, line, column, f"not an integer: {text!r}") from None
        value = int(f)
    if value < lo or (hi is not None and value > hi):
        raise TraceFormatError(path, line, column, f"{value} outside [{lo}, {hi if hi is not None else '∞'}]")
    return value


def _float_or_none(path: Path, line: int, column: str, text: str) -> float | None:
    if text == "":
        return None
    try:
        return float(text)
    except ValueError:
        raise TraceFormatError(path, line, column, f"not a number: {text!r}") from None


def _rows(path: Path, layouts: Sequence[tuple[str, ...]]) -> tuple[tuple[str, ...], list[tuple[int, list[str]]]]:
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        try:
            header = tuple(h.strip() for h in next(reader))
        except StopIteration:
            raise TraceFormatError(path, 1, "<header>", "empty file") from None
        if header not in layouts:
            raise TraceFormatError(path, 1, "<header>", f"unknown layout {header}; expected one of {list(layouts)}")
        rows = []
        for line, row in enumerate(reader, start=2):
            if not row:
                continue
            if len(row) != len(header):
                raise TraceFormatError(path, line, "<row>", f"{len(row)} columns, header has {len(header)}")
            rows.append((line, row))
    return header, rows


def load_nodes(path: Path | str | None = None) -> list[Node]:
    """Load an openb node list (default: the paper's GPU-node list, 1,213 nodes)."""
    if path is None:
        path = openb_dir() / "openb_node_list_gpu_node.csv"
        if not path.is_file():  # the traces folder, not the caller's file: say so, and how to point to another
            raise missing_trace(path.parents[1], f"{path.parent.name}/{path.name}")
    path = Path(path)
    _, rows = _rows(path, [NODE_COLUMNS])
    nodes = []
    for line, (sn, cpu, mem, gpu, model) in rows:
        if not sn:
            raise TraceFormatError(path, line, "sn", "empty node name")
        n_gpu = _int(path, line, "gpu", gpu, hi=8)
        res = Resources(milli_cpu=_int(path, line, "cpu_milli", cpu),
                        memory_bytes=_int(path, line, "memory_mib", mem) * MIB, gpu=n_gpu)
        labels = {"kubernetes.io/hostname": sn}
        if model:
            labels["meridian.io/gpu-model"] = model
        nodes.append(Node(name=sn, capacity=res, labels=labels, gpu_model=model))
    return nodes


@dataclass(frozen=True)
class NodeShapes:
    """An openb node list as arrays, one row per node in file order (for vectorised simulators)."""

    milli_cpu: np.ndarray  # (n,) int64
    memory_bytes: np.ndarray  # (n,) int64
    gpus: np.ndarray  # (n,) int64
    gpu_model: tuple[str, ...]  # '' for a node without GPUs

    def __len__(self) -> int:
        return len(self.gpu_model)

    @property
    def alloc(self) -> np.ndarray:
        """(n, 3) int64: milli-CPU, memory bytes, GPUs of each node."""
        return np.column_stack([self.milli_cpu, self.memory_bytes, self.gpus]).astype(np.int64)


def load_node_shapes(path: Path | str | None = None) -> NodeShapes:
    """:func:`load_nodes` (same default, same checks) as :class:`NodeShapes`."""
    nodes = load_nodes(path)
    return NodeShapes(
        milli_cpu=np.array([n.capacity.milli_cpu for n in nodes], dtype=np.int64),
        memory_bytes=np.array([n.capacity.memory_bytes for n in nodes], dtype=np.int64),
        gpus=np.array([n.capacity.gpu for n in nodes], dtype=np.int64),
        gpu_model=tuple(n.gpu_model if n.capacity.gpu else "" for n in nodes),
    )


def load_pods(path: Path | str) -> list[Pod]:
    """Load an openb pod list in either layout."""
    path = Path(path)
    header, rows = _rows(path, [POD_COLUMNS_11, POD_COLUMNS_5])
    pods = []
    for line, row in rows:
        cell = dict(zip(header, row, strict=True))
        num_gpu = _int(path, line, "num_gpu", cell["num_gpu"], hi=8)
        gpu_milli = _int(path, line, "gpu_milli", cell["gpu_milli"], hi=MILLI_GPU_PER_DEVICE)
        if num_gpu == 0 and gpu_milli:
            raise TraceFormatError(path, line, "gpu_milli", f"{gpu_milli} milli-GPU on a pod with num_gpu 0")
        if num_gpu > 1 and gpu_milli != MILLI_GPU_PER_DEVICE:
            raise TraceFormatError(path, line, "gpu_milli", f"multi-GPU pods take whole GPUs, got {gpu_milli}")
        shared = num_gpu == 1 and 0 < gpu_milli < MILLI_GPU_PER_DEVICE
        requests = Resources(
            milli_cpu=_int(path, line, "cpu_milli", cell["cpu_milli"]),
            memory_bytes=_int(path, line, "memory_mib", cell["memory_mib"]) * MIB,
            gpu=0 if shared else num_gpu,
            gpu_milli=gpu_milli if shared else 0,
        )
        spec = cell.get("gpu_spec", "")
        qos_text = cell.get("qos", "")
        if qos_text and qos_text not in _QOS:
            raise TraceFormatError(path, line, "qos", f"unknown QoS {qos_text!r}")
        if not cell["name"]:
            raise TraceFormatError(path, line, "name", "empty pod name")
        pods.append(Pod(
            name=cell["name"],
            requests=requests,
            qos=_QOS.get(qos_text, QoSClass.BURSTABLE),
            allowed_gpu_models=tuple(m for m in spec.split("|") if m),
            creation_time_s=_float_or_none(path, line, "creation_time", cell.get("creation_time", "")),
            deletion_time_s=_float_or_none(path, line, "deletion_time", cell.get("deletion_time", "")),
        ))
    return pods


def pod_list_paths(directory: Path | None = None) -> list[Path]:
    return sorted((directory or openb_dir()).glob("openb_pod_list_*.csv"))


def total_gpu_milli(pods: Sequence[Pod]) -> int:
    return sum(p.requests.gpu_milli_total for p in pods)


def inflate_pods(pods: Sequence[Pod], cluster_gpu_milli: int, *, ratio: float = 1.3, seed: int = 42) -> list[Pod]:
    """The FGD simulator's ``-tune`` workload: the original pods plus resampled copies until the
    total GPU request reaches ``ratio`` × cluster GPU capacity, shuffled by ``seed``.

    Resampled copies get a ``-r<k>`` name suffix so names stay unique.
    """
    rng = np.random.default_rng(seed)
    out = list(pods)
    target = ratio * cluster_gpu_milli
    total = total_gpu_milli(out)
    gpu_pods = [p for p in pods if p.requests.gpu_milli_total > 0]
    if not gpu_pods and total < target:
        raise ValueError("cannot inflate a pod list with no GPU request to a GPU target")
    k = 0
    while total < target:
        pick = pods[int(rng.integers(len(pods)))]
        out.append(pick.model_copy(update={"name": f"{pick.name}-r{k}"}))
        total += pick.requests.gpu_milli_total
        k += 1
    order = rng.permutation(len(out))
    return [out[i] for i in order]
