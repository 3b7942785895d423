"""Per-minute service samples from the Prometheus HTTP API (``GET /api/v1/query``), for serving.

Each query must return one instant-vector sample (e.g. ``sum(rate(http_requests_total{job="web"}[1m]))``).
The request-rate query gives requests per *second*; it is turned into requests per minute. Optional
queries give the p99 latency in seconds (e.g. ``histogram_quantile(0.99, sum by (le) (rate(..._bucket[1m])))``)
and the error ratio. A failed query raises: the serving loop keeps the previous decision rather than
acting on a guess.
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


def instant_query(base_url: str, query: str, *, timeout_s: float = 5.0) -> float:
    url = f"{base_url.rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            body = json.loads(response.read())
    except (OSError, ValueError) as exc:
        raise PrometheusQueryError(f"{query!r}: {exc}") from exc
    if body.get("status") != "success":
        raise PrometheusQueryError(f"{query!r}: {body.get('error', body.get('status'))}")
    result = body.get("data", {}).get("result", [])
    if body.get("data", {}).get("resultType") == "scalar":
        return float(result[1])
    if len(result) != 1:
        raise PrometheusQueryError(f"{query!r}: expected one sample, got {len(result)}")
    return float(result[0]["value"][1])


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
