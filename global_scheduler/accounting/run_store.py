"""Record a simulated run's energy accounting interval by interval, save it, load it back.

A simulation loop (``meridian bench routing``, ``meridian demo``) makes one :class:`RunRecorder` per
policy and calls :meth:`RunRecorder.record_interval` once per step with numpy arrays over its
clusters::

    recorder = RunRecorder(clusters=[ClusterSpec(name="eu-north-a", region="eu-north", pue=1.15), ...],
                           policy="gnn")
    for step in ...:
        recorder.record_interval(t0, t1, power_watts=p, idle_power_watts=idle,
                                 carbon_intensity_g_per_kwh=ci, price_per_mwh=price, usage=usage)
    save_run(out_dir, {"gnn": recorder, "karmada": karmada_recorder}, primary="gnn")

Each interval's energy is the mean IT power × its length; it is shared out to tenants and workloads
Kepler-style (:func:`meridian.energy.attribute_node_energy`, a cluster treated as one node), and its
carbon and cost use that interval's own intensity and price. Recording is O(clusters + workloads) per
call with no per-row Python loop; rows are joined once at save time.

On disk (``--save-run DIR``)::

    DIR/manifest.json                  format, policies, primary policy, clusters, regions, span,
                                       currency, step, idle split, provenance of the grid data, and
                                       the work each policy did when the caller gave it (``work``:
                                       replica-hours, placed, failed; :mod:`.work`)
    DIR/<policy>/accounting.csv        one row per (interval, cluster, tenant, workload) with energy
    DIR/<policy>/clusters.csv          one row per (interval, cluster): power, idle power, PUE,
                                       intensity, price, energy, unknown seconds (the node-level data)

Floats are written with ``repr`` so a load gives back exactly the numbers recorded.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import BaseModel, ConfigDict, Field

from global_scheduler.accounting.table import (
    IDLE_WORKLOAD,
    KEY_COLUMNS,
    UNATTRIBUTED_TENANT,
    VALUE_COLUMNS,
    AccountingTable,
)
from global_scheduler.accounting.work import WorkDone
from meridian import energy

RUN_FORMAT = "meridian-run/1"
CLUSTER_COLUMNS = ("start_s", "end_s", "region", "cluster", "power_watts", "idle_power_watts", "pue",
                   "carbon_intensity_g_per_kwh", "price_per_mwh", "it_energy_joules", "unknown_s")
ACCOUNTING_COLUMNS = ("start_s", "end_s", *KEY_COLUMNS, *VALUE_COLUMNS)
_POLICY_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class RunFormatError(ValueError):
    """A run directory that cannot be read; the message names the file."""


class ClusterSpec(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    region: str
    pue: float = Field(1.2, ge=1.0, description="Power usage effectiveness of the site; 1.2 is a typical "
                       "modern hyperscale figure (Uptime Institute surveys report ~1.5 industry-wide).")


class RunManifest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    format: str = RUN_FORMAT
    created: datetime
    primary_policy: str
    policies: list[str]
    clusters: list[ClusterSpec]
    currency: str = "EUR"
    start_s: float
    end_s: float
    step_s: float
    idle_split: str = "requests"
    provenance: dict[str, Any] = Field(default_factory=dict)
    work: dict[str, WorkDone] = Field(default_factory=dict, description="What each policy did, when recorded "
                                      "(runs saved without it, and older ones, have none: 'same work' is unknown).")

    @property
    def regions(self) -> list[str]:
        return sorted({c.region for c in self.clusters})


@dataclass(frozen=True)
class WorkloadUsage:
    """CPU use of workloads in one interval: one entry per (cluster, tenant, workload).

    ``cpu_core_seconds`` is CPU time used during the interval; ``requested_cpu_cores`` the cores
    reserved (Kubernetes requests), which carry the idle-power share under ``idle_split="requests"``.
    """

    cluster_index: ArrayLike
    tenant: Sequence[str]
    workload: Sequence[str]
    cpu_core_seconds: ArrayLike
    requested_cpu_cores: ArrayLike


@dataclass(frozen=True)
class WorkloadEnergy:
    """IT energy already attributed to workloads by the caller: one entry per (cluster, tenant, workload).

    For simulations that share energy out themselves; the remainder of each cluster's energy is booked
    as ``(unattributed, idle)``. Shares larger than the cluster's energy are an error.
    """

    cluster_index: ArrayLike
    tenant: Sequence[str]
    workload: Sequence[str]
    it_energy_joules: ArrayLike


def _per_cluster(value: ArrayLike | None, n: int, name: str, default: float | NDArray[np.float64] | None = None
                 ) -> NDArray[np.float64]:
    if value is None:
        if default is None:
            raise ValueError(f"{name} is required")
        return np.broadcast_to(np.asarray(default, dtype=np.float64), (n,)).copy()
    arr = np.broadcast_to(np.asarray(value, dtype=np.float64), (n,)).copy()
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} must be finite for every cluster")
    return arr


@dataclass
class RunRecorder:
    """Accumulates one policy's accounting over a run (module doc)."""

    clusters: Sequence[ClusterSpec]
    policy: str = "run"
    idle_split: energy.IdleSplit = "requests"
    _cluster_rows: list[dict[str, NDArray[Any]]] = field(default_factory=list, repr=False)
    _rows: list[dict[str, NDArray[Any]]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        if not self.clusters:
            raise ValueError("a run needs at least one cluster")
        if not _POLICY_RE.match(self.policy):
            raise ValueError(f"policy name {self.policy!r} must be a plain name (letters, digits, _ . -)")
        self._names = np.array([c.name for c in self.clusters], dtype=np.str_)
        self._regions = np.array([c.region for c in self.clusters], dtype=np.str_)
        self._pue = np.array([c.pue for c in self.clusters], dtype=np.float64)

    @property
    def n_clusters(self) -> int:
        return len(self.clusters)

    def record_interval(
        self,
        start_s: float,
        end_s: float,
        *,
        power_watts: ArrayLike,
        carbon_intensity_g_per_kwh: ArrayLike,
        price_per_mwh: ArrayLike,
        idle_power_watts: ArrayLike | None = None,
        pue: ArrayLike | None = None,
        allocatable_cpu_cores: ArrayLike | None = None,
        unknown_s: ArrayLike | None = None,
        usage: WorkloadUsage | WorkloadEnergy | None = None,
    ) -> None:
        """Account one interval ``[start_s, end_s)`` (Unix seconds) for every cluster.

        ``power_watts`` is each cluster's mean IT power over the interval (covered time only when
        ``unknown_s`` says part of it was not seen); intensity and price are those of this interval in
        each cluster's region. ``idle_power_watts`` defaults to 0 (everything counts as active);
        ``allocatable_cpu_cores`` defaults to the requests (all idle energy goes to the requesters).
        ``usage`` is either CPU use (shared out Kepler-style here) or energy already attributed.
        """
        n = self.n_clusters
        duration_s = float(end_s) - float(start_s)
        if duration_s <= 0:
            raise ValueError(f"interval end {end_s} is not after its start {start_s}")
        power = _per_cluster(power_watts, n, "power_watts")
        if (power < 0).any():
            raise ValueError("power_watts must not be negative")
        intensity = _per_cluster(carbon_intensity_g_per_kwh, n, "carbon_intensity_g_per_kwh")
        price = _per_cluster(price_per_mwh, n, "price_per_mwh")
        idle_w = _per_cluster(idle_power_watts, n, "idle_power_watts", 0.0)
        site_pue = _per_cluster(pue, n, "pue", self._pue)
        unknown = _per_cluster(unknown_s, n, "unknown_s", 0.0)
        covered_s = np.clip(duration_s - unknown, 0.0, duration_s)
        it_j = power * covered_s

        if usage is None:
            usage = WorkloadUsage(np.empty(0, np.int64), [], [], np.empty(0), np.empty(0))
        pod_cluster = np.asarray(usage.cluster_index, dtype=np.int64)
        if isinstance(usage, WorkloadEnergy):
            pod_j = np.asarray(usage.it_energy_joules, dtype=np.float64)
            rest = it_j - np.bincount(pod_cluster, pod_j, minlength=n)
            if (pod_j < 0).any() or (rest < -1e-6 * np.maximum(it_j, 1.0)).any():
                raise ValueError("workload energy must be non-negative and within each cluster's energy")
            split = energy.Attribution(pod_j, np.zeros_like(pod_j), np.maximum(rest, 0.0))
        else:
            req = np.asarray(usage.requested_cpu_cores, dtype=np.float64)
            alloc = (np.bincount(pod_cluster, req, minlength=n) if allocatable_cpu_cores is None
                     else _per_cluster(allocatable_cpu_cores, n, "allocatable_cpu_cores"))
            split = energy.attribute_node_energy(
                node_energy_joules=it_j, node_idle_joules=idle_w * covered_s, node_allocatable_cpu_cores=alloc,
                pod_node_index=pod_cluster, pod_cpu_core_seconds=usage.cpu_core_seconds,
                pod_requested_cpu_cores=req, idle_split=self.idle_split)

        self._cluster_rows.append({
            "start_s": np.full(n, float(start_s)), "end_s": np.full(n, float(end_s)),
            "region": self._regions, "cluster": self._names, "power_watts": power, "idle_power_watts": idle_w,
            "pue": site_pue, "carbon_intensity_g_per_kwh": intensity, "price_per_mwh": price,
            "it_energy_joules": it_j, "unknown_s": unknown,
        })
        # Workload rows, then one (unattributed, idle) row per cluster closing its balance.
        row_cluster = np.concatenate([pod_cluster, np.arange(n)])
        row_it = np.concatenate([split.pod_joules, split.unattributed_joules])
        m = len(row_cluster)
        self._rows.append({
            "start_s": np.full(m, float(start_s)), "end_s": np.full(m, float(end_s)),
            "region": self._regions[row_cluster], "cluster": self._names[row_cluster],
            "tenant": np.concatenate([np.asarray(usage.tenant, dtype=np.str_),
                                      np.full(n, UNATTRIBUTED_TENANT)]),
            "workload": np.concatenate([np.asarray(usage.workload, dtype=np.str_), np.full(n, IDLE_WORKLOAD)]),
            "it_energy_joules": row_it,
            "facility_energy_joules": energy.facility_energy_joules(row_it, site_pue[row_cluster]),
            "carbon_grams": energy.carbon_grams(row_it, site_pue[row_cluster], intensity[row_cluster]),
            "cost": energy.energy_cost(row_it, site_pue[row_cluster], price[row_cluster]),
            "unknown_s": np.concatenate([np.zeros(len(pod_cluster)), unknown]),
        })

    def table(self) -> AccountingTable:
        if not self._rows:
            return AccountingTable.empty()
        return AccountingTable.from_columns({k: np.concatenate([r[k] for r in self._rows]) for k in ACCOUNTING_COLUMNS})

    def cluster_series(self) -> dict[str, NDArray[Any]]:
        if not self._cluster_rows:
            return {k: np.empty(0) for k in CLUSTER_COLUMNS}
        return {k: np.concatenate([r[k] for r in self._cluster_rows]) for k in CLUSTER_COLUMNS}


class FederationRunHook:
    """``on_interval`` hook for ``FederationSim.run``: records its hourly per-cluster records.

    The simulator reports per cluster ``power_watts`` (IT), ``energy_kwh`` (facility, × PUE),
    ``carbon_g_per_kwh``, ``price_per_mwh`` and optionally ``tenants_energy_kwh`` (facility); PUE is
    read back as facility / IT energy. The recorder is made on the first call, when the clusters are
    known. Duck-typed so the accounting package does not import the simulator.
    """

    def __init__(self, policy: str) -> None:
        self.policy = policy
        self.recorder: RunRecorder | None = None

    def __call__(self, records: Sequence[Any]) -> None:
        if not records:
            return
        power = np.array([r.power_watts for r in records], dtype=np.float64)
        seconds = float(records[0].seconds)
        fac_j = np.array([r.energy_kwh for r in records], dtype=np.float64) * energy.JOULES_PER_KWH
        it_j = power * seconds
        pue = np.divide(fac_j, it_j, out=np.ones_like(it_j), where=it_j > 0)
        if self.recorder is None:
            self.recorder = RunRecorder([ClusterSpec(name=r.cluster, region=r.region, pue=max(1.0, float(p)))
                                         for r, p in zip(records, pue, strict=True)], policy=self.policy)
        # A cluster drawing nothing in its first hour shows no PUE then; keep the spec's to the first real one.
        specs = list(self.recorder.clusters)
        for i, spec in enumerate(specs):
            if spec.pue == 1.0 and it_j[i] > 0 and pue[i] > 1.0:
                specs[i] = spec.model_copy(update={"pue": float(pue[i])})
        self.recorder.clusters = specs
        c_idx: list[int] = []
        tenants: list[str] = []
        tenant_j: list[float] = []
        for i, r in enumerate(records):
            for tenant, kwh in (getattr(r, "tenants_energy_kwh", None) or {}).items():
                c_idx.append(i)
                tenants.append(tenant)
                tenant_j.append(kwh * energy.JOULES_PER_KWH / max(float(pue[i]), 1.0))
        start_s = records[0].start.timestamp()
        self.recorder.record_interval(
            start_s, start_s + seconds, power_watts=power, pue=np.maximum(pue, 1.0),
            carbon_intensity_g_per_kwh=[r.carbon_g_per_kwh for r in records],
            price_per_mwh=[r.price_per_mwh for r in records],
            usage=WorkloadEnergy(np.array(c_idx, dtype=np.int64), tenants, tenants, np.array(tenant_j))
            if c_idx else None)


def save_federation_run(directory: str | Path, hooks: Mapping[str, FederationRunHook], *,
                        primary: str | None = None, provenance: Mapping[str, Any] | None = None,
                        work: Mapping[str, WorkDone] | None = None) -> Path:
    """Save the runs ``FederationRunHook``s recorded; the primary is ``gnn`` when present, else the first.

    ``work``: what each policy did (``WorkDone.from_result`` of the simulator's results), which lets a
    report say whether a comparison is on the same work."""
    recorders = {name: h.recorder for name, h in hooks.items() if h.recorder is not None}
    if not recorders:
        raise ValueError("no policy recorded any interval")
    chosen = primary or ("gnn" if "gnn" in recorders else next(iter(recorders)))
    return save_run(directory, recorders, primary=chosen, currency="EUR", provenance=provenance, work=work)


def _write_csv(path: Path, columns: Mapping[str, NDArray[Any]], order: Sequence[str]) -> None:
    cols = [columns[name].tolist() for name in order]
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(order)
        writer.writerows(zip(*cols, strict=True))


def _read_csv(path: Path, order: Sequence[str]) -> dict[str, list[str]]:
    if not path.is_file():
        raise RunFormatError(f"{path}: missing")
    with path.open(newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader, None)
        if header is None or [h.strip() for h in header] != list(order):
            raise RunFormatError(f"{path}: expected columns {list(order)}, got {header}")
        rows = list(reader)
    return {name: [r[i] for r in rows] for i, name in enumerate(order)}


def save_run(directory: str | Path, recorders: Mapping[str, RunRecorder], *, primary: str,
             currency: str = "EUR", provenance: Mapping[str, Any] | None = None,
             work: Mapping[str, WorkDone] | None = None) -> Path:
    """Write every policy's accounting and a manifest under ``directory`` (created if needed)."""
    if primary not in recorders:
        raise ValueError(f"primary policy {primary!r} is not among the recorders {sorted(recorders)}")
    if set(work or {}) - set(recorders):
        raise ValueError(f"work given for policies that recorded nothing: {sorted(set(work or {}) - set(recorders))}")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    first = recorders[primary]
    spans: list[tuple[float, float, float]] = []
    for name, rec in recorders.items():
        if not _POLICY_RE.match(name):
            raise ValueError(f"policy name {name!r} must be a plain name")
        series = rec.cluster_series()
        if len(series["start_s"]):
            steps = series["end_s"] - series["start_s"]
            spans.append((float(series["start_s"].min()), float(series["end_s"].max()), float(steps.min())))
        sub = directory / name
        sub.mkdir(exist_ok=True)
        table = rec.table()
        _write_csv(sub / "accounting.csv", {k: getattr(table, k) for k in ACCOUNTING_COLUMNS}, ACCOUNTING_COLUMNS)
        _write_csv(sub / "clusters.csv", series, CLUSTER_COLUMNS)
    if not spans:
        raise ValueError("nothing was recorded")
    manifest = RunManifest(
        created=datetime.now(UTC), primary_policy=primary, policies=list(recorders), clusters=list(first.clusters),
        currency=currency, start_s=min(s[0] for s in spans), end_s=max(s[1] for s in spans),
        step_s=min(s[2] for s in spans), idle_split=first.idle_split, provenance=dict(provenance or {}),
        work=dict(work or {}))
    (directory / "manifest.json").write_text(manifest.model_dump_json(indent=2) + "\n")
    return directory


@dataclass(frozen=True)
class LoadedRun:
    """A saved run, readable as an :class:`~global_scheduler.accounting.report.AccountingSource`."""

    directory: Path
    manifest: RunManifest
    tables: dict[str, AccountingTable]
    series: dict[str, dict[str, NDArray[Any]]]

    @property
    def name(self) -> str:
        return str(self.directory)

    @property
    def primary_policy(self) -> str:
        return self.manifest.primary_policy

    @property
    def currency(self) -> str:
        return self.manifest.currency

    @property
    def resolution_s(self) -> float:
        return self.manifest.step_s

    def policies(self) -> list[str]:
        return list(self.manifest.policies)

    def regions(self) -> list[str]:
        return self.manifest.regions

    def clusters(self) -> list[str]:
        return sorted(c.name for c in self.manifest.clusters)

    def span(self) -> tuple[float, float]:
        return self.manifest.start_s, self.manifest.end_s

    def work(self, policy: str) -> WorkDone | None:
        """What ``policy`` did over the run, when the run recorded it."""
        return self.manifest.work.get(policy)

    def table(self, *, policy: str | None = None, since_s: float | None = None,
              until_s: float | None = None) -> AccountingTable:
        del since_s, until_s  # the whole run is in memory; the report clips
        return self.tables[policy or self.primary_policy]


def load_run(directory: str | Path) -> LoadedRun:
    """Read a directory written by :func:`save_run`; raises :class:`RunFormatError` naming the file."""
    directory = Path(directory)
    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        raise RunFormatError(f"{directory}: not a saved run (no manifest.json)")
    try:
        manifest = RunManifest.model_validate_json(manifest_path.read_text())
    except ValueError as exc:
        raise RunFormatError(f"{manifest_path}: {exc}") from None
    if manifest.format != RUN_FORMAT:
        raise RunFormatError(f"{manifest_path}: format {manifest.format!r}, this Meridian reads {RUN_FORMAT!r}")
    tables: dict[str, AccountingTable] = {}
    series: dict[str, dict[str, NDArray[Any]]] = {}
    for policy in manifest.policies:
        raw = _read_csv(directory / policy / "accounting.csv", ACCOUNTING_COLUMNS)
        try:
            tables[policy] = AccountingTable.from_columns(dict(raw))
        except ValueError as exc:
            raise RunFormatError(f"{directory / policy / 'accounting.csv'}: {exc}") from None
        craw = _read_csv(directory / policy / "clusters.csv", CLUSTER_COLUMNS)
        series[policy] = {k: (np.asarray(v, dtype=np.str_) if k in ("region", "cluster")
                              else np.asarray(v, dtype=np.float64)) for k, v in craw.items()}
    return LoadedRun(directory, manifest, tables, series)
