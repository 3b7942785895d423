"""Request validation: every bad field becomes :class:`InvalidArgumentError` naming the field.

Quantities are parsed with :mod:`meridian.quantity`, whose ``QuantityError`` names the field; the
field path is prefixed with where it sits in the request (``spec.requests.cpu``).

Every string and repeated field of a request has a bound, listed in :data:`FIELD_BOUNDS` (a test
walks the request messages and fails on a field missing there), so what one accepted request can make
the server store, parse or echo is bounded too. The transport caps a whole request at
``api.max_receive_message_bytes`` (1 MiB) before any of this runs.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import lru_cache

from meridian import quantity
from meridian.model import MILLI_GPU_PER_DEVICE
from protos import global_api_pb2 as api

# Patterns are applied with fullmatch: `$` in `match` also matches before a trailing newline ("web\n").
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
REGION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
# Printable ASCII without separators: tenants name keys of the accounting ledger ("|" is its
# separator) and are shown in terminals (no control, bidi or ANSI escape characters).
TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@/-]{0,252}")
CLASSES = ("", "latency-sensitive", "batch")
# A container image reference (registry/repository[:tag][@digest]) as Kubernetes accepts it in a pod's
# spec; the full grammar is the registry's to enforce, this keeps out spaces, control characters and floods.
IMAGE = re.compile(r"[a-z0-9][a-z0-9._/:-]{0,254}(@sha256:[a-f0-9]{64})?")
MAX_IMAGE_CHARS = 255 + 72
MAX_REPLICAS = 10_000
MAX_IDEMPOTENCY_KEY = 256
MAX_ALLOWED_REGIONS = 64  # far more regions than any provider has; bounds what one request can store
MAX_WEIGHT = 1e6  # objective weights are relative; larger values only overflow the features
MAX_QUANTITY_CHARS = 64  # "1500m", "128Gi", "1.5e3": a Kubernetes quantity is a few characters
# The largest spec the bounds above allow serializes to about 5 KB; unknown fields (a newer client's,
# or padding) are kept with the spec and stored, so the whole spec is bounded as well.
MAX_SPEC_BYTES = 16 * 1024
MAX_ID_CHARS = 128  # ids are 32 hex characters; room for another scheme
MAX_CLUSTER_NAME = 253
MAX_PAGE_TOKEN_CHARS = 20  # a token is an offset the server issued
ECHO_CHARS = 64

# Request field (message.field path) → its bound; over it is INVALID_ARGUMENT naming the field.
FIELD_BOUNDS: dict[str, str] = {
    "SubmitWorkloadRequest.spec": f"≤ {MAX_SPEC_BYTES // 1024} KiB serialized, unknown fields included",
    "SubmitWorkloadRequest.spec.name": "a DNS-1123 label, ≤ 63 characters",
    "SubmitWorkloadRequest.spec.tenant": "≤ 253 characters: letters, digits, '.', '_', ':', '@', '/', '-'",
    "SubmitWorkloadRequest.spec.requests.cpu": f"a quantity, ≤ {MAX_QUANTITY_CHARS} characters",
    "SubmitWorkloadRequest.spec.requests.memory": f"a quantity, ≤ {MAX_QUANTITY_CHARS} characters",
    "SubmitWorkloadRequest.spec.requests.gpu": f"a quantity, ≤ {MAX_QUANTITY_CHARS} characters",
    "SubmitWorkloadRequest.spec.requests.gpu_milli": f"a quantity, ≤ {MAX_QUANTITY_CHARS} characters",
    "SubmitWorkloadRequest.spec.allowed_regions": f"≤ {MAX_ALLOWED_REGIONS} region names of ≤ 63 characters",
    "SubmitWorkloadRequest.spec.origin_region": "a region name, ≤ 63 characters",
    "SubmitWorkloadRequest.spec.workload_class": "'', 'latency-sensitive' or 'batch'",
    "SubmitWorkloadRequest.spec.image": "an image reference (lower-case registry/repository[:tag][@sha256:…]), "
                                        f"≤ {MAX_IMAGE_CHARS} characters",
    "SubmitWorkloadRequest.idempotency_key": f"≤ {MAX_IDEMPOTENCY_KEY} characters",
    "GetWorkloadRequest.id": f"≤ {MAX_ID_CHARS} characters",
    "WatchWorkloadRequest.id": f"≤ {MAX_ID_CHARS} characters",
    "CancelWorkloadRequest.id": f"≤ {MAX_ID_CHARS} characters",
    "ListWorkloadsRequest.tenant": "a tenant name (as spec.tenant)",
    "ListWorkloadsRequest.cluster": f"≤ {MAX_CLUSTER_NAME} characters",
    "ListWorkloadsRequest.page_token": f"≤ {MAX_PAGE_TOKEN_CHARS} digits, as the server issued it",
}


def echo(value: str) -> str:
    """A rejected value as an error message quotes it: at most ECHO_CHARS, so a 1 MB name cannot turn
    INVALID_ARGUMENT into RESOURCE_EXHAUSTED on the reply's metadata."""
    if len(value) <= ECHO_CHARS:
        return repr(value)
    return f"{value[:ECHO_CHARS]!r}… ({len(value):,} characters)"


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
    if len(text) > MAX_QUANTITY_CHARS:
        raise InvalidArgumentError(field, f"{echo(text)}: a quantity is at most {MAX_QUANTITY_CHARS} characters")
    parsed = _parse_cached(text, field, milli)
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
    if not DNS_LABEL.fullmatch(spec.name):
        raise InvalidArgumentError("spec.name", f"{echo(spec.name)} is not a DNS-1123 label (lower case, digits, '-', "
                                   "≤ 63)")
    if not spec.tenant:
        raise InvalidArgumentError("spec.tenant", "required")
    if not TENANT.fullmatch(spec.tenant):
        raise InvalidArgumentError("spec.tenant", f"{echo(spec.tenant)}: at most 253 characters, letters, digits and "
                                   "'.', '_', ':', '@', '/', '-', starting with a letter or digit")
    if not 1 <= spec.replicas <= MAX_REPLICAS:
        raise InvalidArgumentError("spec.replicas", f"must be between 1 and {MAX_REPLICAS}, got {spec.replicas}")
    if not -1_000_000 <= spec.priority <= 1_000_000:
        raise InvalidArgumentError("spec.priority", "must be within ±1,000,000")
    if not spec.HasField("requests"):
        raise InvalidArgumentError("spec.requests", "required")
    parsed = parse_requests(spec.requests)
    if len(spec.allowed_regions) > MAX_ALLOWED_REGIONS:
        raise InvalidArgumentError("spec.allowed_regions", f"at most {MAX_ALLOWED_REGIONS} regions, got "
                                   f"{len(spec.allowed_regions):,}")
    for i, region in enumerate(spec.allowed_regions):
        if not REGION.fullmatch(region):
            raise InvalidArgumentError(f"spec.allowed_regions[{i}]", f"{echo(region)} is not a region name")
    if spec.image and not IMAGE.fullmatch(spec.image):
        raise InvalidArgumentError("spec.image", f"{echo(spec.image)} is not an image reference (lower-case "
                                   "registry/repository[:tag][@sha256:digest], no spaces)")
    if spec.origin_region and not REGION.fullmatch(spec.origin_region):
        raise InvalidArgumentError("spec.origin_region", f"{echo(spec.origin_region)} is not a region name")
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
        if not math.isfinite(value) or not 0 <= value <= MAX_WEIGHT:
            raise InvalidArgumentError(f"spec.weights.{name}", f"must be a number from 0 to {MAX_WEIGHT:g}")
    if spec.workload_class not in CLASSES:
        raise InvalidArgumentError("spec.workload_class", f"one of {', '.join(repr(c) for c in CLASSES)}")
    # Last, so that a known field over its own bound is named; what is left over is unknown fields.
    size = spec.ByteSize()
    if size > MAX_SPEC_BYTES:
        raise InvalidArgumentError("spec", f"at most {MAX_SPEC_BYTES:,} bytes serialized, unknown fields included; "
                                   f"got {size:,}")
    return parsed


def validate_id(wid: str, field: str = "id") -> None:
    if not wid:
        raise InvalidArgumentError(field, "required")
    if len(wid) > MAX_ID_CHARS:
        raise InvalidArgumentError(field, f"{echo(wid)}: at most {MAX_ID_CHARS} characters")


@dataclass(frozen=True)
class ListQuery:
    offset: int
    limit: int


def validate_list(request: api.ListWorkloadsRequest, *, default_page_size: int, max_page_size: int) -> ListQuery:
    """Check a ListWorkloads request's filters and paging; returns where the page starts and its size."""
    if request.tenant and not TENANT.fullmatch(request.tenant):
        raise InvalidArgumentError("tenant", f"{echo(request.tenant)} is not a tenant name (at most 253 characters, "
                                   "letters, digits and '.', '_', ':', '@', '/', '-')")
    if len(request.cluster) > MAX_CLUSTER_NAME:
        raise InvalidArgumentError("cluster", f"{echo(request.cluster)}: at most {MAX_CLUSTER_NAME} characters")
    if request.state and request.state not in api.WorkloadState.values():
        raise InvalidArgumentError("state", "unknown workload state")
    size = request.page_size or default_page_size
    if not 1 <= size <= max_page_size:
        raise InvalidArgumentError("page_size", f"must be between 1 and {max_page_size}")
    offset = 0
    if request.page_token:
        token = request.page_token
        if len(token) > MAX_PAGE_TOKEN_CHARS or not token.isascii() or not token.isdigit():
            raise InvalidArgumentError("page_token", "not a token this server issued")
        offset = int(token)
    return ListQuery(offset, size)
