"""Per-minute service samples from the Prometheus HTTP API (``GET /api/v1/query``), for serving.

Each query must return one instant-vector sample (e.g. ``sum(rate(http_requests_total{job="web"}[1m]))``).
The request-rate query gives requests per *second*; it is turned into requests per minute. Optional
queries give the p99 latency in seconds (e.g. ``histogram_quantile(0.99, sum by (le) (rate(..._bucket[1m])))``)
and the error ratio. A failed query raises: the serving loop keeps the previous decision rather than
acting on a guess.

**CPU utilisation as the HPA computes it.** The ``hpa`` policy scales on the CPU utilisation of the
target's pods, which the request rate does not give. Three per-pod queries (instant vectors, one sample
per pod, keyed by the ``pod`` label) supply it:

* ``cpu_usage_cores``: CPU in use, in cores, e.g.
  ``sum by (pod) (rate(container_cpu_usage_seconds_total{namespace="shop",pod=~"web-.*",container!=""}[1m]))``
  (cAdvisor through the kubelet, what metrics-server reports to the HPA);
* ``cpu_request_cores``: the pods' CPU requests, in cores, e.g.
  ``sum by (pod) (kube_pod_container_resource_requests{namespace="shop",pod=~"web-.*",resource="cpu"})``
  (kube-state-metrics). Its pods are *the target's pods*, as the HPA's pod lister gives them;
* ``ready_pods`` (optional): ``kube_pod_status_ready{namespace="shop",pod=~"web-.*",condition="true"}``;
  a pod is ready when its sample is > 0. Without it every pod that reports usage counts as ready.

As ``GetResourceUtilizationRatio`` of kube-controller-manager: utilisation = Σ usage / Σ request over
the ready pods that report usage; the target's other pods count as unready (the HPA's algorithm assumes
0 % for them when scaling up and leaves them out when scaling down); usage of a pod outside the request
vector (a pod already gone) is ignored. No ready pod with usage, or a ready pod with usage and a zero
request, raises (the HPA then does nothing either).
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass


class PrometheusQueryError(RuntimeError):
    """The query failed or did not return exactly one sample."""


@dataclass(frozen=True)
class PrometheusQueries:
    request_rate_per_s: str
    p99_latency_s: str | None = None
    error_ratio: str | None = None
    cpu_usage_cores: str | None = None
    cpu_request_cores: str | None = None
    ready_pods: str | None = None

    @property
    def supplies_utilisation(self) -> bool:
        """CPU utilisation needs the usage and the request queries (readiness is optional)."""
        return bool(self.cpu_usage_cores and self.cpu_request_cores)


@dataclass(frozen=True)
class CpuUtilisation:
    """The HPA's view of the target's pods: utilisation over the ready ones, and how many are not."""

    utilisation: float
    ready_pods: int
    unready_pods: int


def _query(base_url: str, query: str, timeout_s: float) -> dict:
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except (OSError, ValueError) as exc:
        raise PrometheusQueryError(f"{query!r}: {exc}") from exc
    if body.get("status") != "success":
        raise PrometheusQueryError(f"{query!r}: {body.get('error', body.get('status'))}")
    return body


def instant_query(base_url: str, query: str, *, timeout_s: float = 5.0) -> float:
    body = _query(base_url, query, timeout_s)
    result = body.get("data", {}).get("result", [])
    if body.get("data", {}).get("resultType") == "scalar":
        return float(result[1])
    if len(result) != 1:
        raise PrometheusQueryError(f"{query!r}: expected one sample, got {len(result)}")
    return float(result[0]["value"][1])


def instant_vector(base_url: str, query: str, *, label: str = "pod", timeout_s: float = 5.0) -> dict[str, float]:
    """An instant vector as ``{value of label: sample}``; every sample must carry ``label``, once."""
    body = _query(base_url, query, timeout_s)
    data = body.get("data", {})
    if data.get("resultType") != "vector":
        raise PrometheusQueryError(f"{query!r}: expected a vector, got {data.get('resultType')!r}")
    samples: dict[str, float] = {}
    for item in data.get("result", []):
        key = item.get("metric", {}).get(label)
        if key is None:
            raise PrometheusQueryError(f"{query!r}: a sample has no {label!r} label: {item.get('metric')}")
        if key in samples:
            raise PrometheusQueryError(f"{query!r}: two samples for {label}={key!r} (aggregate by {label})")
        samples[key] = float(item["value"][1])
    return samples


def cpu_utilisation(usage: dict[str, float], requests: dict[str, float],
                    ready: set[str] | None) -> CpuUtilisation:
    """``GetResourceUtilizationRatio`` over per-pod samples (see the module docstring)."""
    measured = [pod for pod in requests if pod in usage and (ready is None or pod in ready)]
    if not measured:
        raise PrometheusQueryError(f"no ready pod reports CPU usage (pods with a request: {sorted(requests)})")
    requested = sum(requests[pod] for pod in measured)
    if requested <= 0 or any(requests[pod] <= 0 for pod in measured):
        raise PrometheusQueryError(f"a ready pod has no CPU request: {sorted(p for p in measured if requests[p] <= 0)}")
    return CpuUtilisation(utilisation=sum(usage[pod] for pod in measured) / requested,
                          ready_pods=len(measured), unready_pods=len(requests) - len(measured))


@dataclass(frozen=True)
class PrometheusSource:
    base_url: str
    queries: PrometheusQueries

    def sample(self) -> tuple[float, float, float]:
        """``(requests per minute, p99 latency ms, error ratio)``; missing optional queries give 0."""
        rate = instant_query(self.base_url, self.queries.request_rate_per_s) * 60.0
        p99 = instant_query(self.base_url, self.queries.p99_latency_s) * 1000.0 if self.queries.p99_latency_s else 0.0
        errors = instant_query(self.base_url, self.queries.error_ratio) if self.queries.error_ratio else 0.0
        return rate, p99, errors

    def cpu(self) -> CpuUtilisation | None:
        """The target's CPU utilisation (``None`` when the CPU queries are not configured)."""
        q = self.queries
        if not (q.cpu_usage_cores and q.cpu_request_cores):
            return None
        usage = instant_vector(self.base_url, q.cpu_usage_cores)
        requests = instant_vector(self.base_url, q.cpu_request_cores)
        ready = {pod for pod, v in instant_vector(self.base_url, q.ready_pods).items() if v > 0} \
            if q.ready_pods else None
        return cpu_utilisation(usage, requests, ready)
