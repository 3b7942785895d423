"""The accounting table: one row per (interval, region, cluster, tenant, workload), columns as arrays.

Both sources of a report produce it — a saved run (:mod:`.run_store`) and the live Redis ledger
(:mod:`.ledger`) — so the report builder has one code path. Energy that no workload can be charged
with (idle power of unrequested capacity, active power with no pod using CPU) is a row with tenant
``(unattributed)`` and workload ``(idle)``; that row also carries the cluster's unknown seconds, so
sums over any grouping equal the clusters' totals exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np
from numpy.typing import NDArray

UNATTRIBUTED_TENANT = "(unattributed)"
IDLE_WORKLOAD = "(idle)"
# Energy of a holding whose tenant or workload name cannot be a ledger key (empty, too long, the
# separator, control characters): kept under this name instead of refusing the cluster's whole record.
INVALID_NAME = "(invalid-name)"

KEY_COLUMNS = ("region", "cluster", "tenant", "workload")
VALUE_COLUMNS = ("it_energy_joules", "facility_energy_joules", "carbon_grams", "cost", "unknown_s")


@dataclass(frozen=True)
class AccountingTable:
    start_s: NDArray[np.float64]
    end_s: NDArray[np.float64]
    region: NDArray[np.str_]
    cluster: NDArray[np.str_]
    tenant: NDArray[np.str_]
    workload: NDArray[np.str_]
    it_energy_joules: NDArray[np.float64]
    facility_energy_joules: NDArray[np.float64]
    carbon_grams: NDArray[np.float64]
    cost: NDArray[np.float64]
    unknown_s: NDArray[np.float64]

    def __post_init__(self) -> None:
        n = len(self.start_s)
        for f in fields(self):
            if len(getattr(self, f.name)) != n:
                raise ValueError(f"column {f.name} has {len(getattr(self, f.name))} rows, expected {n}")

    def __len__(self) -> int:
        return len(self.start_s)

    @classmethod
    def empty(cls) -> AccountingTable:
        return cls.from_columns({})

    @classmethod
    def from_columns(cls, columns: dict[str, object]) -> AccountingTable:
        """Build from any sequences; missing columns become empty (for an empty table)."""
        out: dict[str, np.ndarray] = {}
        for f in fields(cls):
            raw = columns.get(f.name, [])
            out[f.name] = np.asarray(raw, dtype=np.str_ if f.name in KEY_COLUMNS else np.float64)
        return cls(**out)

    @classmethod
    def concat(cls, tables: list[AccountingTable]) -> AccountingTable:
        if not tables:
            return cls.empty()
        return cls(**{f.name: np.concatenate([getattr(t, f.name) for t in tables]) for f in fields(cls)})

    def select(self, mask: NDArray[np.bool_]) -> AccountingTable:
        return AccountingTable(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    def clip_to(self, since_s: float, until_s: float) -> AccountingTable:
        """Rows overlapping ``[since_s, until_s)``, values pro-rated by the overlap.

        Pro-rating by time assumes constant power inside a row's interval, which is how the rows were
        made (mean power over the interval), so it loses nothing that was known.
        """
        lo = np.maximum(self.start_s, since_s)
        hi = np.minimum(self.end_s, until_s)
        keep = hi > lo
        t = self.select(keep)
        lo, hi = lo[keep], hi[keep]
        span = t.end_s - t.start_s
        frac = np.divide(hi - lo, span, out=np.ones_like(span), where=span > 0)
        scaled = {name: getattr(t, name) * frac for name in VALUE_COLUMNS}
        return AccountingTable(start_s=lo, end_s=hi, region=t.region, cluster=t.cluster, tenant=t.tenant,
                               workload=t.workload, **scaled)

    def group_sums(self, by: str) -> tuple[NDArray[np.str_], dict[str, NDArray[np.float64]]]:
        """Sums of every value column per distinct value of ``by`` (sorted keys)."""
        keys, inverse = np.unique(getattr(self, by), return_inverse=True)
        sums = {name: np.bincount(inverse, getattr(self, name), minlength=len(keys)) for name in VALUE_COLUMNS}
        return keys, sums

    def bucket_sums(self, by: str, *, origin_s: float, bucket_s: float
                    ) -> tuple[NDArray[np.float64], NDArray[np.str_], dict[str, NDArray[np.float64]]]:
        """Sums per (time bucket of a row's start, group); returns bucket starts, keys, and a
        ``[n_buckets, n_keys]`` array per value column."""
        keys, key_idx = np.unique(getattr(self, by), return_inverse=True)
        if len(self) == 0:
            return np.empty(0), keys, {name: np.zeros((0, len(keys))) for name in VALUE_COLUMNS}
        b = np.floor((self.start_s - origin_s) / bucket_s).astype(np.int64)
        n_b = int(b.max()) + 1
        flat = b * len(keys) + key_idx
        sums = {name: np.bincount(flat, getattr(self, name), minlength=n_b * len(keys)).reshape(n_b, len(keys))
                for name in VALUE_COLUMNS}
        return origin_s + np.arange(n_b) * bucket_s, keys, sums
