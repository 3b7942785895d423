"""Every live autoscaling policy, through the serving loop, scales a real Deployment (issue 23 item 7).

The target is a Deployment on the session's real kube-apiserver (with kube-controller-manager; its pods
never run: there is no kubelet, and the scale subresource does not care). The loop reads and writes
``deployments/scale`` through the real driver. The metrics source is the real Prometheus HTTP client
(:class:`PrometheusSource`) against a loopback server speaking Prometheus' ``/api/v1/query`` JSON, fed a
constructed load: a request rate and, per pod of the Deployment's current ``spec.replicas``, its CPU
usage and request, as cAdvisor and kube-state-metrics would report them. The loop's ``wait`` is
injected: it returns at once (no sleeps) and moves the constructed world to the replicas just written,
as pods that started would.

Before the fix, the serving loop passed ``utilisation=None`` and the ``hpa`` policy held its replicas
for ever; the exact-formula test below fails then.
"""

from __future__ import annotations

import json
import math
import threading
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from kubernetes.client import ApiClient, AppsV1Api

from regional_scheduler.autoscaling.k8s_driver import ScaleSubresourceDriver
from regional_scheduler.autoscaling.online import OnlineAutoscaler
from regional_scheduler.autoscaling.policies.registry import REGISTRY, get_policy
from regional_scheduler.autoscaling.prometheus_source import PrometheusQueries, PrometheusSource
from regional_scheduler.autoscaling.serving import PrometheusMetrics, ServingLoop

pytestmark = pytest.mark.kubernetes

CAPACITY_RPM = 600.0  # requests per minute one replica serves at 100 % of its 1-core request
REQUEST_CORES = 1.0


@dataclass
class ConstructedLoad:
    """What Prometheus would answer for the Deployment's pods: one rate, and per pod usage/request/ready."""

    rate_per_s: float = 0.0
    p99_s: float = 0.1
    pods: dict[str, tuple[float, float, bool]] = field(default_factory=dict)
    queries: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def spread(self, *, total_cores: float, replicas: int, request_cores: float = REQUEST_CORES) -> None:
        """``replicas`` ready pods sharing ``total_cores`` of CPU use evenly."""
        with self.lock:
            self.pods = {f"web-{i}": (total_cores / replicas, request_cores, True) for i in range(replicas)}

    def follow_rate(self, rate_rpm: float, replicas: int) -> None:
        """The rate, and what it costs ``replicas`` pods whose CPU limit is their request: ``rate /
        CAPACITY_RPM`` cores of use, at most the limit each; the p99 latency breaks the 500 ms SLO when the
        pods run above 80 % (a step, not a queueing model: enough to say "overloaded")."""
        replicas = max(replicas, 1)
        self.rate_per_s = rate_rpm / 60.0
        wanted = rate_rpm / CAPACITY_RPM * REQUEST_CORES
        self.spread(total_cores=min(wanted, replicas * REQUEST_CORES), replicas=replicas)
        self.p99_s = 0.1 if wanted <= 0.8 * replicas * REQUEST_CORES else 2.0

    def answer(self, query: str) -> dict:
        with self.lock:
            self.queries.append(query)
            if query in ("rate", "p99"):
                value = self.rate_per_s if query == "rate" else self.p99_s
                result = [{"metric": {}, "value": [0, str(value)]}]
            else:
                column = {"usage": 0, "requests": 1, "ready": 2}[query]
                result = [{"metric": {"pod": pod, "namespace": "shop"}, "value": [0, str(float(values[column]))]}
                          for pod, values in self.pods.items()]
        return {"status": "success", "data": {"resultType": "vector", "result": result}}


@pytest.fixture
def load() -> Iterator[tuple[ConstructedLoad, str]]:
    state = ConstructedLoad()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            url = urllib.parse.urlparse(self.path)
            assert url.path == "/api/v1/query"
            body = json.dumps(state.answer(urllib.parse.parse_qs(url.query)["query"][0])).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


QUERIES = PrometheusQueries("rate", p99_latency_s="p99", cpu_usage_cores="usage", cpu_request_cores="requests",
                            ready_pods="ready")


def create_deployment(api: ApiClient, namespace: str, replicas: int) -> None:
    AppsV1Api(api).create_namespaced_deployment(namespace, {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "web", "image": "registry.k8s.io/pause:3.10",
                                     "resources": {"requests": {"cpu": "1"}}}]}}}})


def spec_replicas(api: ApiClient, namespace: str) -> int:
    """Read back from the API server, not from the driver: what a kubectl user would see."""
    return int(AppsV1Api(api).read_namespaced_deployment("web", namespace).spec.replicas)


def serving_loop(policy: str, api: ApiClient, namespace: str, url: str, world: ConstructedLoad | None = None,
                 rate_rpm: list[float] | None = None) -> ServingLoop:
    """The CLI's loop, with the real driver and source; ``wait`` returns at once and, given ``world``,
    makes the constructed pods follow the replicas just written at the current ``rate_rpm[0]``."""

    def wait(_interval_s: float) -> bool:
        if world is not None and rate_rpm is not None:
            world.follow_rate(rate_rpm[0], spec_replicas(api, namespace))
        return False

    online = OnlineAutoscaler(get_policy(policy), capacity_per_replica_rpm=CAPACITY_RPM)
    driver = ScaleSubresourceDriver(AppsV1Api(api), name="web", namespace=namespace)
    return ServingLoop(online, PrometheusMetrics(PrometheusSource(url, QUERIES)), driver=driver, wait=wait)


def test_hpa_live_loop_scales_a_real_deployment_by_the_hpa_formula(
        kube_api: ApiClient, kube_namespace: str, load: tuple[ConstructedLoad, str]) -> None:
    world, url = load
    create_deployment(kube_api, kube_namespace, replicas=4)
    loop = serving_loop("hpa", kube_api, kube_namespace, url)
    target = 0.6  # the HPA policy's default target (AutoscalerSettings.sizing.target_utilisation)

    # 4 ready pods using 0.45 of their 0.5-core request: utilisation 0.9, so ceil(4 × 0.9 / 0.6) = 6
    # (within the default scale-up rate limit, max(+100 %, +4 pods) per 15 s).
    world.rate_per_s = 10.0
    world.spread(total_cores=4 * 0.45, replicas=4, request_cores=0.5)
    assert loop.run(1) == 1
    assert spec_replicas(kube_api, kube_namespace) == math.ceil(4 * 0.9 / target) == 6
    assert {"usage", "requests", "ready"} <= set(world.queries), "utilisation comes from the CPU queries"

    # The same CPU over 6 pods: utilisation 0.6, inside the 0.1 tolerance: held.
    world.spread(total_cores=4 * 0.45, replicas=6, request_cores=0.5)
    loop.run(1)
    assert spec_replicas(kube_api, kube_namespace) == 6

    # Load falls to utilisation 0.08: the proposal is ceil(6 × 0.08 / 0.6) = 1, but the 300 s scale-down
    # window keeps the highest recommendation (6, last made at minute 1) until minute 6.
    world.spread(total_cores=6 * 0.04, replicas=6, request_cores=0.5)
    held = []
    for _minute in range(2, 6):
        loop.run(1)
        held.append(spec_replicas(kube_api, kube_namespace))
    assert held == [6, 6, 6, 6]
    loop.run(1)  # minute 6: 300 s after the last recommendation of 6
    assert spec_replicas(kube_api, kube_namespace) == math.ceil(6 * 0.08 / target) == 1


def test_hpa_counts_unready_pods_as_the_hpa_does(
        kube_api: ApiClient, kube_namespace: str, load: tuple[ConstructedLoad, str]) -> None:
    """4 ready pods at 0.9 and 2 not ready: scaling up, the HPA assumes 0 % for the unready ones, so the
    ratio over all 6 is 0.9 × 4 / 6 / 0.6 = 1.0, inside the tolerance: nothing changes. Counted as
    ready (readiness ignored), the same metrics would scale 6 → ceil(6 × 0.9 / 0.6) = 9."""
    world, url = load
    create_deployment(kube_api, kube_namespace, replicas=6)
    world.rate_per_s = 10.0
    world.pods = {**{f"web-{i}": (0.9, 1.0, True) for i in range(4)},
                  **{f"web-{i}": (0.9, 1.0, False) for i in range(4, 6)}}
    loop = serving_loop("hpa", kube_api, kube_namespace, url)
    loop.run(1)
    assert spec_replicas(kube_api, kube_namespace) == 6


HIGH_RPM = 8 * CAPACITY_RPM  # 8 replicas busy at 100 %
LOW_RPM = 0.5 * CAPACITY_RPM


@pytest.mark.parametrize("policy", sorted(REGISTRY))
def test_every_live_policy_follows_a_load_up_and_down_on_a_real_deployment(
        policy: str, kube_api: ApiClient, kube_namespace: str, load: tuple[ConstructedLoad, str]) -> None:
    """Load rises to 8 replicas' worth (the 2 pods saturate, p99 breaks the SLO): every policy scales the
    Deployment up from 2, past 8 (each aims below 100 % utilisation); then it falls to half a replica's
    worth: every policy scales down again."""
    world, url = load
    create_deployment(kube_api, kube_namespace, replicas=2)
    rate = [HIGH_RPM]
    world.follow_rate(HIGH_RPM, 2)
    loop = serving_loop(policy, kube_api, kube_namespace, url, world, rate)
    trace = []
    for _ in range(6):
        loop.run(1)
        trace.append(spec_replicas(kube_api, kube_namespace))
    peak = max(trace)
    assert trace[0] > 2, f"{policy}: no scale-up on the first decision under 4× overload: {trace}"
    assert trace[-1] > 8, f"{policy}: not above the load's 8 replicas at 100 % after 6 minutes: {trace}"

    rate[0] = LOW_RPM
    world.follow_rate(LOW_RPM, trace[-1])
    for _ in range(20):
        loop.run(1)
        trace.append(spec_replicas(kube_api, kube_namespace))
    assert trace[-1] < peak, f"{policy}: never scaled down after load fell to 0.5 replicas: {trace}"
    assert trace[-1] <= 2, f"{policy}: still far above the load 20 minutes after it fell: {trace}"
