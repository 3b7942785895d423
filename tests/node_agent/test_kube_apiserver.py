"""The node agent in the cluster (issue 23 item 5), against the session's real kube-apiserver.

The agent's identity is the DaemonSet's: its ServiceAccount and the RBAC that deploy/ binds to it,
found by scanning every YAML document under deploy/ (whatever its kustomize layout): the
``serviceAccountName`` of the DaemonSet, the (Cluster)RoleBindings naming that ServiceAccount, and the
(Cluster)Roles they refer to. They are created in the test namespace (cluster-scoped objects under a
per-test name, the binding's subject rewritten to the test namespace), so the agent runs with exactly
the permissions a cluster would give it, through a ServiceAccount token kubeconfig.

The agent is built as ``python -m node_agent`` builds it (``build_agent`` from settings read from the
environment, the node name from ``NODE_NAME`` as the downward API sets it); only the in-cluster config
is replaced by the kubeconfig (``MERIDIAN_AGENT_KUBE__KUBECONFIG``), since no pod runs here.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client import ApiClient, AuthorizationV1Api, CoreV1Api, RbacAuthorizationV1Api
from kubernetes.client.exceptions import ApiException

from meridian.bus import RedisStreamBus, telemetry_stream
from meridian.envtest import ControlPlane, apply_rbac_documents, wait_for
from node_agent.cli import build_agent
from node_agent.collectors.kube import KubeNodeCollector
from node_agent.settings import AgentSettings
from protos import telemetry_pb2 as pb
from tests.kube_helpers import bind_pod, fresh_namespace, ready_nodes

pytestmark = pytest.mark.kubernetes

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
ROLE_KINDS = ("ClusterRole", "Role")
BINDING_KINDS = ("ClusterRoleBinding", "RoleBinding")


# ------------------------------------------------------------------------ the agent's RBAC from deploy/


def deploy_documents() -> list[dict[str, Any]]:
    """Every YAML mapping with a ``kind`` under deploy/ (kustomization files and patches included;
    callers pick what they need). A file that does not parse is skipped: the scan must not depend on
    the layout or on files that are not manifests."""
    docs = []
    for path in sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]):
        try:
            loaded = list(yaml.safe_load_all(path.read_text()))
        except yaml.YAMLError:
            continue
        docs += [d for d in loaded if isinstance(d, dict) and isinstance(d.get("kind"), str)]
    return docs


def _meta(doc: dict[str, Any]) -> dict[str, Any]:
    return doc.get("metadata") or {}


def agent_service_account(docs: list[dict[str, Any]]) -> str:
    """The ServiceAccount of the node agent's DaemonSet (the only DaemonSet Meridian deploys)."""
    names = {((d.get("spec") or {}).get("template") or {}).get("spec", {}).get("serviceAccountName")
             for d in docs if d["kind"] == "DaemonSet"}
    names.discard(None)
    assert len(names) == 1, f"expected one DaemonSet ServiceAccount under deploy/, found {sorted(names)}"
    return names.pop()


def _unique(docs: list[dict[str, Any]], what: str) -> list[dict[str, Any]]:
    """One document per (kind, namespace, name); the same object defined twice differently is an error."""
    seen: dict[tuple[str, str | None, str], dict[str, Any]] = {}
    for doc in docs:
        key = (doc["kind"], _meta(doc).get("namespace"), _meta(doc).get("name"))
        if key in seen and seen[key] != doc:
            pytest.fail(f"deploy/ defines the {what} {key} twice, differently: which one binds the agent?")
        seen[key] = doc
    return list(seen.values())


def agent_rbac(docs: list[dict[str, Any]], service_account: str) -> tuple[list[dict], list[dict]]:
    """``(bindings, roles)``: the complete bindings whose subjects name the agent's ServiceAccount, and the
    complete roles they refer to (partial documents, e.g. kustomize patches, are left out)."""
    bindings = _unique([d for d in docs if d["kind"] in BINDING_KINDS and d.get("roleRef")
                        and any(s.get("kind") == "ServiceAccount" and s.get("name") == service_account
                                for s in d.get("subjects") or [])], "binding")
    roles = []
    for binding in bindings:
        ref = binding["roleRef"]
        found = [d for d in docs if d["kind"] == ref["kind"] and _meta(d).get("name") == ref["name"]
                 and "rules" in d and (ref["kind"] == "ClusterRole"
                                       or _meta(d).get("namespace") == _meta(binding).get("namespace"))]
        assert found, f"{binding['kind']} {_meta(binding)['name']} refers to {ref}, which deploy/ does not define"
        roles += found
    return bindings, _unique(roles, "role")


def for_test_namespace(bindings: list[dict], roles: list[dict], service_account: str, namespace: str) -> list[dict]:
    """The same objects for this test: namespaced ones in ``namespace``, cluster-scoped ones under a
    name of their own (other tests and workers share the cluster), subjects pointing at ``namespace``."""

    def rename(kind: str, name: str) -> str:
        return f"{name}--{namespace}" if kind.startswith("Cluster") else name

    out: list[dict[str, Any]] = [{"apiVersion": "v1", "kind": "ServiceAccount",
                                  "metadata": {"name": service_account, "namespace": namespace}}]
    for doc in [*roles, *bindings]:
        meta = {"name": rename(doc["kind"], _meta(doc)["name"]), "labels": {"meridian.test/namespace": namespace}}
        if not doc["kind"].startswith("Cluster"):
            meta["namespace"] = namespace
        copy = {**doc, "metadata": meta}
        if doc["kind"] in BINDING_KINDS:
            copy["roleRef"] = {**doc["roleRef"], "name": rename(doc["roleRef"]["kind"], doc["roleRef"]["name"])}
            copy["subjects"] = [{**s, "namespace": namespace} if s.get("kind") == "ServiceAccount"
                                and s.get("name") == service_account else s for s in doc.get("subjects") or []]
        out.append(copy)
    return out


@pytest.fixture
def agent_kubeconfig(kube_control_plane: ControlPlane, kube_api: ApiClient, kube_namespace: str
                     ) -> Iterator[tuple[Path, list[dict]]]:
    """A kubeconfig for the agent's ServiceAccount with deploy/'s RBAC; yields it and the roles' rules."""
    docs = deploy_documents()
    service_account = agent_service_account(docs)
    bindings, roles = agent_rbac(docs, service_account)
    assert bindings and roles, f"deploy/ binds no role to the node agent's ServiceAccount {service_account!r}"
    objects = for_test_namespace(bindings, roles, service_account, kube_namespace)
    apply_rbac_documents(kube_api, objects)
    # The authorizer sees new bindings through its informers, a moment later: ask it (SubjectAccessReview)
    # until it grants the first rule, so the test never races it.
    rule = roles[0]["rules"][0]
    review = {"spec": {"user": f"system:serviceaccount:{kube_namespace}:{service_account}",
                       "resourceAttributes": {"group": rule.get("apiGroups", [""])[0], "resource": rule["resources"][0],
                                              "verb": rule["verbs"][0], "namespace": kube_namespace}}}
    authz = AuthorizationV1Api(kube_api)
    wait_for(lambda: authz.create_subject_access_review(review).status.allowed, timeout=10,
             message="the agent's RBAC to take effect")
    try:
        yield kube_control_plane.service_account_kubeconfig(kube_namespace, service_account), roles
    finally:
        rbac = RbacAuthorizationV1Api(kube_api)
        for doc in objects:
            with contextlib.suppress(ApiException):
                if doc["kind"] == "ClusterRoleBinding":
                    rbac.delete_cluster_role_binding(doc["metadata"]["name"])
                elif doc["kind"] == "ClusterRole":
                    rbac.delete_cluster_role(doc["metadata"]["name"])


# ------------------------------------------------------------------------------------ the cluster


def pod(name: str, *, cpu: str, memory: str, gpu: int = 0, init_cpu: str | None = None) -> dict[str, Any]:
    resources: dict[str, Any] = {"requests": {"cpu": cpu, "memory": memory}}
    if gpu:  # extended resources: requests must equal limits
        resources["requests"]["nvidia.com/gpu"] = str(gpu)
        resources["limits"] = {"nvidia.com/gpu": str(gpu)}
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                            "resources": resources}],
                            "terminationGracePeriodSeconds": 0}
    if init_cpu:
        spec["initContainers"] = [{"name": "init", "image": "registry.k8s.io/pause:3.10",
                                   "resources": {"requests": {"cpu": init_cpu, "memory": "64Mi"}}}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def other_namespace(kube_api: ApiClient) -> Iterator[str]:
    with fresh_namespace(kube_api) as name:
        yield name


# What the agent must report for its node: the pods below that are bound to it and not terminated.
# web: 500m / 256Mi; batch: max(app 250m / 128Mi + 1 GPU, init 1 CPU / 64Mi) = 1 CPU / 128Mi / 1 GPU;
# neighbour (another namespace): 100m / 32Mi. Not counted: elsewhere (another node), finished
# (Succeeded), unbound (no node).
EXPECTED_MILLI_CPU = 500 + 1000 + 100
EXPECTED_MEMORY = (256 + 128 + 32) * 2**20
EXPECTED_GPU = 1
TAINT = {"key": "dedicated", "value": "gpu", "effect": "NoSchedule"}
LABELS = {"topology.kubernetes.io/zone": "zone-a", "nvidia.com/gpu.product": "A100"}


@pytest.fixture
def agent_node(kube_api: ApiClient, kube_namespace: str, other_namespace: str) -> Iterator[tuple[str, str]]:
    """A Ready node with a GPU, a label set and a taint, the pods above; yields ``(node, other node)``."""
    run = uuid.uuid4().hex[:8]
    specs = [{"name": f"agent-{run}", "capacity": {"cpu": "8", "memory": "32Gi", "nvidia.com/gpu": "2"},
              "allocatable": {"cpu": "7500m", "memory": "30Gi", "nvidia.com/gpu": "2"},
              "labels": LABELS, "taints": [TAINT]},
             {"name": f"agent-other-{run}", "capacity": {"cpu": "4", "memory": "16Gi"}}]
    core = CoreV1Api(kube_api)
    with ready_nodes(kube_api, specs) as (names, _selector):
        node, other = names
        placed = [(kube_namespace, pod("web", cpu="500m", memory="256Mi"), node),
                  (kube_namespace, pod("batch", cpu="250m", memory="128Mi", gpu=1, init_cpu="1"), node),
                  (other_namespace, pod("neighbour", cpu="100m", memory="32Mi"), node),
                  (kube_namespace, pod("elsewhere", cpu="2", memory="1Gi"), other),
                  (kube_namespace, pod("finished", cpu="4", memory="4Gi"), node),
                  (kube_namespace, pod("unbound", cpu="3", memory="3Gi"), None)]
        for namespace, body, target in placed:
            core.create_namespaced_pod(namespace, body)
            if target is not None:
                assert bind_pod(kube_api, namespace, body["metadata"]["name"], target) == 201
        core.patch_namespaced_pod_status("finished", kube_namespace, {"status": {"phase": "Succeeded"}})
        yield node, other


# ------------------------------------------------------------------------------------------ tests


def test_the_agent_reads_its_node_and_pods_with_the_daemonsets_rbac(
        agent_kubeconfig: tuple[Path, list[dict]], agent_node: tuple[str, str], kube_namespace: str) -> None:
    kubeconfig, _ = agent_kubeconfig
    node, _ = agent_node
    info = KubeNodeCollector(node, kubeconfig=kubeconfig).fetch()  # fetch: an RBAC refusal raises here
    assert info.name == node
    assert (info.capacity_milli_cpu, info.capacity_memory_bytes, info.capacity_gpu) == (8000, 32 * 2**30, 2)
    assert (info.allocatable_milli_cpu, info.allocatable_memory_bytes, info.allocatable_gpu) == (7500, 30 * 2**30, 2)
    assert LABELS.items() <= info.labels.items() and info.gpu_model == "A100"
    # Our taint; the node lifecycle controller may add its own node.kubernetes.io/* ones, nothing else may.
    assert [t for t in info.taints if not t[0].startswith("node.kubernetes.io/")] == [
        (TAINT["key"], TAINT["value"], TAINT["effect"])]
    assert (info.requested_milli_cpu, info.requested_memory_bytes, info.requested_gpu) == (
        EXPECTED_MILLI_CPU, EXPECTED_MEMORY, EXPECTED_GPU)


def _status(call: Any) -> int:
    try:
        call()
    except ApiException as exc:
        return int(exc.status)
    return 200


def test_the_agents_identity_is_refused_what_its_rbac_does_not_grant(
        kube_control_plane: ControlPlane, agent_kubeconfig: tuple[Path, list[dict]], agent_node: tuple[str, str],
        kube_namespace: str) -> None:
    kubeconfig, roles = agent_kubeconfig
    node, other = agent_node
    granted = {(resource, verb) for role in roles for rule in role["rules"]
               for resource in rule.get("resources", []) for verb in rule.get("verbs", [])}
    assert not any("*" in pair for pair in granted), f"wildcards in the agent's RBAC: {sorted(granted)}"
    with kube_control_plane.api_client(kubeconfig) as api:
        core = CoreV1Api(api)
        # What the collector calls is allowed (get its node, list pods)...
        assert _status(lambda: core.read_node(node)) == 200
        assert _status(lambda: core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node}")) == 200
        # ...and what it does not call is refused, for the resources and verbs deploy/ does not grant.
        refused = {
            ("secrets", "list"): lambda: core.list_namespaced_secret(kube_namespace),
            ("configmaps", "list"): lambda: core.list_namespaced_config_map(kube_namespace),
            ("nodes", "list"): lambda: core.list_node(),
            ("nodes", "patch"): lambda: core.patch_node(other, {"metadata": {"labels": {"x": "y"}}}),
            ("pods", "get"): lambda: core.read_namespaced_pod("web", kube_namespace),
            ("pods", "create"): lambda: core.create_namespaced_pod(kube_namespace, pod("intruder", cpu="1",
                                                                                      memory="1Mi")),
            ("pods", "delete"): lambda: core.delete_namespaced_pod("web", kube_namespace),
        }
        for (resource, verb), call in refused.items():
            assert (resource, verb) not in granted, f"deploy/ now grants {verb} {resource}: update this test"
            assert _status(call) == 403, f"the agent's identity may {verb} {resource}"


def test_the_agent_publishes_its_node_from_the_real_api(
        agent_kubeconfig: tuple[Path, list[dict]], agent_node: tuple[str, str], redis_url: str, key_prefix: str,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DaemonSet's wiring: settings from the environment (NODE_NAME from the downward API), the agent
    built by ``build_agent``, one tick onto the cluster's telemetry stream in the real Redis."""
    kubeconfig, _ = agent_kubeconfig
    node, _ = agent_node
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("NODE_NAME", node)
    monkeypatch.setenv("MERIDIAN_AGENT_CLUSTER", "agent-kube")
    monkeypatch.setenv("MERIDIAN_AGENT_BUS_URL", redis_url)
    monkeypatch.setenv("MERIDIAN_AGENT_KEY_PREFIX", key_prefix)
    monkeypatch.setenv("MERIDIAN_AGENT_KUBE__KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("MERIDIAN_AGENT_POWER__POWERCAP_ROOT", str(tmp_path / "no-powercap"))
    agent = build_agent(AgentSettings())
    assert agent.tick()
    bus = RedisStreamBus(redis_url, key_prefix=key_prefix)
    try:
        reports = [pb.NodeTelemetry.FromString(e.payload) for e in bus.read_range(telemetry_stream("agent-kube"))]
    finally:
        bus.close()
    assert len(reports) == 1
    report = reports[0]
    assert (report.cluster, report.node) == ("agent-kube", node)
    assert (report.capacity_milli_cpu, report.allocatable_milli_cpu) == (8000, 7500)
    assert (report.capacity_memory_bytes, report.allocatable_memory_bytes) == (32 * 2**30, 30 * 2**30)
    assert (report.requested_milli_cpu, report.requested_memory_bytes) == (EXPECTED_MILLI_CPU, EXPECTED_MEMORY)
    assert list(report.gpu_free_milli) == [1000, 0]  # 2 GPUs allocatable, 1 requested
    assert report.gpu_model == "A100" and report.labels_included
    assert LABELS.items() <= dict(report.labels).items()
    assert (TAINT["key"], TAINT["value"], TAINT["effect"]) in {(t.key, t.value, t.effect) for t in report.taints}
