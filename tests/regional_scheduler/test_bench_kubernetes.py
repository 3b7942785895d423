"""``meridian bench kubernetes``: the independent feasibility check on hand-made Nodes and Pods, and a
small run of kube-scheduler and Meridian in turn on a real API server."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from meridian.envtest import ControlPlane
from regional_scheduler import bench_kubernetes as bk

GPU, SHARE, DEVICES = "nvidia.com/gpu", "meridian.io/gpu-milli", "meridian.io/gpu-devices"


def node(name: str = "n0", *, cpu: str = "8", memory: str = "16Gi", gpus: int = 0, pods: str = "110",
         labels: dict[str, str] | None = None) -> dict[str, Any]:
    alloc = {"cpu": cpu, "memory": memory, "pods": pods}
    if gpus:
        alloc |= {GPU: str(gpus), SHARE: str(1000 * gpus)}
    return {"metadata": {"name": name, "labels": labels or {}}, "spec": {},
            "status": {"allocatable": alloc, "capacity": alloc}}


def pod(name: str, on: str | None = "n0", *, cpu: str = "100m", memory: str = "64Mi", gpus: int = 0,
        share: int = 0, devices: str | None = None, node_selector: dict[str, str] | None = None) -> dict[str, Any]:
    requests: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        requests[GPU] = str(gpus)
    if share:
        requests[SHARE] = str(share)
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": requests}}]}
    if on:
        spec["nodeName"] = on
    if node_selector:
        spec["nodeSelector"] = node_selector
    meta: dict[str, Any] = {"name": name, "namespace": "ns"}
    if devices is not None:
        meta["annotations"] = {DEVICES: devices}
    return {"metadata": meta, "spec": spec}


@pytest.mark.parametrize(("nodes", "pods", "infeasible", "reason"), [
    pytest.param([node(gpus=1)], [pod("a", share=600), pod("b", share=600)], ["ns/b"],
                 "no GPU device can hold the share", id="two-600-milli-shares-on-one-gpu"),
    pytest.param([node(gpus=1)], [pod("a", share=400), pod("b", share=600)], [], None,
                 id="400-plus-600-milli-fill-one-gpu"),
    # kube-scheduler's view: 1 of 2 GPUs and 1,200 of 2,000 milli in its per-node pools, so it binds all
    # three; device by device the whole GPU takes device 0 and only one 600 fits on device 1.
    pytest.param([node(gpus=2)], [pod("w", gpus=1), pod("a", share=600), pod("b", share=600)], ["ns/b"],
                 "no GPU device can hold the share", id="shares-fit-the-pool-but-no-device"),
    # first-fit decreasing leaves the 200 over (500+400 | 300+300+300), but 500+300+200 | 400+300+300 exists.
    pytest.param([node(gpus=2)], [pod(f"p{i}", share=s) for i, s in enumerate((500, 400, 300, 300, 300, 200))],
                 [], None, id="exact-packing-when-first-fit-fails"),
    pytest.param([node(gpus=2)], [pod("a", share=600, devices="1"), pod("b", share=600, devices="1")], ["ns/b"],
                 "annotated GPU device(s) over-committed", id="annotated-devices-exceeding-a-device"),
    pytest.param([node(gpus=2)], [pod("a", share=600, devices="0"), pod("b", share=600, devices="1")], [], None,
                 id="annotated-devices-that-fit"),
    pytest.param([node(gpus=2)], [pod("a", share=300, devices="2")], ["ns/a"],
                 "meridian.io/gpu-devices '2' does not name 1 device(s) of 2", id="annotated-device-out-of-range"),
    pytest.param([node(gpus=2)], [pod("w", gpus=2, devices="0,0")], ["ns/w"],
                 "meridian.io/gpu-devices '0,0' does not name 2 device(s) of 2", id="annotated-device-twice"),
    pytest.param([node(gpus=2)], [pod("a", share=300, devices="0"), pod("w", gpus=1, devices="0")], ["ns/w"],
                 "annotated GPU device(s) over-committed", id="whole-gpu-on-a-shared-device"),
    pytest.param([node(gpus=2)], [pod("a", share=300, devices="0"), pod("w", gpus=2)], ["ns/w"],
                 "Insufficient whole GPU devices", id="whole-gpus-need-free-devices"),
    pytest.param([node(cpu="1")], [pod("a", cpu="600m"), pod("b", cpu="600m")], ["ns/b"], "Insufficient cpu",
                 id="cpu-overcommit-later-binding-is-infeasible"),
    pytest.param([node(memory="1Gi")], [pod("a", memory="1Gi"), pod("b", memory="1")], ["ns/b"],
                 "Insufficient memory", id="memory-overcommit"),
    pytest.param([node(pods="1")], [pod("a"), pod("b")], ["ns/b"], "Insufficient pods", id="pods-count"),
    pytest.param([node(labels={"zone": "a"})], [pod("a", node_selector={"zone": "b"})], ["ns/a"],
                 "node(s) didn't match Pod's node affinity/selector", id="node-selector"),
    pytest.param([node()], [pod("a", on="ghost")], ["ns/a"], "bound to a Node that does not exist",
                 id="unknown-node"),
    pytest.param([node()], [pod("a", on=None), pod("b")], [], None, id="unbound-pods-are-not-checked"),
])
def test_check_bindings(nodes: list[dict[str, Any]], pods: list[dict[str, Any]], infeasible: list[str],
                        reason: str | None) -> None:
    order = {f"ns/{p['metadata']['name']}": float(i) for i, p in enumerate(pods)}
    report = bk.check_bindings(nodes, pods, bound_order=order)
    assert [b.pod for b in report.infeasible] == infeasible
    if reason is not None:
        assert reason in report.infeasible[0].reasons


def test_binding_order_decides_which_pod_is_infeasible() -> None:
    pods = [pod("a", cpu="600m"), pod("b", cpu="600m")]
    report = bk.check_bindings([node(cpu="1")], pods, bound_order={"ns/b": 1.0, "ns/a": 2.0})
    assert [b.pod for b in report.infeasible] == ["ns/a"]


def test_allocation_ratios_count_only_feasible_placements() -> None:
    # 1 GPU: the first 600-milli share fits, the second does not → 600 / 1000; CPU 2 × 1 of 4 cores, but
    # the infeasible pod's CPU is not counted either → 1000 / 4000.
    report = bk.check_bindings([node(cpu="4", gpus=1)], [pod("a", cpu="1", share=600), pod("b", cpu="1", share=600)],
                               bound_order={"ns/a": 0.0, "ns/b": 1.0})
    assert report.bound == 2
    assert report.gpu_allocated_ratio == pytest.approx(0.6)
    assert report.cpu_allocated_ratio == pytest.approx(0.25)
    assert report.reasons == {"no GPU device can hold the share": 1}
    assert bk.check_bindings([node()], [pod("a")]).gpu_allocated_ratio is None


@pytest.mark.parametrize(("message", "reasons"), [
    pytest.param("0/50 nodes are available: 3 Insufficient cpu, 47 Insufficient memory. preemption: 0/50 nodes are "
                 "available: 50 No preemption victims found for incoming pod.", ["Insufficient cpu", "Insufficient memory"],
                 id="kube-scheduler"),
    pytest.param("0/50 nodes are available: 50 Insufficient meridian.io/gpu-milli.", ["Insufficient meridian.io/gpu-milli"],
                 id="meridian-extended-resource"),
    pytest.param("pod ns/a uses pod affinity, which Meridian's scheduler does not support",
                 ["pod ns/a uses pod affinity, which Meridian's scheduler does not support"], id="not-a-fit-error"),
])
def test_failure_reasons(message: str, reasons: list[str]) -> None:
    assert bk.failure_reasons(message) == reasons


def test_unschedulable_reasons_use_the_latest_event_per_pod() -> None:
    unbound = [pod("a", on=None), pod("b", on=None)]
    events = [
        {"involvedObject": {"name": "a"}, "lastTimestamp": "2026-01-01T00:00:01Z",
         "message": "0/2 nodes are available: 2 Insufficient cpu."},
        {"involvedObject": {"name": "a"}, "lastTimestamp": "2026-01-01T00:00:05Z",
         "message": "0/2 nodes are available: 2 Insufficient memory."},
    ]
    assert bk.unschedulable_reasons(unbound, events) == {"Insufficient memory": 1, bk.NO_MESSAGE: 1}


def test_pod_body_sets_limits_for_extended_resources() -> None:
    body = bk.pod_body("p", bk.PodShape(cpu_milli=500, memory_bytes=2**30, gpu_milli=250, gpu_models=("T4",)),
                       scheduler_name="meridian", run_id="r")
    container = body["spec"]["containers"][0]
    assert container["resources"] == {"requests": {"cpu": "500m", "memory": str(2**30), SHARE: "250"},
                                      "limits": {SHARE: "250"}}
    terms = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] == ["T4"]


def test_parse_schedulers() -> None:
    assert bk.parse_schedulers("kube-scheduler, meridian-fgd,meridian-learned") == [
        "kube-scheduler", "meridian-fgd", "meridian-learned"]
    with pytest.raises(ValueError, match="unknown scheduler"):
        bk.parse_schedulers("meridian-nonsense")
    with pytest.raises(ValueError, match="twice"):
        bk.parse_schedulers("kube-scheduler,kube-scheduler")


# ------------------------------------------------------------------------------- a real API server


@pytest.mark.kubernetes
def test_kube_scheduler_and_meridian_on_the_seed_mix(kube_control_plane: ControlPlane, tmp_path: Path) -> None:
    settings = bk.BenchKubernetesSettings(mix="seed-50x200", qps=1000, burst=1000,
                                          schedulers=["kube-scheduler", "meridian-fgd"], idle_s=10, timeout_s=120)
    report = bk.run_benchmark(settings, plane=kube_control_plane)
    bk.write_json(tmp_path / "bench.json", report)
    doc = json.loads((tmp_path / "bench.json").read_text())

    assert set(doc) == {"settings", "schedulers"}
    assert {"nodes", "pods", "mix", "qps", "burst", "machine", "versions"} <= set(doc["settings"])
    assert (doc["settings"]["nodes"], doc["settings"]["pods"]) == (50, 200)
    assert doc["settings"]["machine"]["cpus"] >= 1
    assert list(doc["schedulers"]) == ["kube-scheduler", "meridian-fgd"]
    for name, result in doc["schedulers"].items():
        assert {"pods_per_s", "p50_ms", "p99_ms", "bound", "unschedulable", "unschedulable_reasons",
                "infeasible_bindings", "cpu_s_per_pod", "gpu_allocated_ratio", "cpu_allocated_ratio",
                "failed_scheduling_reports", "foreign_cpu_s"} <= set(result)
        assert result["pods"] == 200, name
        assert result["bound"] > 0, name
        assert result["bound"] + result["unschedulable"] == 200, name
        assert result["pods_per_s"] > 0 and result["p99_ms"] >= result["p50_ms"] > 0, name
        assert result["cpu_s_per_pod"] > 0, name
        assert result["gpu_allocated_ratio"] is None, name  # no GPUs in this mix
        if result["unschedulable"]:  # 50 × 8 CPUs cannot hold all 200 pods' CPU and memory
            assert set(result["unschedulable_reasons"]) <= {"Insufficient cpu", "Insufficient memory"}, name
    assert doc["schedulers"]["meridian-fgd"]["infeasible_bindings"] == 0
    assert doc["schedulers"]["kube-scheduler"]["infeasible_bindings"] == 0  # CPU-only: its pools are exact
    assert doc["schedulers"]["meridian-fgd"]["pod_scheduler_name"] == "meridian"
