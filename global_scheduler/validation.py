"""Request validation: every bad field becomes :class:`InvalidArgumentError` naming the field.

Quantities are parsed with :mod:`meridian.quantity`, whose ``QuantityError`` names the field; the
field path is prefixed with where it sits in the request (``spec.requests.cpu``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from meridian import quantity
from meridian.model import MILLI_GPU_PER_DEVICE
from protos import global_api_pb2 as api

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
REGION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
CLASSES = ("", "latency-sensitive", "batch")
MAX_REPLICAS = 10_000
MAX_IDEMPOTENCY_KEY = 256


class InvalidArgumentError(ValueError):
    def __init__(self, field: str, reason: str) -> None:
        self.field = field
        self.reason = reason
        super().__init__(f"{field}: {reason}")


@dataclass(frozen=True)
class ParsedRequests:
    milli_cpu: int
    memory_bytes: int
    gpu: int
    gpu_milli: int

    @property
    def gpu_fraction(self) -> float:
        return self.gpu + self.gpu_milli / MILLI_GPU_PER_DEVICE


@lru_cache(maxsize=4096)
def _parse_cached(text: str, field: str, milli: bool) -> int | quantity.QuantityError:
    # Requests repeat the same few strings ("500m", "2Gi"); parsing costs tens of microseconds each.
    try:
        return quantity.to_milli(text, field=field) if milli else quantity.to_int(text, field=field)
    except quantity.QuantityError as exc:
        return exc


def _quantity(text: str, field: str, *, milli: bool) -> int:
    if not text:
        return 0
    parsed = _parse_cached(text, field, milli) if len(text) <= 64 else _parse_cached.__wrapped__(text, field, milli)
    if isinstance(parsed, quantity.QuantityError):
        raise InvalidArgumentError(parsed.field, parsed.reason)
    return parsed


def parse_requests(req: api.ResourceQuantities, prefix: str = "spec.requests") -> ParsedRequests:
    cpu = _quantity(req.cpu, f"{prefix}.cpu", milli=True)
    memory = _quantity(req.memory, f"{prefix}.memory", milli=False)
    gpu = _quantity(req.gpu, f"{prefix}.gpu", milli=False)
    gpu_milli = _quantity(req.gpu_milli, f"{prefix}.gpu_milli", milli=False)
    if gpu and gpu_milli:
        raise InvalidArgumentError(f"{prefix}.gpu_milli", "a replica asks for whole GPUs (gpu) or a share (gpu_milli), not both")
    if gpu_milli > MILLI_GPU_PER_DEVICE:
        raise InvalidArgumentError(f"{prefix}.gpu_milli", f"a share of one GPU is at most {MILLI_GPU_PER_DEVICE} milli-GPU")
    if not (cpu or memory or gpu or gpu_milli):
        raise InvalidArgumentError(prefix, "at least one of cpu, memory, gpu, gpu_milli must be set")
    return ParsedRequests(cpu, memory, gpu, gpu_milli)


def validate_submit(request: api.SubmitWorkloadRequest, *, now_s: float) -> ParsedRequests:
    """Check a SubmitWorkload request; returns the parsed per-replica requests."""
    if len(request.idempotency_key) > MAX_IDEMPOTENCY_KEY:
        raise InvalidArgumentError("idempotency_key", f"at most {MAX_IDEMPOTENCY_KEY} characters")
    if not request.HasField("spec"):
        raise InvalidArgumentError("spec", "required")
    spec = request.spec
    if not DNS_LABEL.match(spec.name):
        raise InvalidArgumentError("spec.name", f"{spec.name!r} is not a DNS-1123 label (lower case, digits, '-', ≤ 63)")
    if not spec.tenant or len(spec.tenant) > 253:
        raise InvalidArgumentError("spec.tenant", "required, at most 253 characters")
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        raise InvalidArgumentError("spec.replicas", f"must be between 1 and {MAX_REPLICAS}, got {spec.replicas}")
    if not -1_000_000 <= spec.priority <= 1_000_000:
        raise InvalidArgumentError("spec.priority", "must be within ±1,000,000")
    if not spec.HasField("requests"):
        raise InvalidArgumentError("spec.requests", "required")
    parsed = parse_requests(spec.requests)
    for i, region in enumerate(spec.allowed_regions):
        if not REGION.match(region):
            raise InvalidArgumentError(f"spec.allowed_regions[{i}]", f"{region!r} is not a region name")
    if spec.origin_region and not REGION.match(spec.origin_region):
        raise InvalidArgumentError("spec.origin_region", f"{spec.origin_region!r} is not a region name")
    if not math.isfinite(spec.latency_slo_ms) or spec.latency_slo_ms < 0:
        raise InvalidArgumentError("spec.latency_slo_ms", "must be a finite number ≥ 0")
    if spec.latency_slo_ms and not spec.origin_region:
        raise InvalidArgumentError("spec.origin_region", "required with a latency SLO (the round trip is measured from it)")
    if spec.deferrable:
        if not math.isfinite(spec.deadline_unix_s) or spec.deadline_unix_s <= now_s:
            raise InvalidArgumentError("spec.deadline_unix_s", "a deferrable workload needs a deadline in the future")
    elif spec.deadline_unix_s:
        raise InvalidArgumentError("spec.deadline_unix_s", "only a deferrable workload has a deadline")
    w = spec.weights
    for name in ("performance", "cost", "energy", "fairness"):
        value = getattr(w, name)
        if not math.isfinite(value) or value < 0:
            raise InvalidArgumentError(f"spec.weights.{name}", "must be a finite number ≥ 0")
    if spec.workload_class not in CLASSES:
        raise InvalidArgumentError("spec.workload_class", f"one of {', '.join(repr(c) for c in CLASSES)}")
    return parsed
