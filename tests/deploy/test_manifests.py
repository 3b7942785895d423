"""Every overlay of ``deploy/`` (hub, member, all-in-one, the autoscaler example) renders with kustomize,
validates against the Kubernetes schemas (strict), and holds what issue 23 asks of a deployment: probes,
PodDisruptionBudgets, NetworkPolicies, restricted security contexts, requests and limits, one image,
Secrets generated from placeholders only, and a node agent that asks for nothing beyond what RAPL needs.

The checks are generic: a Deployment or Secret added to any base is checked in every overlay that
includes it.
"""

from __future__ import annotations

import base64
from typing import Any

import kubernetes_validate
import pytest

from meridian import quantity
from tests.deploy.kustomize_helpers import (
    DEPLOY,
    EXTRA_KUSTOMIZATIONS,
    IMAGE,
    OVERLAYS,
    env_of,
    find,
    render,
    workloads,
)

#: The Kubernetes version manifests are validated against (kubernetes-validate's bundled schemas).
KUBERNETES_VERSION = "1.31.0"
ALL = OVERLAYS + EXTRA_KUSTOMIZATIONS
REDIS_IMAGE_PREFIX = "redis:"
PLACEHOLDER = "REPLACE-ME"

HUB_COMPONENTS = {"global-scheduler", "redis"}
MEMBER_COMPONENTS = {"node-agent", "regional-scheduler", "autoscaler"}


def _id(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return f"{doc.get('kind', '?')}/{meta.get('namespace', '-')}/{meta.get('name', '?')}"


def _components(docs: list[dict[str, Any]]) -> set[str]:
    return {w["metadata"]["labels"]["app.kubernetes.io/component"] for w in workloads(docs)}


def _containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return pod["containers"] + pod.get("initContainers", [])


# ------------------------------------------------------------------ every overlay, generically


@pytest.mark.parametrize("overlay", ALL)
def test_renders_and_validates_strictly(overlay: str) -> None:
    docs = render(overlay)
    assert docs
    errors = []
    for doc in docs:
        try:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{_id(doc)}: {exc.message} at {'/'.join(str(p) for p in exc.path)}")
    assert not errors, "\n".join(errors)


def _resource_quantities(node: Any, where: str = "") -> list[tuple[str, Any]]:
    """Every value under a ``resources.requests``/``resources.limits`` mapping, with its path."""
    found: list[tuple[str, Any]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "resources" and isinstance(value, dict):
                for section in ("requests", "limits"):
                    for name, quantity_value in (value.get(section) or {}).items():
                        found.append((f"{where}/resources/{section}/{name}", quantity_value))
            found.extend(_resource_quantities(value, f"{where}/{key}"))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            found.extend(_resource_quantities(item, f"{where}/{i}"))
    return found


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_resource_quantities_parse(overlay: str) -> None:
    # The JSON schema accepts any string for a quantity; Kubernetes' own parser does not.
    for doc in render(overlay):
        for where, value in _resource_quantities(doc):
            try:
                quantity.parse(value, field=where)
            except quantity.QuantityError as exc:
                pytest.fail(f"{_id(doc)}: {exc}")


def test_each_overlay_holds_its_tier() -> None:
    assert _components(render("hub")) == HUB_COMPONENTS
    assert _components(render("member")) == MEMBER_COMPONENTS
    assert _components(render("all-in-one")) == HUB_COMPONENTS | MEMBER_COMPONENTS
    assert any(d["kind"] == "ConfigMap" and d["metadata"]["name"] == "meridian-grafana-dashboard"
               for d in render("hub"))
    member_namespaces = {d["metadata"]["name"] for d in render("member") if d["kind"] == "Namespace"}
    assert member_namespaces == {"meridian-system", "meridian-node-agent", "meridian-workloads"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_one_image_for_every_component(overlay: str) -> None:
    for w in workloads(render(overlay)):
        for c in _containers(w["spec"]["template"]["spec"]):
            if w["metadata"]["labels"]["app.kubernetes.io/component"] == "redis":
                assert c["image"].startswith(REDIS_IMAGE_PREFIX), _id(w)
            else:
                assert c["image"] == IMAGE, f"{_id(w)}: {c['image']}"


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_deployment_is_probed_budgeted_and_locked_down(overlay: str) -> None:
    docs = render(overlay)
    pdbs = [d for d in docs if d["kind"] == "PodDisruptionBudget"]
    problems = []
    for w in workloads(docs):
        template = w["spec"]["template"]
        pod, labels = template["spec"], template["metadata"]["labels"]
        for c in pod["containers"]:
            if not (c.get("readinessProbe") and c.get("livenessProbe")):
                problems.append(f"{_id(w)}/{c['name']}: readiness and liveness probes")
        for c in _containers(pod):
            resources = c.get("resources", {})
            for section in ("requests", "limits"):
                if not {"cpu", "memory"} <= (resources.get(section) or {}).keys():
                    problems.append(f"{_id(w)}/{c['name']}: cpu and memory {section}")
            sc = c.get("securityContext", {})
            if sc.get("allowPrivilegeEscalation") is not False or sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{_id(w)}/{c['name']}: no privilege escalation, read-only root filesystem")
            if sc.get("capabilities", {}).get("drop") != ["ALL"] or sc.get("privileged"):
                problems.append(f"{_id(w)}/{c['name']}: drop ALL capabilities, unprivileged")
            if w["kind"] != "DaemonSet" and sc.get("capabilities", {}).get("add"):
                problems.append(f"{_id(w)}/{c['name']}: adds capabilities")
        if pod["securityContext"].get("seccompProfile", {}).get("type") != "RuntimeDefault":
            problems.append(f"{_id(w)}: seccomp RuntimeDefault")
        if w["kind"] == "Deployment":
            if pod["securityContext"].get("runAsNonRoot") is not True:
                problems.append(f"{_id(w)}: runAsNonRoot")
            selecting = [p for p in pdbs if p["metadata"]["namespace"] == w["metadata"]["namespace"]
                         and p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
            if len(selecting) != 1:
                problems.append(f"{_id(w)}: one PodDisruptionBudget, found {len(selecting)}")
            elif "minAvailable" in selecting[0]["spec"] and selecting[0]["spec"]["minAvailable"] >= w["spec"]["replicas"]:
                problems.append(f"{_id(w)}: its PodDisruptionBudget would block every drain")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_pod_is_behind_a_network_policy(overlay: str) -> None:
    docs = render(overlay)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy"]
    for w in workloads(docs):
        ns, labels = w["metadata"]["namespace"], w["spec"]["template"]["metadata"]["labels"]
        admitting = [p for p in policies if p["metadata"]["namespace"] == ns
                     and p["spec"]["podSelector"].get("matchLabels")
                     and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert len(admitting) == 1, f"{_id(w)}: one NetworkPolicy of its own, found {len(admitting)}"
        (policy,) = admitting
        assert policy["spec"]["policyTypes"] == ["Ingress"]
        container_ports = {p["name"] for c in w["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
        for rule in policy["spec"]["ingress"]:
            for port in rule["ports"]:
                assert isinstance(port["port"], int) or port["port"] in container_ports, (_id(w), port)
    # and whatever else runs in meridian-system later is denied until it says what it admits
    deny = find(docs, "NetworkPolicy", "default-deny-ingress", "meridian-system")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_secrets_are_generated_placeholders_and_every_reference_resolves(overlay: str) -> None:
    docs = render(overlay)
    secrets = {(d["metadata"]["namespace"], d["metadata"]["name"]): d for d in docs if d["kind"] == "Secret"}
    for key, secret in secrets.items():
        assert secret["metadata"]["name"].rpartition("-")[2], "generated: its name carries the content hash"
        for field, value in secret["data"].items():
            assert PLACEHOLDER in base64.b64decode(value).decode(), f"{key}/{field} is not a placeholder"
    configmaps = {(d["metadata"]["namespace"], d["metadata"]["name"]) for d in docs if d["kind"] == "ConfigMap"}
    for w in workloads(docs):
        ns, pod = w["metadata"]["namespace"], w["spec"]["template"]["spec"]
        refs: list[tuple[str, str, bool]] = []
        for volume in pod.get("volumes", []):
            if "secret" in volume:
                refs.append(("Secret", volume["secret"]["secretName"], volume["secret"].get("optional", False)))
            if "configMap" in volume:
                refs.append(("ConfigMap", volume["configMap"]["name"], volume["configMap"].get("optional", False)))
            for source in volume.get("projected", {}).get("sources", []):
                if "secret" in source:
                    refs.append(("Secret", source["secret"]["name"], source["secret"].get("optional", False)))
        for c in _containers(pod):
            for e in c.get("env", []):
                for kind, key in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                    if key in e.get("valueFrom", {}):
                        ref = e["valueFrom"][key]
                        refs.append((kind, ref["name"], ref.get("optional", False)))
        for kind, name, optional in refs:
            present = (ns, name) in (secrets if kind == "Secret" else configmaps)
            assert present or optional, f"{_id(w)} uses {kind} {ns}/{name}, which the overlay does not create"


def test_the_hub_generates_the_api_secrets() -> None:
    docs = render("hub")
    assert find(docs, "Secret", "meridian-global-api", "meridian-system")["data"].keys() == {"tokens"}
    tls = find(docs, "Secret", "meridian-global-api-tls", "meridian-system")
    assert tls["type"] == "kubernetes.io/tls" and tls["data"].keys() == {"tls.crt", "tls.key"}


def test_redis_claims_storage_of_the_default_class_and_says_so() -> None:
    pvc = find(render("hub"), "PersistentVolumeClaim", "meridian-redis-data", "meridian-system")
    assert "storageClassName" not in pvc["spec"]  # the cluster's default; the hub overlay says how to name one
    assert "storageClassName" in (DEPLOY / "overlays" / "hub" / "kustomization.yaml").read_text()


@pytest.mark.parametrize("overlay", ["hub", "member", "all-in-one"])
def test_pod_security_levels(overlay: str) -> None:
    docs = render(overlay)
    namespaces = {d["metadata"]["name"]: d["metadata"].get("labels", {}) for d in docs if d["kind"] == "Namespace"}
    assert namespaces["meridian-system"]["pod-security.kubernetes.io/enforce"] == "restricted"
    if "meridian-node-agent" in namespaces:
        assert namespaces["meridian-node-agent"]["pod-security.kubernetes.io/enforce"] == "privileged"
        # the exemption holds the agent alone
        in_agent_ns = {d["kind"] for d in docs if d["metadata"].get("namespace") == "meridian-node-agent"}
        assert in_agent_ns <= {"ServiceAccount", "DaemonSet", "Secret", "NetworkPolicy"}


# ------------------------------------------------------------------ the autoscaler's target


def test_the_autoscalers_target_is_a_parameter() -> None:
    for overlay, namespace in (("member", "meridian-workloads"), ("autoscaler-example", "shop")):
        docs = render(overlay)
        deployment = find(docs, "Deployment", "meridian-autoscaler", "meridian-system")
        (container,) = deployment["spec"]["template"]["spec"]["containers"]
        env = env_of(container, docs)
        assert env["TARGET_NAMESPACE"] == namespace and env["TARGET_DEPLOYMENT"] == "web"
        assert "--namespace=$(TARGET_NAMESPACE)" in container["command"]
        assert "--deployment=$(TARGET_DEPLOYMENT)" in container["command"]
        assert f'namespace="{namespace}"' in env["RATE_QUERY"]
        role = find(docs, "Role", "meridian-autoscaler")
        binding = find(docs, "RoleBinding", "meridian-autoscaler")
        assert role["metadata"]["namespace"] == binding["metadata"]["namespace"] == namespace
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "meridian-autoscaler",
                                        "namespace": "meridian-system"}]
        if overlay == "autoscaler-example":  # the example creates what it targets
            find(docs, "Namespace", "shop")
            find(docs, "Deployment", "web", "shop")


# ------------------------------------------------------------------ the node agent


@pytest.fixture(scope="module")
def agent() -> dict[str, Any]:
    return find(render("member"), "DaemonSet", "meridian-node-agent")


@pytest.fixture(scope="module")
def agent_pod(agent: dict[str, Any]) -> dict[str, Any]:
    return agent["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def agent_container(agent_pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = agent_pod["containers"]
    return container


def test_the_agent_has_a_namespace_of_its_own(agent: dict[str, Any]) -> None:
    assert agent["metadata"]["namespace"] == "meridian-node-agent"


def test_node_name_comes_from_the_downward_api(agent_container: dict[str, Any]) -> None:
    env = {e["name"]: e for e in agent_container["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


@pytest.mark.parametrize(
    ("host_path", "mount_path"),
    [
        pytest.param("/proc", "/host/proc", id="proc"),
        pytest.param("/sys/class/powercap", "/host/sys/class/powercap", id="powercap"),
        pytest.param("/sys/fs/cgroup", "/host/sys/fs/cgroup", id="cgroup"),
    ],
)
def test_host_mounts_are_read_only(agent_pod: dict[str, Any], agent_container: dict[str, Any], host_path: str,
                                   mount_path: str) -> None:
    volumes = {v["name"]: v for v in agent_pod["volumes"]}
    (mount,) = [m for m in agent_container["volumeMounts"] if m["mountPath"] == mount_path]
    assert volumes[mount["name"]]["hostPath"]["path"] == host_path
    assert mount["readOnly"] is True
    assert mount.get("mountPropagation", "None") == "None"


def test_every_host_path_mount_is_read_only(agent_pod: dict[str, Any], agent_container: dict[str, Any]) -> None:
    host_volumes = {v["name"] for v in agent_pod["volumes"] if "hostPath" in v}
    for mount in agent_container["volumeMounts"]:
        if mount["name"] in host_volumes:
            assert mount.get("readOnly") is True, mount


def test_agent_paths_point_at_the_mounts(agent_container: dict[str, Any]) -> None:
    env = env_of(agent_container)
    assert env["MERIDIAN_AGENT_USAGE__PROC_ROOT"] == "/host/proc"
    assert env["MERIDIAN_AGENT_POWER__POWERCAP_ROOT"] == "/host/sys/class/powercap"
    assert env["MERIDIAN_AGENT_USAGE__CGROUP_ROOT"] == "/host/sys/fs/cgroup"


def test_security_context_is_least_privilege(agent_pod: dict[str, Any], agent_container: dict[str, Any]) -> None:
    sc = agent_container["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc.get("privileged", False) is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"].get("add", [])) <= {"DAC_READ_SEARCH"}  # only to read RAPL counters
    assert agent_pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not agent_pod.get("hostNetwork") and not agent_pod.get("hostPID") and not agent_pod.get("hostIPC")


def test_tolerates_every_taint(agent_pod: dict[str, Any]) -> None:
    assert {"operator": "Exists"} in agent_pod["tolerations"]


def test_probes_hit_the_health_endpoints(agent_container: dict[str, Any]) -> None:
    assert agent_container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent_container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_agent_rbac_reads_nodes_and_lists_pods_only(agent_pod: dict[str, Any]) -> None:
    docs = render("member")
    role = find(docs, "ClusterRole", "meridian-node-agent")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("nodes", "get"), ("pods", "list")}
    binding = find(docs, "ClusterRoleBinding", "meridian-node-agent")
    assert binding["roleRef"]["name"] == "meridian-node-agent"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": agent_pod["serviceAccountName"],
                                    "namespace": "meridian-node-agent"}]


def test_redis_is_reachable_where_the_agent_looks(agent_container: dict[str, Any]) -> None:
    service = find(render("all-in-one"), "Service", "meridian-redis")
    url = env_of(agent_container)["MERIDIAN_AGENT_BUS_URL"]
    namespace = service["metadata"]["namespace"]
    assert url == f"redis://{service['metadata']['name']}.{namespace}.svc:{service['spec']['ports'][0]['port']}/0"


def test_agent_runs_the_standalone_entry_point(agent_container: dict[str, Any]) -> None:
    assert agent_container["command"] == ["python", "-m", "node_agent"]
