"""What the regional scheduler's manifest must say: one service, two replicas with leader election,
the extender served where the extender configuration looks, and settings that mean what they say."""

from __future__ import annotations

import pytest
import yaml

from regional_scheduler.kube_scheduler import KubeSchedulerSettings
from tests.deploy.kustomize_helpers import DEPLOY, env_of, find, render


def test_one_service_two_replicas_with_leader_election(monkeypatch: pytest.MonkeyPatch) -> None:
    docs = render("member")
    deployment = find(docs, "Deployment", "meridian-regional-scheduler")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "regional_scheduler.kube_cli"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MERIDIAN_REGIONAL_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for name, value in env_of(container, docs).items():
        monkeypatch.setenv(name, value)
    settings = KubeSchedulerSettings()
    regional = {n for n in env if n.startswith("MERIDIAN_REGIONAL_")}
    # every MERIDIAN_REGIONAL_* variable is a real setting (an unknown one would be silently ignored)
    assert {n.removeprefix("MERIDIAN_REGIONAL_").lower() for n in regional} <= set(KubeSchedulerSettings.model_fields)
    assert settings.leader_elect and settings.policy == "fgd"
    assert settings.lease_namespace == deployment["metadata"]["namespace"]
    # the Lease it elects on is the one its Role grants
    role = find(docs, "Role", "meridian-regional-scheduler-leader-election", settings.lease_namespace)
    assert any("leases" in r["resources"] for r in role["rules"])
    pdb = find(docs, "PodDisruptionBudget", "meridian-regional-scheduler")
    assert pdb["spec"]["minAvailable"] == 1


def test_dispatched_work_has_a_namespace_and_the_rights_to_it() -> None:
    docs = render("member")
    find(docs, "Namespace", "meridian-workloads")
    role = find(docs, "Role", "meridian-regional-scheduler-workloads", "meridian-workloads")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    # What regional_scheduler/kube_dispatch.py calls: server-side apply is a PATCH, authorized as a create too
    # when it creates the object.
    verbs = {"create", "list", "patch", "delete"}
    assert granted == {("apps", "deployments", v) for v in verbs} | {("batch", "jobs", v) for v in verbs}
    binding = find(docs, "RoleBinding", "meridian-regional-scheduler-workloads", "meridian-workloads")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "meridian-regional-scheduler",
                                    "namespace": "meridian-system"}]


def test_the_extender_is_served_where_kube_scheduler_is_told_to_look() -> None:
    docs = render("member")
    (container,) = find(docs, "Deployment", "meridian-regional-scheduler")["spec"]["template"]["spec"]["containers"]
    listen = container["command"][container["command"].index("--extender") + 1]
    port = int(listen.rpartition(":")[2])
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["extender"] == port
    service = find(docs, "Service", "meridian-regional-scheduler")
    svc_port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["extender"]
    cm = find(render("base/extender"), "ConfigMap", "meridian-scheduler-config")
    config = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    (ext,) = config["extenders"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{svc_port}"
    assert ext["urlPrefix"] == f"http://{host}/meridian"
    assert container["readinessProbe"]["httpGet"]["path"] == "/meridian/healthz"
    # No managedResources: kube-scheduler sends every pod, and the configuration's comment says so.
    assert "managedResources" not in ext
    comment = (DEPLOY / "base" / "extender" / "regional-scheduler-extender.yaml").read_text()
    assert "No managedResources are set, so kube-scheduler\n# sends every pod" in comment
