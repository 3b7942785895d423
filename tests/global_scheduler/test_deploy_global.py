"""What the global and regional scheduler manifests must say (schema validity is checked for every
manifest by tests/deploy)."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from global_scheduler.settings import GlobalSchedulerSettings
from tests.deploy.kustomize_helpers import render


def docs(overlay: str) -> dict[tuple[str, str], dict[str, Any]]:
    """An overlay of deploy/, rendered by kustomize; a generated Secret or ConfigMap also by its name
    without the content hash."""
    out = {}
    for d in render(overlay):
        name = d["metadata"]["name"]
        out[(d["kind"], name)] = d
        if d["kind"] in ("Secret", "ConfigMap"):
            out.setdefault((d["kind"], name.rpartition("-")[0]), d)
    return out


def test_global_scheduler_serves_grpc_with_probes_and_secret_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    d = docs("hub")
    pod = d[("Deployment", "meridian-global-scheduler")]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["command"][:2] == ["meridian", "global-scheduler"]
    # Probes go to the plaintext health-only server (the kubelet's gRPC probes speak no TLS).
    assert c["readinessProbe"]["grpc"]["port"] == 50052 and c["livenessProbe"]["grpc"]["port"] == 50052
    env = {e["name"]: e for e in c["env"]}
    tokens = env["MERIDIAN_GLOBAL_API__AUTH_TOKENS"]["valueFrom"]["secretKeyRef"]
    assert tokens["name"] == d[("Secret", "meridian-global-api")]["metadata"]["name"] and tokens["key"] == "tokens"
    tls = {v["name"]: v for v in pod["volumes"]}["tls"]["secret"]["secretName"]
    assert tls == d[("Secret", "meridian-global-api-tls")]["metadata"]["name"]
    assert env["MERIDIAN_GLOBAL_API__LISTEN"]["value"] == "0.0.0.0:50051"
    assert c["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    # The plain-valued env gives the settings the manifest means (an unknown variable would be ignored).
    for name, e in env.items():
        if "value" in e:
            monkeypatch.setenv(name, e["value"])
    configured = GlobalSchedulerSettings()
    assert configured.routing.worker_process and "worker_process" in configured.routing.model_fields_set
    assert configured.routing.policy == "gnn" and configured.registry.cluster_timeout_s == 30
    assert configured.api.health_listen == "0.0.0.0:50052"
    # One core requested for the API's process and one for its routing worker.
    assert float(c["resources"]["requests"]["cpu"]) >= 2
    svc = d[("Service", "meridian-global-scheduler")]
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]}["grpc"] == 50051


@pytest.mark.parametrize(("resource", "verb"), [
    pytest.param("pods/binding", "create", id="bind"),
    pytest.param("pods", "watch", id="watch-pods"),
    pytest.param("nodes", "list", id="list-nodes"),
    pytest.param("events", "create", id="events"),
])
def test_regional_scheduler_rbac(resource: str, verb: str) -> None:
    role = docs("member")[("ClusterRole", "meridian-regional-scheduler")]
    assert any(resource in r["resources"] and verb in r["verbs"] for r in role["rules"])


def test_extender_configuration() -> None:
    cm = docs("base/extender")[("ConfigMap", "meridian-scheduler-config")]
    cfg = yaml.safe_load(cm["data"]["scheduler-config.yaml"])
    assert cfg["apiVersion"] == "kubescheduler.config.k8s.io/v1" and cfg["kind"] == "KubeSchedulerConfiguration"
    (ext,) = cfg["extenders"]
    assert ext["urlPrefix"].startswith("http://meridian-regional-scheduler.meridian-system.svc:8888")
    assert ext["filterVerb"] and ext["prioritizeVerb"] and ext["ignorable"] is True
