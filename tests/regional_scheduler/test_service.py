"""The regional scheduler service: assumed pods, pods bound by anyone, lazy rebuilds, kube-style diagnosis,
the extender's evaluation, shared GPUs and over-committed accounting."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from meridian.model import GIB, Node, Pod, Resources
from regional_scheduler import kube_objects as ko
from regional_scheduler.service import RegionalScheduler

POLICIES = [pytest.param("fgd", id="fgd"), pytest.param("best-fit", id="best-fit")]


def _node(name: str, *, cpu: str = "4", memory: str = "16Gi", pods: str = "110", gpus: int = 0,
          labels: dict[str, str] | None = None, taints: list[dict[str, str]] | None = None,
          **extended: str) -> Node:
    allocatable = {"cpu": cpu, "memory": memory, "pods": pods, **extended}
    if gpus:
        allocatable["nvidia.com/gpu"] = str(gpus)
    return ko.node_from_api({"metadata": {"name": name, "labels": labels or {}},
                             "spec": {"taints": taints} if taints else {},
                             "status": {"allocatable": allocatable, "capacity": allocatable}})


def _pod(name: str, *, cpu: str = "3", memory: str = "1Gi", tolerations: list[dict[str, Any]] | None = None,
         **extended: str) -> Pod:
    spec: dict[str, Any] = {"containers": [{"name": "main",
                                            "resources": {"requests": {"cpu": cpu, "memory": memory, **extended}}}]}
    if tolerations:
        spec["tolerations"] = tolerations
    return ko.pod_from_api({"metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": spec})


def _service(policy: str, *nodes: Node) -> RegionalScheduler:
    service = RegionalScheduler(cluster="test", policy=policy)
    for node in nodes:
        service.upsert_node(node)
    return service


def _free_milli_cpu(service: RegionalScheduler) -> dict[str, int]:
    state = service.state
    return dict(zip(state.names, state.free_milli_cpu.tolist(), strict=True))


def _free_scalar(service: RegionalScheduler, name: str) -> dict[str, int]:
    state = service.state
    j = state.scalar_index[name]
    return dict(zip(state.names, (state.alloc_scalar[:, j] - state.req_scalar[:, j]).tolist(), strict=True))


def _gpu_free(service: RegionalScheduler, node: str) -> list[int]:
    state = service.state
    i = state.index[node]
    return state.gpu_free_milli[i, : state.gpu_count[i]].tolist()


def _uid(pod: Pod) -> str:
    """The uid :func:`_pod` gave it (its name without the namespace)."""
    return pod.name.rpartition("/")[2]


def _decide_node(service: RegionalScheduler, pod: Pod) -> str | None:
    decision = service.decide(_uid(pod), pod)
    return None if decision.placement is None else service.node_name(decision)


# ---------------------------------------------------------------------- assumed pods


@pytest.mark.parametrize("policy", POLICIES)
def test_decide_assumes_so_the_next_decision_sees_it(policy: str) -> None:
    service = _service(policy, _node("n0"), _node("n1"))
    # 2 nodes of 4 CPU, pods of 3 CPU: one per node, the third fits nowhere (1 CPU left on each).
    first, second = _decide_node(service, _pod("p0")), _decide_node(service, _pod("p1"))
    assert {first, second} == {"n0", "n1"}
    third = _pod("p2")
    decision = service.decide("p2", third)
    assert decision.placement is None
    assert service.failure_message(third, decision) == "0/2 nodes are available: 2 Insufficient cpu."
    assert _free_milli_cpu(service) == {"n0": 1000, "n1": 1000}
    assert service.counts() == {"nodes": 2, "pods": 0, "assumed": 2}
    assert not service.is_known("p2")


def test_forget_rolls_back_an_assumption() -> None:
    service = _service("best-fit", _node("n0"))
    assert _decide_node(service, _pod("p0")) == "n0"
    assert _free_milli_cpu(service) == {"n0": 1000}
    assert _free_scalar(service, "pods") == {"n0": 109}
    service.forget("p0")
    assert _free_milli_cpu(service) == {"n0": 4000}
    assert _free_scalar(service, "pods") == {"n0": 110}
    assert not service.is_known("p0")
    assert _decide_node(service, _pod("p1")) == "n0"  # the room is usable again


def test_forget_after_bound_keeps_the_pod() -> None:
    """Once the binding is made the informer's view wins: a late forget does not free the node."""
    service = _service("best-fit", _node("n0"))
    _decide_node(service, _pod("p0"))
    service.bound("p0")
    service.forget("p0")
    assert _free_milli_cpu(service) == {"n0": 1000}
    # assumed until the informer shows it bound, then bound
    assert service.counts() == {"nodes": 1, "pods": 0, "assumed": 1}
    record = service.pods["p0"]
    service.observe_bound("p0", record.pod, "n0")
    assert service.counts() == {"nodes": 1, "pods": 1, "assumed": 0}
    assert _free_milli_cpu(service) == {"n0": 1000}  # confirmed without a second count


def test_a_relist_read_before_the_binding_does_not_drop_the_bound_pod() -> None:
    """The binder succeeded, then a relist that was read before the binding arrives: it does not list
    the pod as bound, yet the pod's resources stay taken until the informer says otherwise."""
    service = _service("best-fit", _node("n0"))
    _decide_node(service, _pod("p0"))
    service.bound("p0")
    service.replace_bound({})
    assert _free_milli_cpu(service) == {"n0": 1000}


# ---------------------------------------------------------------------- pods bound by anyone


@pytest.mark.parametrize("policy", POLICIES)
def test_pod_bound_by_another_scheduler_counts(policy: str) -> None:
    service = _service(policy, _node("n0"), _node("n1"))
    service.observe_bound("other", _pod("other"), "n0")
    assert _free_milli_cpu(service) == {"n0": 1000, "n1": 4000}
    assert _decide_node(service, _pod("p0")) == "n1"
    assert service.decide("p1", _pod("p1")).placement is None  # no over-commit of n0
    assert service.counts() == {"nodes": 2, "pods": 1, "assumed": 1}


def test_informer_confirming_an_assumption_does_not_double_count() -> None:
    service = _service("best-fit", _node("n0"))
    pod = _pod("p0", cpu="1")
    assert _decide_node(service, pod) == "n0"
    for _ in range(3):  # the binding's MODIFIED event, then status updates of the bound pod
        service.observe_bound("p0", pod, "n0")
    assert _free_milli_cpu(service) == {"n0": 3000}
    assert _free_scalar(service, "pods") == {"n0": 109}
    assert service.counts() == {"nodes": 1, "pods": 1, "assumed": 0}


def test_informer_seeing_it_on_another_node_moves_it() -> None:
    service = _service("best-fit", _node("n0"), _node("n1"))
    pod = _pod("p0", cpu="1")
    assert _decide_node(service, pod) == "n0"  # equal nodes: the first in order
    service.observe_bound("p0", pod, "n1")  # bound elsewhere (another replica won the race)
    assert _free_milli_cpu(service) == {"n0": 4000, "n1": 3000}
    assert _free_scalar(service, "pods") == {"n0": 110, "n1": 109}
    service.remove_pod("p0")
    assert _free_milli_cpu(service) == {"n0": 4000, "n1": 4000}


def test_remove_pod_frees() -> None:
    service = _service("best-fit", _node("n0"))
    service.observe_bound("a", _pod("a", cpu="1", memory="2Gi"), "n0")
    service.observe_bound("b", _pod("b", cpu="2", memory="4Gi"), "n0")
    assert service.remove_pod("a")
    assert not service.remove_pod("a")
    state = service.state
    assert state.free_milli_cpu.tolist() == [2000]  # 4000 - 2000 (b)
    assert state.free_memory_bytes.tolist() == [12 * GIB]  # 16Gi - 4Gi (b)
    assert _free_scalar(service, "pods") == {"n0": 109}


def test_replace_bound_keeps_assumptions_and_drops_the_rest() -> None:
    service = _service("best-fit", _node("n0", cpu="8"))
    service.observe_bound("gone", _pod("gone", cpu="1"), "n0")
    service.observe_bound("kept", _pod("kept", cpu="1"), "n0")
    _decide_node(service, _pod("assumed", cpu="1"))
    service.replace_bound({"kept": (_pod("kept", cpu="1"), "n0", None), "new": (_pod("new", cpu="2"), "n0", None)})
    assert {uid for uid in service.pods} == {"kept", "new", "assumed"}
    assert _free_milli_cpu(service) == {"n0": 4000}  # 8000 - 1000 (kept) - 2000 (new) - 1000 (assumed)


# ---------------------------------------------------------------------- node changes and rebuilds


def _populated() -> RegionalScheduler:
    service = _service("best-fit", _node("n0"), _node("n1"))
    service.observe_bound("a", _pod("a", cpu="1"), "n0")
    service.observe_bound("b", _pod("b", cpu="500m"), "n1")
    assert _decide_node(service, _pod("c", cpu="2")) == "n0"  # best fit: n0 has less left over
    assert _free_milli_cpu(service) == {"n0": 1000, "n1": 3500}
    return service


@pytest.mark.parametrize(
    ("change", "free_after"),
    [
        pytest.param(lambda s: s.upsert_node(_node("n2", cpu="8")), {"n0": 1000, "n1": 3500, "n2": 8000},
                     id="node-added"),
        # n1 grows to 16 CPU: 16000 - 500 (b).
        pytest.param(lambda s: s.upsert_node(_node("n1", cpu="16")), {"n0": 1000, "n1": 15500}, id="node-grown"),
        # n0 shrinks to 2 CPU under a (1) and c (2): over-committed, shown as it is.
        pytest.param(lambda s: s.upsert_node(_node("n0", cpu="2")), {"n0": -1000, "n1": 3500}, id="node-shrunk"),
        pytest.param(lambda s: s.remove_node("n1"), {"n0": 1000}, id="node-removed"),
        pytest.param(lambda s: s.replace_nodes([_node("n1"), _node("n0"), _node("a-first")]),
                     {"a-first": 4000, "n0": 1000, "n1": 3500}, id="relist-reorders"),
    ],
)
def test_node_change_rebuilds_and_keeps_pods_counted(change: Any, free_after: dict[str, int]) -> None:
    service = _populated()
    before = service.state
    rebuilds = service.rebuilds
    change(service)
    after = service.state
    assert after is not before
    assert service.rebuilds == rebuilds + 1
    assert _free_milli_cpu(service) == free_after
    assert service.counts()["pods"] + service.counts()["assumed"] == 3


def test_unchanged_node_does_not_rebuild() -> None:
    service = _populated()
    before = service.state
    assert not service.upsert_node(_node("n0"))
    service.replace_nodes([_node("n1"), _node("n0")])
    assert not service.remove_node("unknown")
    assert service.state is before


def test_burst_of_node_changes_is_one_rebuild() -> None:
    service = _populated()
    rebuilds = service.rebuilds
    for i in range(5):
        service.upsert_node(_node(f"m{i}"))
    assert service.rebuilds == rebuilds  # lazy: nothing rebuilt until the state is read
    assert service.state.n_nodes == 7
    assert service.rebuilds == rebuilds + 1


def test_pods_recorded_while_dirty_are_counted_once() -> None:
    service = _service("best-fit", _node("n0"))
    service.upsert_node(_node("n1"))  # dirty
    service.observe_bound("a", _pod("a", cpu="1"), "n1")
    service.observe_bound("b", _pod("b", cpu="1"), "n0")
    service.remove_pod("b")
    assert _free_milli_cpu(service) == {"n0": 4000, "n1": 3000}


def test_pod_on_unknown_node_counts_once_the_node_appears() -> None:
    service = _service("best-fit", _node("n0"))
    service.observe_bound("early", _pod("early", cpu="3"), "late")
    assert _free_milli_cpu(service) == {"n0": 4000}
    assert service.pods["early"].placement is None
    service.upsert_node(_node("late"))
    assert _free_milli_cpu(service) == {"late": 1000, "n0": 4000}
    assert _decide_node(service, _pod("p")) == "n0"  # "late" has 1 CPU left
    service.remove_node("late")
    assert _free_milli_cpu(service) == {"n0": 1000}
    service.upsert_node(_node("late"))  # back again: still counted exactly once
    assert _free_milli_cpu(service) == {"late": 1000, "n0": 1000}


def test_assumption_survives_a_rebuild_on_its_devices() -> None:
    service = _service("best-fit", _node("g", cpu="32", gpus=2))
    service.observe_bound("other", _pod("other", cpu="1", **{"meridian.io/gpu-milli": "300"}), "g", (1,))
    decision = service.decide("mine", _pod("mine", cpu="1", **{"meridian.io/gpu-milli": "600"}))
    assert decision.placement is not None
    devices = decision.placement.devices
    before = _gpu_free(service, "g")
    service.upsert_node(_node("cpu-only"))
    assert _gpu_free(service, "g") == before
    assert service.pods["mine"].devices == devices


# ---------------------------------------------------------------------- kube-style diagnosis


_NOT_READY = {"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}


def test_untolerated_taint_message_and_counts() -> None:
    # Two label groups with the same taint: one reason for all three nodes.
    service = _service("best-fit", _node("t0", taints=[_NOT_READY], labels={"zone": "a"}),
                       _node("t1", taints=[_NOT_READY], labels={"zone": "a"}),
                       _node("t2", taints=[_NOT_READY], labels={"zone": "b"}),
                       _node("small", cpu="1"))
    pod = _pod("p")
    decision = service.decide("p", pod)
    assert decision.placement is None
    assert service.failure_message(pod, decision) == (
        "0/4 nodes are available: 1 Insufficient cpu, 3 node(s) had untolerated taint {node.kubernetes.io/not-ready: }.")


def test_taint_with_value_and_the_first_untolerated_one() -> None:
    taints = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"},
              {"key": "spot", "value": "true", "effect": "PreferNoSchedule"},
              {"key": "maintenance", "value": "now", "effect": "NoExecute"}]
    service = _service("best-fit", _node("t", taints=taints))
    tolerates_dedicated = [{"key": "dedicated", "operator": "Equal", "value": "ml", "effect": "NoSchedule"}]
    for tolerations, reason in [
        (None, "node(s) had untolerated taint {dedicated: ml}"),
        # PreferNoSchedule is a preference: the next hard taint is the one reported.
        (tolerates_dedicated, "node(s) had untolerated taint {maintenance: now}"),
    ]:
        pod = _pod("p", cpu="1", tolerations=tolerations)
        decision = service.decide("p", pod)
        assert decision.placement is None
        assert service.failure_message(pod, decision) == f"0/1 nodes are available: 1 {reason}."


def test_too_many_pods() -> None:
    service = _service("best-fit", _node("n0", pods="2"))
    assert _decide_node(service, _pod("a", cpu="100m")) == "n0"
    assert _decide_node(service, _pod("b", cpu="100m")) == "n0"
    pod = _pod("c", cpu="100m")
    decision = service.decide("c", pod)
    assert decision.placement is None
    assert service.failure_message(pod, decision) == "0/1 nodes are available: 1 Too many pods."


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        # one node short of both: counted once per resource, as kube-scheduler does.
        pytest.param(_pod("p", cpu="8", memory="32Gi"),
                     "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory.", id="cpu-and-memory"),
        pytest.param(_pod("p", cpu="1", **{"example.com/fpga": "1"}),
                     "0/1 nodes are available: 1 Insufficient example.com/fpga.", id="extended-no-node-has"),
        pytest.param(_pod("p", cpu="1", **{"ephemeral-storage": "200Gi"}),
                     "0/1 nodes are available: 1 Insufficient ephemeral-storage.", id="ephemeral-storage"),
        pytest.param(_pod("p", cpu="1", **{"nvidia.com/gpu": "1"}),
                     "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.", id="whole-gpu"),
    ],
)
def test_insufficient_resource_messages(pod: Pod, message: str) -> None:
    service = _service("best-fit", _node("n0", **{"ephemeral-storage": "100Gi"}))
    decision = service.decide(_uid(pod), pod)
    assert decision.placement is None
    assert service.failure_message(pod, decision) == message


def test_reasons_sorted_as_strings() -> None:
    """kube-scheduler sorts "<count> <reason>" as strings: "10 …" before "2 …" before "3 …"."""
    nodes = [_node(f"t{i:02d}", cpu="64", taints=[_NOT_READY]) for i in range(10)]
    nodes += [_node(f"c{i}", cpu="1", memory="64Gi") for i in range(2)]
    nodes += [_node(f"m{i}", cpu="64", memory="1Gi") for i in range(3)]
    service = _service("best-fit", *nodes)
    pod = _pod("p", cpu="8", memory="8Gi")
    decision = service.decide("p", pod)
    assert decision.placement is None
    assert service.failure_message(pod, decision) == (
        "0/15 nodes are available: 10 node(s) had untolerated taint {node.kubernetes.io/not-ready: }, "
        "2 Insufficient cpu, 3 Insufficient memory.")


def test_node_selector_message_and_no_nodes() -> None:
    service = _service("best-fit", _node("n0", labels={"zone": "a"}))
    pod = ko.pod_from_api({"metadata": {"name": "p", "namespace": "ns"},
                           "spec": {"nodeSelector": {"zone": "b"}, "containers": [{"name": "c"}]}})
    decision = service.decide("p", pod)
    assert service.failure_message(pod, decision) == (
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.")
    empty = _service("best-fit")
    decision = empty.decide("p", pod)
    assert decision.placement is None
    assert empty.failure_message(pod, decision) == "0/0 nodes are available: no nodes registered."


# ---------------------------------------------------------------------- the extender's evaluation


def test_evaluate_scores_feasible_and_explains_the_rest() -> None:
    service = _service("best-fit", _node("small", cpu="8"), _node("big", cpu="64"), _node("tiny", cpu="2"),
                       _node("tainted", cpu="64", taints=[_NOT_READY]))
    pod = _pod("p", cpu="4")
    evaluation = service.evaluate(pod, ["small", "big", "tiny", "tainted", "ghost"])
    # best-fit: leftover = 0.5 × (free − 4000) / 128000 + 0.5 × 0 (no GPUs); score = floor((1 − leftover) × 100).
    # small: 0.5 × 4000 / 128000 = 0.015625 → floor(98.4375) = 98; big: 0.5 × 60000 / 128000 = 0.234375 → 76.
    assert evaluation.scores == {"small": 98.0, "big": 76.0}
    assert evaluation.rejected == {
        "tiny": "Insufficient cpu",
        "tainted": "node(s) had untolerated taint {node.kubernetes.io/not-ready: }",
        "ghost": "node unknown to Meridian (not in its node informer yet)",
    }
    assert service.counts()["assumed"] == 0  # evaluating decides nothing
    assert _free_milli_cpu(service)["small"] == 8000


def test_evaluate_only_unknown_nodes() -> None:
    service = _service("fgd", _node("n0"))
    evaluation = service.evaluate(_pod("p"), ["x", "y"])
    assert evaluation.scores == {}
    assert set(evaluation.rejected) == {"x", "y"}


def test_evaluate_with_fgd_scores_every_feasible_node() -> None:
    service = _service("fgd", _node("g0", cpu="32", gpus=2), _node("g1", cpu="32", gpus=1), _node("cpu", cpu="2"))
    pod = _pod("p", cpu="4", **{"meridian.io/gpu-milli": "500"})
    evaluation = service.evaluate(pod, ["g0", "g1", "cpu"])
    assert set(evaluation.scores) == {"g0", "g1"}
    assert all(0.0 <= s <= 100.0 for s in evaluation.scores.values())
    assert evaluation.rejected == {"cpu": "Insufficient cpu, Insufficient meridian.io/gpu-milli"}


# ---------------------------------------------------------------------- shared GPUs


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize(
    ("share", "second_fits", "left"),
    [
        # 1000 − 600 = 400 < 600: the second share does not fit on the one device.
        pytest.param("600", False, [400], id="two-600s-do-not-fit"),
        # 1000 − 400 − 400 = 200.
        pytest.param("400", True, [200], id="two-400s-fit"),
    ],
)
def test_shared_gpu_pods_on_one_device(policy: str, share: str, second_fits: bool, left: list[int]) -> None:
    service = _service(policy, _node("g", cpu="32", gpus=1))
    assert _decide_node(service, _pod("a", cpu="1", **{"meridian.io/gpu-milli": share})) == "g"
    second = _pod("b", cpu="1", **{"meridian.io/gpu-milli": share})
    decision = service.decide("b", second)
    assert (decision.placement is not None) is second_fits
    assert _gpu_free(service, "g") == left
    if not second_fits:
        assert service.failure_message(second, decision) == (
            "0/1 nodes are available: 1 Insufficient meridian.io/gpu-milli.")


def test_shares_are_device_by_device_not_summed() -> None:
    service = _service("best-fit", _node("g", cpu="32", gpus=2))
    for name in ("a", "b"):
        assert _decide_node(service, _pod(name, cpu="1", **{"meridian.io/gpu-milli": "600"})) == "g"
    assert sorted(_gpu_free(service, "g")) == [400, 400]  # 800 free in all, 400 on each device
    assert service.decide("c", _pod("c", cpu="1", **{"meridian.io/gpu-milli": "600"})).placement is None


@pytest.mark.parametrize(
    ("devices", "gpu_free"),
    [
        pytest.param((1,), [1000, 300], id="recorded-device-kept"),
        # no annotation (bound by another scheduler): the state's tightest-fit rule, the first of equals.
        pytest.param(None, [300, 1000], id="no-annotation"),
        pytest.param((5,), [300, 1000], id="device-out-of-range-ignored"),
    ],
)
def test_observed_share_lands_on_its_recorded_device(devices: tuple[int, ...] | None, gpu_free: list[int]) -> None:
    service = _service("best-fit", _node("g", cpu="32", gpus=2))
    service.observe_bound("s", _pod("s", cpu="1", **{"meridian.io/gpu-milli": "700"}), "g", devices)
    assert _gpu_free(service, "g") == gpu_free


def test_bound_pod_moving_device_is_recounted() -> None:
    service = _service("best-fit", _node("g", cpu="32", gpus=2))
    pod = _pod("s", cpu="1", **{"meridian.io/gpu-milli": "700"})
    service.observe_bound("s", pod, "g", (1,))
    service.observe_bound("s", pod, "g", (0,))
    assert _gpu_free(service, "g") == [300, 1000]
    assert _free_milli_cpu(service) == {"g": 31000}


def test_whole_gpu_pods_take_idle_devices() -> None:
    service = _service("fgd", _node("g", cpu="32", gpus=4))
    service.observe_bound("share", _pod("share", cpu="1", **{"meridian.io/gpu-milli": "200"}), "g", (0,))
    assert _decide_node(service, _pod("w", cpu="1", **{"nvidia.com/gpu": "3"})) == "g"
    assert _gpu_free(service, "g") == [800, 0, 0, 0]
    pod = _pod("x", cpu="1", **{"nvidia.com/gpu": "1"})
    decision = service.decide("x", pod)
    assert decision.placement is None  # device 0 is partly used: not an idle GPU
    assert service.failure_message(pod, decision) == "0/1 nodes are available: 1 Insufficient nvidia.com/gpu."


# ---------------------------------------------------------------------- over-committed accounting (strict=False)


def test_over_committed_observed_pods_recorded_and_released_exactly() -> None:
    service = _service("best-fit", _node("n0", pods="2", gpus=1))
    bound = {
        "a": _pod("a", cpu="3", memory="10Gi", **{"meridian.io/gpu-milli": "600"}),
        "b": _pod("b", cpu="3", memory="10Gi", **{"meridian.io/gpu-milli": "600"}),
        "c": _pod("c", cpu="1", **{"nvidia.com/gpu": "2"}),
    }
    for uid, pod in bound.items():  # bound by others past what the node holds: counted as they are
        service.observe_bound(uid, pod, "n0")
    state = service.state
    # cpu 4000 − 3000 − 3000 − 1000 = −3000; memory 16Gi − 10Gi − 10Gi − 1Gi = −5Gi; pods 2 − 3 = −1.
    assert state.free_milli_cpu.tolist() == [-3000]
    assert state.free_memory_bytes.tolist() == [-5 * GIB]
    assert _free_scalar(service, "pods") == {"n0": -1}
    # GPU: 1000 − 600 (a) − 600 (b, on the freest device though it cannot hold it) − 1000 (c: 2 GPUs, the node has 1).
    assert _gpu_free(service, "n0") == [-1200]
    pod = _pod("p", cpu="100m")
    decision = service.decide("p", pod)
    assert decision.placement is None
    assert service.failure_message(pod, decision) == (
        "0/1 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 1 Too many pods.")
    service.upsert_node(_node("other"))  # a rebuild re-counts them the same way
    assert _free_milli_cpu(service) == {"n0": -3000, "other": 4000}
    assert _gpu_free(service, "n0") == [-1200]
    for uid in bound:
        assert service.remove_pod(uid)
    state = service.state
    assert state.free_milli_cpu.tolist() == [4000, 4000]
    assert state.free_memory_bytes.tolist() == [16 * GIB, 16 * GIB]
    assert _free_scalar(service, "pods") == {"n0": 2, "other": 110}
    assert _gpu_free(service, "n0") == [1000]
    assert np.all(state.shape_class_count == 0)


def test_pod_asking_for_a_resource_its_node_lacks_is_recorded() -> None:
    service = _service("best-fit", _node("n0"))
    pod = _pod("fpga", cpu="1", **{"example.com/fpga": "1"})
    service.observe_bound("fpga", pod, "n0")
    assert _free_milli_cpu(service) == {"n0": 3000}
    assert _free_scalar(service, "pods") == {"n0": 109}
    service.remove_pod("fpga")
    assert _free_milli_cpu(service) == {"n0": 4000}
    assert _free_scalar(service, "pods") == {"n0": 110}


def test_directly_built_model_objects() -> None:
    """The service takes Meridian's own Node/Pod too (no Kubernetes scalars: the simulator's shape)."""
    service = _service("fgd", Node(name="n0", capacity=Resources(milli_cpu=4000, memory_bytes=8 * GIB, gpu=1),
                                   gpu_model="T4"))
    pod = Pod(name="p", requests=Resources(milli_cpu=1000, gpu_milli=500))
    assert _decide_node(service, pod) == "n0"
    assert _gpu_free(service, "n0") == [500]


def test_telemetry_lands_on_known_nodes_and_an_unset_pue_stays_unset() -> None:
    """Reports for nodes the informer knows fill their measured columns; a report for a node it does
    not know is ignored; a PUE of 0 (unset) is NaN, so the summary falls back to 1 instead of zeroing
    the cluster's carbon."""
    import math

    from meridian.bus import StreamEntry
    from meridian.telemetry import decode_reports
    from protos import telemetry_pb2 as pb

    service = _service("best-fit", _node("n0"), _node("n1"))
    reports = [pb.NodeTelemetry(cluster="c", node="n0", sequence=1, power_watts=250.0, pue=0.0),
               pb.NodeTelemetry(cluster="c", node="n1", sequence=1, power_watts=90.0, pue=1.3),
               pb.NodeTelemetry(cluster="c", node="ghost", sequence=1, power_watts=1.0, pue=1.1)]
    batch, rejected = decode_reports([StreamEntry(f"1-{i}", r.SerializeToString()) for i, r in enumerate(reports)])
    assert not rejected
    assert service.apply_telemetry(batch, np.arange(len(batch))) == 2
    state = service.state
    assert state.power_watts[state.index["n0"]] == 250.0 and state.power_watts[state.index["n1"]] == 90.0
    assert math.isnan(service.pue[state.index["n0"]]) and service.pue[state.index["n1"]] == pytest.approx(1.3)
