"""The serving loop's pieces: Prometheus HTTP API source (real HTTP on loopback) and the online
autoscaler keeping its guard-rail memory across minutes."""

from __future__ import annotations

import itertools
import json
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from regional_scheduler.autoscaling.online import OnlineAutoscaler, ServiceSample
from regional_scheduler.autoscaling.policies.forecast_policy import ForecastPolicy
from regional_scheduler.autoscaling.prometheus_source import (
    PrometheusQueries,
    PrometheusQueryError,
    PrometheusSource,
)

ANSWERS = {
    "rate": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "12.5"]}]}},
    "p99": {"status": "success", "data": {"resultType": "scalar", "result": [1, "0.25"]}},
    "none": {"status": "success", "data": {"resultType": "vector", "result": []}},
    "bad": {"status": "error", "error": "parse error"},
}


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlparse(self.path).query)["query"][0]
        body = json.dumps(ANSWERS[query]).encode()
        self.send_response(200 if query != "bad" else 400)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def prometheus_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_prometheus_source_converts_units(prometheus_url: str) -> None:
    source = PrometheusSource(prometheus_url, PrometheusQueries("rate", p99_latency_s="p99"))
    # 12.5 requests/s → 750 per minute; 0.25 s → 250 ms; no error query → 0.
    assert source.sample() == (750.0, 250.0, 0.0)


@pytest.mark.parametrize("query", [pytest.param("none", id="empty-result"), pytest.param("bad", id="error")])
def test_prometheus_source_refuses_to_guess(prometheus_url: str, query: str) -> None:
    with pytest.raises(PrometheusQueryError):
        PrometheusSource(prometheus_url, PrometheusQueries(query)).sample()


def test_online_autoscaler_keeps_scale_down_cooldown_across_minutes() -> None:
    autoscaler = OnlineAutoscaler(ForecastPolicy(0.0, scale_down_tolerance=0.0), capacity_per_replica_rpm=10.0)
    replicas = 1
    history = []
    # An hour at 400 requests/min, then load collapses to 10/min.
    for rate in [400.0] * 60 + [10.0] * 20:
        replicas = autoscaler.update(ServiceSample(rate, replicas, 0, None, 100.0, 0.0))
        history.append(replicas)
    downs = [i for i in range(1, len(history)) if history[i] < history[i - 1]]
    assert downs, "load collapsed, so it must scale down"
    # One decision per minute: at least 3 minutes between scale-downs, each at most 50%.
    assert all(b - a >= 3 for a, b in itertools.pairwise(downs))
    assert all(history[i] >= (history[i - 1] + 1) // 2 for i in downs)


def _vector(**pods: float) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": [
        {"metric": {"pod": pod}, "value": [1, str(value)]} for pod, value in pods.items()]}}


# Per-pod CPU: a has 0.3 of 0.5 cores, b 0.5 of 1 core, c is not ready, d reports no usage yet,
# gone (a deleted pod's last usage) has no request any more.
ANSWERS.update({
    "usage": _vector(a=0.3, b=0.5, c=0.9, gone=2.0),
    "requests": _vector(a=0.5, b=1.0, c=1.0, d=1.0),
    "ready": _vector(a=1, b=1, c=0, d=1),
    "no-label": {"status": "success", "data": {"resultType": "vector", "result": [{"metric": {}, "value": [1, "1"]}]}},
})


def test_prometheus_cpu_utilisation_is_the_hpas_ratio_over_ready_pods(prometheus_url: str) -> None:
    """Σ usage / Σ request over the ready pods that report usage, as kube-controller-manager's
    GetResourceUtilizationRatio: (0.3 + 0.5) / (0.5 + 1.0); c (not ready) and d (no usage) are unready;
    the usage of a pod without a request is ignored."""
    cpu = PrometheusSource(prometheus_url, PrometheusQueries("rate", cpu_usage_cores="usage",
                                                             cpu_request_cores="requests", ready_pods="ready")).cpu()
    assert cpu is not None
    assert cpu.utilisation == pytest.approx(0.8 / 1.5)
    assert (cpu.ready_pods, cpu.unready_pods) == (2, 2)
    # Without a readiness query every pod reporting usage counts as ready (c too).
    cpu = PrometheusSource(prometheus_url, PrometheusQueries("rate", cpu_usage_cores="usage",
                                                             cpu_request_cores="requests")).cpu()
    assert cpu is not None and cpu.utilisation == pytest.approx(1.7 / 2.5) and cpu.unready_pods == 1


def test_prometheus_cpu_is_none_without_its_queries_and_refuses_bad_vectors(prometheus_url: str) -> None:
    assert PrometheusSource(prometheus_url, PrometheusQueries("rate")).cpu() is None
    for usage, requests in [("none", "requests"), ("no-label", "requests"), ("usage", "none")]:
        with pytest.raises(PrometheusQueryError):
            PrometheusSource(prometheus_url, PrometheusQueries("rate", cpu_usage_cores=usage,
                                                               cpu_request_cores=requests)).cpu()


def test_online_autoscaler_passes_measured_utilisation_to_the_hpa() -> None:
    """The serving path, without Kubernetes: 4 ready pods at 0.9 → ceil(4 × 0.9 / 0.6) = 6; without a
    utilisation (the old serving loop) the HPA holds 4."""
    from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy

    measured = OnlineAutoscaler(HpaPolicy(), capacity_per_replica_rpm=600.0)
    assert measured.update(ServiceSample(600.0, 4, 0, 0.9, 100.0, 0.0, current_replicas=4)) == 6
    blind = OnlineAutoscaler(HpaPolicy(), capacity_per_replica_rpm=600.0)
    assert blind.update(ServiceSample(600.0, 4, 0, None, 100.0, 0.0, current_replicas=4)) == 4


def test_serving_loop_refuses_a_utilisation_policy_on_a_rate_only_source() -> None:
    from regional_scheduler.autoscaling.policies.hpa_policy import HpaPolicy
    from regional_scheduler.autoscaling.serving import MissingMetricError, ReplayMetrics, ServingLoop
    from regional_scheduler.autoscaling.shadow import ShadowRunner

    for policy in (HpaPolicy(), ShadowRunner(ForecastPolicy(), HpaPolicy())):
        with pytest.raises(MissingMetricError, match="CPU utilisation"):
            ServingLoop(OnlineAutoscaler(policy), ReplayMetrics([600.0]))
    # A replay may model utilisation from the rate (a demo): then the HPA runs, and scales.
    online = OnlineAutoscaler(HpaPolicy(), capacity_per_replica_rpm=600.0, model_utilisation=True)
    loop = ServingLoop(online, ReplayMetrics([3000.0] * 3), initial_replicas=2)
    assert loop.run() == 3  # the series ends after 3 readings
    assert loop.replicas > 2
    # The rate-only source is fine for a policy that scales on the rate.
    assert ServingLoop(OnlineAutoscaler(ForecastPolicy()), ReplayMetrics([600.0])).run() == 1
