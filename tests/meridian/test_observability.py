"""Metric naming conventions (for every meridian_* metric registered), and the /metrics server."""

from __future__ import annotations

import importlib
import json
import pkgutil
import re
import urllib.request
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

import global_scheduler.accounting.consumer  # noqa: F401  (registers what the consumer uses)
from meridian import observability


@pytest.mark.parametrize(("name", "kind", "labels", "problem"), [
    pytest.param("meridian_region_energy_joules_total", "counter", ["region"], None, id="good-counter"),
    pytest.param("meridian_decision_latency_seconds", "histogram", ["policy"], None, id="good-histogram"),
    pytest.param("meridian_cluster_power_watts", "gauge", ["cluster"], None, id="good-gauge"),
    pytest.param("meridian_region_energy_joules", "counter", [], "must end in _total", id="counter-no-total"),
    pytest.param("meridian_stream_lag_total", "gauge", [], "only counters", id="gauge-with-total"),
    pytest.param("meridian_decision_latency_ms", "histogram", [], "base unit 'seconds'", id="milliseconds"),
    pytest.param("meridian_region_energy_kwh_total", "counter", [], "base unit 'joules'", id="kwh"),
    pytest.param("meridian_region_carbon_total", "counter", [], "unit suffix _grams", id="carbon-no-unit"),
    pytest.param("scheduler_placements_total", "counter", [], "meridian_", id="no-prefix"),
    pytest.param("meridian_placements_total", "counter", ["Cluster"], "snake_case", id="label-case"),
    pytest.param("meridian_placements_total", "counter", ["le"], "reserved", id="label-reserved"),
])
def test_naming_problems(name, kind, labels, problem):
    got = observability.naming_problems(name, kind, labels)
    if problem is None:
        assert got == []
    else:
        assert any(problem in p for p in got), got


COMPONENT_PACKAGES = ("meridian", "node_agent", "regional_scheduler", "global_scheduler", "gnn")


def _import_every_module() -> None:
    """Import every module of the component packages so every metric they declare is registered,
    whatever other tests ran first in this process. A module that fails to import is its own tests'
    business, not this one's."""
    for package_name in COMPONENT_PACKAGES:
        try:
            package = importlib.import_module(package_name)
        except Exception:
            continue
        for info in pkgutil.walk_packages(package.__path__, prefix=f"{package_name}."):
            if info.name.endswith("__main__"):
                continue
            try:
                importlib.import_module(info.name)
            except Exception:
                continue


def test_every_registered_meridian_metric_follows_the_conventions():
    _import_every_module()
    problems = []
    seen = 0
    for family in REGISTRY.collect():
        if not family.name.startswith("meridian_"):
            continue
        seen += 1
        exposed = family.name + "_total" if family.type == "counter" else family.name
        labels = sorted({k for s in family.samples for k in s.labels if k not in ("le", "quantile")})
        problems += observability.naming_problems(exposed, family.type, labels)
    assert seen >= 10
    assert problems == []


def test_declarations_are_shared_and_conflicts_raise():
    registry = CollectorRegistry()
    a = observability.counter("meridian_test_things_total", "doc", ["kind"], registry=registry)
    assert observability.counter("meridian_test_things_total", "doc", ["kind"], registry=registry) is a
    with pytest.raises(ValueError, match="already declared"):
        observability.gauge("meridian_test_things_total", "doc", ["kind"], registry=registry)
    with pytest.raises(ValueError, match="already declared"):
        observability.counter("meridian_test_things_total", "doc", ["other"], registry=registry)


def test_metrics_server_serves_energy_counters():
    observability.record_region_energy("test-region", it_energy_joules=3600.0, facility_energy_joules=4320.0,
                                       carbon_grams=0.5, cost=-0.01)
    server = observability.start_metrics_server(observability.MetricsSettings(port=0, address="127.0.0.1"))
    assert server is not None
    try:
        body = urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10).read().decode()
    finally:
        server.shutdown()
    assert 'meridian_region_energy_joules_total{region="test-region"}' in body
    assert 'meridian_region_carbon_grams_total{region="test-region"}' in body
    # cost is a gauge because negative prices make it fall
    assert "# TYPE meridian_region_energy_cost_euros gauge" in body


def test_metrics_server_disabled():
    assert observability.start_metrics_server(observability.MetricsSettings(enabled=False)) is None


REPO = Path(__file__).resolve().parents[2]


def _exposed_names() -> set[str]:
    names: set[str] = set()
    for family in REGISTRY.collect():
        if family.type == "counter":
            names.add(family.name + "_total")
        elif family.type == "histogram":
            names |= {family.name + s for s in ("_bucket", "_sum", "_count")}
        else:
            names.add(family.name)
    return names


def test_grafana_dashboard_queries_only_defined_metrics_and_configmap_matches():
    _import_every_module()
    raw = (REPO / "deploy" / "grafana" / "meridian-dashboard.json").read_text()
    dashboard = json.loads(raw)
    configmap = yaml.safe_load((REPO / "deploy" / "grafana-dashboard.yaml").read_text())
    assert json.loads(configmap["data"]["meridian-dashboard.json"]) == dashboard
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\bmeridian_[a-z0-9_]+", e)}
    assert used, "the dashboard queries nothing"
    assert used <= _exposed_names(), sorted(used - _exposed_names())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_unauthenticated_endpoints_bind_loopback_outside_a_pod(monkeypatch) -> None:
    """Metrics and agent health answer anyone who reaches them: outside a pod, only the host itself."""
    from node_agent.health import HealthServer
    from node_agent.settings import AgentSettings

    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("MERIDIAN_METRICS_ADDRESS", raising=False)
    assert observability.MetricsSettings().address == "127.0.0.1"
    settings = AgentSettings()
    assert settings.health_address == "127.0.0.1"
    metrics = observability.start_metrics_server(observability.MetricsSettings(port=0))
    health = HealthServer(port=0, address=settings.health_address, live=lambda: True, ready=lambda: True).start()
    try:
        assert metrics is not None and metrics.server.server_address[0] == "127.0.0.1"
        assert health.server.server_address[0] == "127.0.0.1"
    finally:
        health.shutdown()
        if metrics is not None:
            metrics.shutdown()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")  # what the kubelet sets in every pod
    assert observability.MetricsSettings().address == "0.0.0.0"
    assert AgentSettings().health_address == "0.0.0.0"
    monkeypatch.setenv("MERIDIAN_METRICS_ADDRESS", "10.0.0.5")  # and the operator can always choose
    assert observability.MetricsSettings().address == "10.0.0.5"
