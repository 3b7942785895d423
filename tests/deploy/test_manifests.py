"""Every Kubernetes manifest under ``deploy/`` validates against the Kubernetes schemas (strict), and
the node-agent DaemonSet has what ARCHITECTURE.md and issue 4 require of it.

The validation is generic: any YAML document added under ``deploy/`` (``**/*.yaml``) is checked
automatically against a fixed Kubernetes version, with unknown fields rejected.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from meridian import quantity

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
#: The Kubernetes version manifests are validated against (kubernetes-validate's bundled schemas).
KUBERNETES_VERSION = "1.31.0"


def _documents() -> list[tuple[str, int, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.glob("**/*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                docs.append((str(path.relative_to(DEPLOY)), i, doc))
    return docs


DOCUMENTS = _documents()


def _id(entry: tuple[str, int, dict[str, Any]]) -> str:
    path, i, doc = entry
    name = (doc.get("metadata") or {}).get("name", "?") if isinstance(doc, dict) else "?"
    kind = doc.get("kind", "?") if isinstance(doc, dict) else "?"
    return f"{path}#{i}:{kind}/{name}"


def test_there_are_manifests() -> None:
    assert any(path == "node-agent.yaml" for path, _, _ in DOCUMENTS)
    assert any(path == "redis.yaml" for path, _, _ in DOCUMENTS)


@pytest.mark.parametrize("entry", DOCUMENTS, ids=[_id(e) for e in DOCUMENTS])
def test_manifest_validates_strictly(entry: tuple[str, int, dict[str, Any]]) -> None:
    _, _, doc = entry
    assert isinstance(doc, dict) and "apiVersion" in doc and "kind" in doc
    try:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        pytest.fail(f"{_id(entry)}: {exc.message} at {'/'.join(str(p) for p in exc.path)}")


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


@pytest.mark.parametrize("entry", DOCUMENTS, ids=[_id(e) for e in DOCUMENTS])
def test_resource_quantities_parse(entry: tuple[str, int, dict[str, Any]]) -> None:
    # The JSON schema accepts any string for a quantity; Kubernetes' own parser does not.
    for where, value in _resource_quantities(entry[2]):
        try:
            quantity.parse(value, field=where)
        except quantity.QuantityError as exc:
            pytest.fail(f"{_id(entry)}: {exc}")


def _find(kind: str, name: str) -> dict[str, Any]:
    matches = [d for _, _, d in DOCUMENTS if d.get("kind") == kind and d["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected one {kind}/{name}"
    return matches[0]


@pytest.fixture(scope="module")
def agent_pod() -> dict[str, Any]:
    return _find("DaemonSet", "meridian-node-agent")["spec"]["template"]["spec"]


@pytest.fixture(scope="module")
def agent_container(agent_pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = agent_pod["containers"]
    return container


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
    env = {e["name"]: e.get("value") for e in agent_container["env"]}
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


def test_requests_and_limits(agent_container: dict[str, Any]) -> None:
    resources = agent_container["resources"]
    for section in ("requests", "limits"):
        assert {"cpu", "memory"} <= resources[section].keys()


def test_tolerates_every_taint(agent_pod: dict[str, Any]) -> None:
    assert {"operator": "Exists"} in agent_pod["tolerations"]


def test_probes_hit_the_health_endpoints(agent_container: dict[str, Any]) -> None:
    assert agent_container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert agent_container["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_rbac_reads_nodes_and_lists_pods_only() -> None:
    role = _find("ClusterRole", "meridian-node-agent")
    granted = {(r, v) for rule in role["rules"] for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {("nodes", "get"), ("pods", "list")}
    binding = _find("ClusterRoleBinding", "meridian-node-agent")
    assert binding["roleRef"]["name"] == "meridian-node-agent"
    assert binding["subjects"][0]["name"] == _find("DaemonSet", "meridian-node-agent")["spec"]["template"]["spec"][
        "serviceAccountName"]


def test_redis_is_reachable_where_the_agent_looks() -> None:
    service = _find("Service", "meridian-redis")
    agent = _find("DaemonSet", "meridian-node-agent")["spec"]["template"]["spec"]["containers"][0]
    url = {e["name"]: e.get("value") for e in agent["env"]}["MERIDIAN_AGENT_BUS_URL"]
    namespace = service["metadata"]["namespace"]
    assert url == f"redis://{service['metadata']['name']}.{namespace}.svc:{service['spec']['ports'][0]['port']}/0"


def test_agent_runs_the_standalone_entry_point(agent_container: dict[str, Any]) -> None:
    assert agent_container["command"] == ["python", "-m", "node_agent"]
