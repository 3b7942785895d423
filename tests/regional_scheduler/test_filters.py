import pytest

from meridian.cluster_state import ClusterState
from meridian.model import (
    GIB,
    Node,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    Pod,
    Resources,
    Taint,
    TaintEffect,
    Toleration,
)
from regional_scheduler.filters import run_filters

NODES = [
    Node(name="gpu-t4", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB, gpu=2), gpu_model="T4",
         labels={"zone": "a", "gpus": "2", "accelerator": "t4"}),
    Node(name="cpu", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB), labels={"zone": "b", "gpus": "0"}),
    Node(name="tainted", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB), labels={"zone": "a"},
         taints=(Taint(key="dedicated", value="ml", effect=TaintEffect.NO_SCHEDULE),)),
    Node(name="evicting", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB), labels={"zone": "c"},
         taints=(Taint(key="maintenance", effect=TaintEffect.NO_EXECUTE),)),
    Node(name="soft", capacity=Resources(milli_cpu=8000, memory_bytes=16 * GIB), labels={"zone": "c"},
         taints=(Taint(key="spot", effect=TaintEffect.PREFER_NO_SCHEDULE),)),
]


def _pod(**kw: object) -> Pod:
    return Pod(name="p", requests=kw.pop("requests", Resources(milli_cpu=100)), **kw)  # type: ignore[arg-type]


def _req(key: str, op: str, *values: str) -> NodeSelectorTerm:
    return NodeSelectorTerm(match_expressions=(NodeSelectorRequirement(key=key, operator=op, values=values),))


@pytest.mark.parametrize(
    ("pod", "feasible"),
    [
        pytest.param(_pod(), {"gpu-t4", "cpu", "soft"}, id="untolerated-taints-reject"),
        pytest.param(_pod(node_selector={"zone": "a"}), {"gpu-t4"}, id="node-selector"),
        pytest.param(_pod(tolerations=(Toleration(key="dedicated", operator="Equal", value="ml"),)),
                     {"gpu-t4", "cpu", "tainted", "soft"}, id="toleration-equal"),
        pytest.param(_pod(tolerations=(Toleration(key="dedicated", operator="Equal", value="web"),)),
                     {"gpu-t4", "cpu", "soft"}, id="toleration-wrong-value"),
        pytest.param(_pod(tolerations=(Toleration(operator="Exists"),)),
                     {"gpu-t4", "cpu", "tainted", "evicting", "soft"}, id="exists-empty-key-tolerates-all"),
        pytest.param(_pod(tolerations=(Toleration(key="maintenance", operator="Exists",
                                                  effect=TaintEffect.NO_EXECUTE),)),
                     {"gpu-t4", "cpu", "evicting", "soft"}, id="exists-with-effect"),
        pytest.param(_pod(tolerations=(Toleration(key="maintenance", operator="Exists",
                                                  effect=TaintEffect.NO_SCHEDULE),)),
                     {"gpu-t4", "cpu", "soft"}, id="effect-mismatch"),
        pytest.param(_pod(required_affinity=(_req("zone", "In", "a", "c"),)), {"gpu-t4", "soft"}, id="affinity-in"),
        pytest.param(_pod(required_affinity=(_req("zone", "NotIn", "a"),)), {"cpu", "soft"}, id="affinity-notin"),
        pytest.param(_pod(required_affinity=(_req("accelerator", "Exists"),)), {"gpu-t4"}, id="affinity-exists"),
        pytest.param(_pod(required_affinity=(_req("gpus", "DoesNotExist"),)), {"soft"}, id="affinity-doesnotexist"),
        pytest.param(_pod(required_affinity=(_req("gpus", "Gt", "1"),)), {"gpu-t4"}, id="affinity-gt"),
        pytest.param(_pod(required_affinity=(_req("gpus", "Lt", "1"),)), {"cpu"}, id="affinity-lt"),
        pytest.param(_pod(required_affinity=(_req("zone", "In", "b"), _req("accelerator", "Exists"))),
                     {"gpu-t4", "cpu"}, id="terms-are-ored"),
        pytest.param(_pod(requests=Resources(gpu=1)), {"gpu-t4"}, id="whole-gpu"),
        pytest.param(_pod(requests=Resources(gpu=3)), set(), id="too-many-gpus"),
        pytest.param(_pod(requests=Resources(gpu_milli=500)), {"gpu-t4"}, id="shared-gpu"),
        pytest.param(_pod(requests=Resources(gpu=1), allowed_gpu_models=("V100M32",)), set(), id="gpu-model-mismatch"),
        pytest.param(_pod(requests=Resources(gpu=1), allowed_gpu_models=("V100M32", "T4")), {"gpu-t4"},
                     id="gpu-model-match"),
        pytest.param(_pod(requests=Resources(milli_cpu=9000)), set(), id="cpu-too-big"),
        pytest.param(_pod(requests=Resources(memory_bytes=17 * GIB)), set(), id="memory-too-big"),
    ],
)
def test_filter_semantics(pod: Pod, feasible: set[str]) -> None:
    state = ClusterState.from_nodes(NODES)
    mask, _ = run_filters(state, pod)
    assert {state.names[i] for i in mask.nonzero()[0]} == feasible


def test_shared_gpu_needs_one_device_with_enough_free() -> None:
    state = ClusterState.from_nodes(NODES[:1])
    first = Pod(name="a", requests=Resources(gpu_milli=700))
    state.allocate(first, state.choose_devices(0, first))
    second = Pod(name="b", requests=Resources(gpu_milli=700))
    state.allocate(second, state.choose_devices(0, second))
    # 300 + 300 milli-GPU are free in total, but no single device has 400.
    mask, diagnosis = run_filters(state, Pod(name="c", requests=Resources(gpu_milli=400)))
    assert not mask.any()
    assert diagnosis.rejected_by["NodeResourcesFit"] == 1
    # And a whole-GPU pod needs a completely free device.
    mask, _ = run_filters(state, Pod(name="d", requests=Resources(gpu=1)))
    assert not mask.any()


def test_diagnosis_names_the_failing_constraint() -> None:
    state = ClusterState.from_nodes(NODES)
    _, diagnosis = run_filters(state, _pod(node_selector={"zone": "z"}))
    assert diagnosis.rejected_by["NodeSelector"] == len(NODES)
    assert "NodeSelector" in diagnosis.summary


def test_stale_node_is_unschedulable() -> None:
    state = ClusterState.from_nodes(NODES[1:2])
    state.schedulable[0] = False
    mask, diagnosis = run_filters(state, _pod())
    assert not mask.any() and diagnosis.rejected_by["NodeUnschedulable"] == 1
