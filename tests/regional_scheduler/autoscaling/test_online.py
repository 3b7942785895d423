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
