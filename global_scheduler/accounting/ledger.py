"""The live energy ledger in Redis: time-bucketed sums, applied at most once per record.

Layout (``{p}`` is the key prefix, ``meridian:`` in production, a unique one per test)::

    {p}energy:bucket:{start_s}    hash   "region|cluster|tenant|workload|metric" -> float (HINCRBYFLOAT)
    {p}energy:buckets             zset   bucket start -> bucket start (the index a report range-scans)
    {p}energy:applied:{start_s}   set    record ids already applied whose interval starts in that bucket
    {p}energy:clusters            hash   cluster -> region (what a report validates names against)
    {p}energy:meta                hash   bucket_s, currency (fixed when the ledger is first used)

Metrics per key are ``it`` (IT joules), ``fac`` (facility joules), ``co2`` (grams), ``cost`` and
``unk`` (unknown seconds).

Exactly-once: one Lua script adds the record id to the applied set of its first bucket, and only if
it was not there applies every increment and — when the record came from a stream — acknowledges the
stream entry, all atomically (Redis runs a script without interleaving other commands). So a consumer
that dies before the script leaves the entry pending for another consumer to claim (nothing
acknowledged is lost), and one that dies after it leaves nothing half-applied; a redelivered or
re-sent record finds its id and is only acknowledged (nothing is applied twice). Records that span a
bucket boundary are split by time (constant power within a record). Buckets, and their applied sets,
expire after ``retention_s`` so memory stays bounded; a record older than the retention cannot be
deduplicated any more and is refused.

Hazard: the script touches several keys, so under Redis Cluster every key must share a hash slot —
give the prefix a hash tag (``{meridian}:``). Names must not contain ``|`` (Kubernetes names cannot).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import dataclass

import numpy as np
import redis

from global_scheduler.accounting.table import (
    IDLE_WORKLOAD,
    INVALID_NAME,
    UNATTRIBUTED_TENANT,
    AccountingTable,
)
from meridian import energy
from protos import energy_pb2

METRICS = {"it": "it_energy_joules", "fac": "facility_energy_joules", "co2": "carbon_grams", "cost": "cost",
           "unk": "unknown_s"}
SEP = "|"
# Printable ASCII without the separator: names are ledger keys and are printed in reports.
_SHARE_NAME = re.compile(r"[\x21-\x7b\x7d\x7e][\x20-\x7b\x7d\x7e]{0,252}")  # 253 characters at most

_APPLY = """
-- KEYS[1] applied set, KEYS[2] bucket index, KEYS[3] stream (may be unused), KEYS[4] cluster->region
-- hash, KEYS[5..] bucket hashes. ARGV[1] record id, ARGV[2] ttl s, ARGV[3] entry id or "", ARGV[4] group,
-- ARGV[5] cluster, ARGV[6] region, then per bucket: start, n, then n (field, increment) pairs
local ttl = tonumber(ARGV[2])
local fresh = redis.call('SADD', KEYS[1], ARGV[1])
if fresh == 1 then
  redis.call('EXPIRE', KEYS[1], ttl)
  redis.call('HSET', KEYS[4], ARGV[5], ARGV[6])
  local i = 7
  for b = 5, #KEYS do
    local start = ARGV[i]
    local n = tonumber(ARGV[i + 1])
    i = i + 2
    redis.call('ZADD', KEYS[2], start, start)
    for _ = 1, n do
      redis.call('HINCRBYFLOAT', KEYS[b], ARGV[i], ARGV[i + 1])
      i = i + 2
    end
    redis.call('EXPIRE', KEYS[b], ttl)
  end
end
if ARGV[3] ~= '' then
  redis.call('XACK', KEYS[3], ARGV[4], ARGV[3])
end
return fresh
"""


class LedgerError(ValueError):
    """A record the ledger refuses (bad interval, names with the separator, older than retention)."""


@dataclass(frozen=True)
class StreamAck:
    """The stream entry to acknowledge in the same atomic step as the apply."""

    stream: str
    group: str
    entry_id: str


def share_name(name: str) -> str:
    """``name`` when it can key a share of the ledger, else :data:`INVALID_NAME`."""
    return name if _SHARE_NAME.fullmatch(name) else INVALID_NAME


def quarantine_share_names(record: energy_pb2.EnergyRecord) -> int:
    """Rename in place the shares whose tenant or workload cannot be a ledger key; returns how many.

    One producer's bad tenant name (``evil|tenant``) must not cost every other tenant of the cluster
    its accounting: the share keeps its energy under :data:`INVALID_NAME`, so totals stay exact."""
    bad = 0
    for s in record.shares:
        tenant, workload = share_name(s.tenant), share_name(s.workload)
        if tenant != s.tenant or workload != s.workload:
            s.tenant, s.workload = tenant, workload
            bad += 1
    return bad


def validate_record(record: energy_pb2.EnergyRecord) -> None:
    if not record.record_id:
        raise LedgerError("record_id is empty")
    if record.end_unix_ms <= record.start_unix_ms:
        raise LedgerError(f"{record.record_id}: end {record.end_unix_ms} is not after start {record.start_unix_ms}")
    for name in (record.region, record.cluster, *(s.tenant for s in record.shares),
                 *(s.workload for s in record.shares)):
        if not name or SEP in name:
            raise LedgerError(f"{record.record_id}: names must be non-empty and free of {SEP!r}: {name!r}")
    values = [record.it_energy_joules, record.unknown_seconds, record.pue, record.carbon_g_per_kwh,
              record.price_per_mwh, *(s.it_energy_joules for s in record.shares)]
    if not all(math.isfinite(v) for v in values):
        raise LedgerError(f"{record.record_id}: a value is not finite")
    if record.it_energy_joules < 0 or any(s.it_energy_joules < 0 for s in record.shares):
        raise LedgerError(f"{record.record_id}: energy must not be negative")
    if record.pue < 1.0:
        raise LedgerError(f"{record.record_id}: PUE {record.pue} is below 1")
    shared = sum(s.it_energy_joules for s in record.shares)
    if shared > record.it_energy_joules * (1 + 1e-9) + 1e-9:
        raise LedgerError(f"{record.record_id}: shares ({shared} J) exceed the cluster's energy "
                          f"({record.it_energy_joules} J)")


def record_rows(record: energy_pb2.EnergyRecord) -> list[tuple[str, dict[str, float]]]:
    """The (group key, metric increments) a record adds over its whole interval."""
    pue, ci, price = record.pue, record.carbon_g_per_kwh, record.price_per_mwh
    rows: dict[str, dict[str, float]] = {}
    shared = 0.0
    for s in record.shares:
        key = SEP.join((record.region, record.cluster, s.tenant, s.workload))
        acc = rows.setdefault(key, {m: 0.0 for m in METRICS})
        acc["it"] += s.it_energy_joules
        shared += s.it_energy_joules
    rest_key = SEP.join((record.region, record.cluster, UNATTRIBUTED_TENANT, IDLE_WORKLOAD))
    rest = rows.setdefault(rest_key, {m: 0.0 for m in METRICS})
    rest["it"] += max(record.it_energy_joules - shared, 0.0)
    rest["unk"] += record.unknown_seconds
    for acc in rows.values():
        acc["fac"] = float(energy.facility_energy_joules(acc["it"], pue))
        acc["co2"] = float(energy.carbon_grams(acc["it"], pue, ci))
        acc["cost"] = float(energy.energy_cost(acc["it"], pue, price))
    return list(rows.items())


class RedisLedger:
    """Apply energy records and read them back as an :class:`AccountingTable` (module doc)."""

    def __init__(self, client: redis.Redis, *, prefix: str = "meridian:", bucket_s: int = 60,
                 retention_s: int = 35 * 86400, currency: str = "EUR") -> None:
        if bucket_s <= 0:
            raise ValueError("bucket_s must be positive")
        self.client = client
        self.prefix = prefix
        self.retention_s = retention_s
        meta_key = f"{prefix}energy:meta"
        # The first user fixes the bucket size; a later one with another size would corrupt the sums.
        client.hsetnx(meta_key, "bucket_s", bucket_s)
        client.hsetnx(meta_key, "currency", currency)
        meta = {k.decode(): v.decode() for k, v in client.hgetall(meta_key).items()}
        self.bucket_s = int(meta["bucket_s"])
        self.currency = meta["currency"]
        if self.bucket_s != bucket_s:
            raise ValueError(f"the ledger at {prefix!r} uses {self.bucket_s} s buckets, not {bucket_s}")
        self._apply = client.register_script(_APPLY)

    # -- writing -----------------------------------------------------------------------------------

    def _bucket_key(self, start_s: int) -> str:
        return f"{self.prefix}energy:bucket:{start_s}"

    def apply(self, record: energy_pb2.EnergyRecord, *, ack: StreamAck | None = None,
              now_s: float | None = None) -> bool:
        """Apply ``record`` once; returns False when it had already been applied (and acks either way)."""
        validate_record(record)
        start_s, end_s = record.start_unix_ms / 1000.0, record.end_unix_ms / 1000.0
        if (now_s if now_s is not None else time.time()) - end_s > self.retention_s:
            raise LedgerError(f"{record.record_id}: older than the ledger's retention ({self.retention_s} s)")
        first = math.floor(start_s / self.bucket_s) * self.bucket_s
        edges = np.arange(first, end_s, self.bucket_s, dtype=np.float64)
        overlap = np.minimum(edges + self.bucket_s, end_s) - np.maximum(edges, start_s)
        fractions = overlap / (end_s - start_s)
        rows = record_rows(record)
        keys = [f"{self.prefix}energy:applied:{first}", f"{self.prefix}energy:buckets",
                ack.stream if ack else f"{self.prefix}energy:no-stream", f"{self.prefix}energy:clusters"]
        args: list[str | int] = [record.record_id, self.retention_s, ack.entry_id if ack else "",
                                 ack.group if ack else "", record.cluster, record.region]
        for edge, frac in zip(edges, fractions, strict=True):
            if frac <= 0:
                continue
            keys.append(self._bucket_key(int(edge)))
            pairs = [(f"{key}{SEP}{m}", v * frac) for key, acc in rows for m, v in acc.items() if v != 0.0]
            args += [int(edge), len(pairs)]
            for f, v in pairs:
                args += [f, repr(float(v))]
        return bool(self._apply(keys=keys, args=args))

    # -- reading (AccountingSource) -------------------------------------------------------------------

    @property
    def name(self) -> str:
        return f"redis ledger {self.prefix}energy"

    @property
    def primary_policy(self) -> str:
        return "live"

    @property
    def resolution_s(self) -> float:
        return float(self.bucket_s)

    def policies(self) -> list[str]:
        return ["live"]

    def _bucket_starts(self, since_s: float | None = None, until_s: float | None = None) -> list[int]:
        lo = "-inf" if since_s is None else math.floor(since_s / self.bucket_s) * self.bucket_s
        hi = "+inf" if until_s is None else f"({until_s}"
        return [int(float(m)) for m in self.client.zrangebyscore(f"{self.prefix}energy:buckets", lo, hi)]

    def span(self) -> tuple[float, float]:
        starts = self._bucket_starts()
        if not starts:
            now = time.time()
            return now - self.bucket_s, now
        return float(starts[0]), float(starts[-1] + self.bucket_s)

    def table(self, *, policy: str | None = None, since_s: float | None = None,
              until_s: float | None = None) -> AccountingTable:
        del policy  # the live ledger has one policy: the one running
        starts = self._bucket_starts(since_s, until_s)
        pipe = self.client.pipeline(transaction=False)
        for s in starts:
            pipe.hgetall(self._bucket_key(s))
        cols: dict[str, list[object]] = {k: [] for k in ("start_s", "end_s", "region", "cluster", "tenant",
                                                          "workload", *METRICS.values())}
        for s, fields in zip(starts, pipe.execute(), strict=True):
            by_key: dict[str, dict[str, float]] = {}
            for raw_field, raw_value in fields.items():
                key, _, metric = raw_field.decode().rpartition(SEP)
                by_key.setdefault(key, {})[metric] = float(raw_value)
            for key, values in by_key.items():
                region, cluster, tenant, workload = key.split(SEP)
                cols["start_s"].append(float(s))
                cols["end_s"].append(float(s + self.bucket_s))
                cols["region"].append(region)
                cols["cluster"].append(cluster)
                cols["tenant"].append(tenant)
                cols["workload"].append(workload)
                for m, col in METRICS.items():
                    cols[col].append(values.get(m, 0.0))
        return AccountingTable.from_columns(cols)

    def _cluster_regions(self) -> dict[str, str]:
        raw = self.client.hgetall(f"{self.prefix}energy:clusters")
        return {k.decode(): v.decode() for k, v in raw.items()}

    def regions(self) -> list[str]:
        return sorted(set(self._cluster_regions().values()))

    def clusters(self) -> list[str]:
        return sorted(self._cluster_regions())
