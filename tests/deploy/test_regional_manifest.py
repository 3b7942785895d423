"""What the regional scheduler's manifest must say: one service, two replicas with leader election,
the extender served where the extender configuration looks, and settings that mean what they say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from regional_scheduler.kube_scheduler import KubeSchedulerSettings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def _docs(name: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d}


def test_one_service_two_replicas_with_leader_election(monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = _docs("regional-scheduler.yaml")[("Deployment", "meridian-regional-scheduler")]
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][:3] == ["python", "-m", "regional_scheduler.kube_cli"]
    env = {e["name"]: e for e in container["env"]}
    assert env["MERIDIAN_REGIONAL_IDENTITY"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    for name, e in env.items():
        if "value" in e:
            monkeypatch.setenv(name, e["value"])
    settings = KubeSchedulerSettings()
    regional = {n for n in env if n.startswith("MERIDIAN_REGIONAL_")}
    # every MERIDIAN_REGIONAL_* variable is a real setting (an unknown one would be silently ignored)
    assert {n.removeprefix("MERIDIAN_REGIONAL_").lower() for n in regional} <= set(KubeSchedulerSettings.model_fields)
    assert settings.leader_elect and settings.policy == "fgd"
    assert settings.lease_namespace == deployment["metadata"]["namespace"]


def test_the_extender_is_served_where_kube_scheduler_is_told_to_look() -> None:
    regional = _docs("regional-scheduler.yaml")
    (container,) = regional[("Deployment", "meridian-regional-scheduler")]["spec"]["template"]["spec"]["containers"]
    listen = container["command"][container["command"].index("--extender") + 1]
    port = int(listen.rpartition(":")[2])
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["extender"] == port
    service = regional[("Service", "meridian-regional-scheduler")]
    svc_port = {p["name"]: p["port"] for p in service["spec"]["ports"]}["extender"]
    cm = _docs("regional-scheduler-extender.yaml")[("ConfigMap", "meridian-scheduler-config")]
    (ext,) = yaml.safe_load(cm["data"]["scheduler-config.yaml"])["extenders"]
    host = f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{svc_port}"
    assert ext["urlPrefix"] == f"http://{host}/meridian"
    assert container["readinessProbe"]["httpGet"]["path"] == "/meridian/healthz"
