"""Energy, carbon and cost reports over any accounting source: a saved run or the live ledger.

The builder reads as its stages: validate the query against the source (unknown region or cluster,
until before since, a bucket finer than the source resolves → :class:`ReportArgumentError` naming the
argument), take the table, clip it to the time range (pro-rated), filter, total per region and per
the requested grouping, bucket in time, and add the counterfactual policy's carbon over the same time
range when the source recorded one.

The counterfactual compares the whole fleet over the same time range, even when the report is filtered
to some regions: a policy that moves work between regions cannot be judged on one region alone. The
report says so in its notes when a filter is set. Whether the two did the same work is judged by
:mod:`global_scheduler.accounting.work` from what the run recorded (:class:`RecordsWork`), over the
whole run only; :func:`counterfactual_sentence` says "for the same work" only then.

Groups by tenant or workload are ordered by energy, largest first (regions and clusters by name), and
the ``(unattributed)`` / ``(idle)`` row is explained in the report's notes wherever it appears.
"""

from __future__ import annotations

import csv
import io
import math
from datetime import UTC, datetime
from typing import Literal, Protocol, runtime_checkable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, computed_field

from global_scheduler.accounting.table import IDLE_WORKLOAD, UNATTRIBUTED_TENANT, AccountingTable
from global_scheduler.accounting.work import WorkDone, carbon_claim, same_work
from meridian.energy import JOULES_PER_KWH

GroupBy = Literal["region", "cluster", "tenant", "workload"]
GROUP_BY_VALUES: tuple[str, ...] = ("region", "cluster", "tenant", "workload")
DEFAULT_COUNTERFACTUAL = "karmada"
# Groupings whose rows are ordered by energy (largest first); the others by name.
BY_ENERGY = ("tenant", "workload")
UNATTRIBUTED_NOTE = (f"{UNATTRIBUTED_TENANT} / {IDLE_WORKLOAD}: energy no workload can be charged with — the idle "
                     "power of capacity no pod requested, and active power while no pod used CPU (docs/energy.md)")


class ReportArgumentError(ValueError):
    """A report argument that cannot be honoured; ``argument`` names it (``--region``, ``since`` …)."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


class AccountingSource(Protocol):
    """What a report reads: a saved run (``LoadedRun``) or the live ledger (``RedisLedger``)."""

    @property
    def name(self) -> str: ...
    @property
    def primary_policy(self) -> str: ...
    @property
    def currency(self) -> str: ...
    @property
    def resolution_s(self) -> float: ...
    def policies(self) -> list[str]: ...
    def regions(self) -> list[str]: ...
    def clusters(self) -> list[str]: ...
    def span(self) -> tuple[float, float]: ...
    def table(self, *, policy: str | None = None, since_s: float | None = None,
              until_s: float | None = None) -> AccountingTable: ...


@runtime_checkable
class RecordsWork(Protocol):
    """A source that recorded the work each policy did (a saved federation run), for "the same work"."""

    def work(self, policy: str) -> WorkDone | None: ...


class ReportQuery(BaseModel):
    model_config = ConfigDict(extra="forbid")

    regions: list[str] = Field(default_factory=list, description="Only these regions (empty: all).")
    clusters: list[str] = Field(default_factory=list, description="Only these clusters (empty: all).")
    since: datetime | None = None
    until: datetime | None = None
    group_by: GroupBy = "region"
    bucket_seconds: int | None = Field(None, description="Time buckets of this many seconds; None: none.")
    policy: str | None = Field(None, description="Which recorded policy to report (default: the primary).")
    counterfactual: str | None = Field(None, description="Counterfactual policy; None: 'karmada' when the "
                                       "source has it, otherwise none.")


class EnergyTotals(BaseModel):
    energy_kwh: float = 0.0
    facility_energy_kwh: float = 0.0
    carbon_kg: float = 0.0
    cost: float = 0.0
    unknown_seconds: float = 0.0
    mean_power_watts: float = 0.0
    carbon_intensity_g_per_kwh: float | None = None


class EnergyBucket(BaseModel):
    start: datetime
    end: datetime
    key: str
    totals: EnergyTotals


class Counterfactual(BaseModel):
    policy: str
    totals: EnergyTotals
    carbon_saved_kg: float
    carbon_saved_ratio: float
    work: WorkDone | None = Field(None, description="What the reported policy did over the run; None: unknown.")
    counterfactual_work: WorkDone | None = Field(None, description="What the counterfactual policy did.")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def same_work(self) -> bool | None:
        """True only when both did the same work (:func:`~global_scheduler.accounting.work.same_work`);
        None when it is not known."""
        if self.work is None or self.counterfactual_work is None:
            return None
        return same_work(self.work, self.counterfactual_work)


class EnergyReport(BaseModel):
    """A report; ``model_dump(mode="json")`` is the ``--format json`` output."""

    regions: dict[str, EnergyTotals]
    totals: EnergyTotals
    group_by: str
    groups: dict[str, EnergyTotals]
    source: str
    policy: str
    currency: str
    since: datetime
    until: datetime
    bucket_seconds: int | None = None
    resolution_seconds: float = Field(0.0, description="The source's finest time bucket (a run's step).")
    buckets: list[EnergyBucket] = Field(default_factory=list)
    counterfactual: Counterfactual | None = None
    notes: list[str] = Field(default_factory=list)


def to_unix_s(when: datetime) -> float:
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)  # naive times are UTC, like every trace in the repository
    return when.timestamp()


def from_unix_s(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, tz=UTC)


def _totals(it_j: float, fac_j: float, co2_g: float, cost: float, unknown_s: float, duration_s: float
            ) -> EnergyTotals:
    return EnergyTotals(
        energy_kwh=it_j / JOULES_PER_KWH, facility_energy_kwh=fac_j / JOULES_PER_KWH, carbon_kg=co2_g / 1000.0,
        cost=cost, unknown_seconds=unknown_s, mean_power_watts=it_j / duration_s if duration_s > 0 else 0.0,
        carbon_intensity_g_per_kwh=(co2_g / (fac_j / JOULES_PER_KWH)) if fac_j > 0 else None)


def _sum_table(table: AccountingTable, duration_s: float) -> EnergyTotals:
    return _totals(float(table.it_energy_joules.sum()), float(table.facility_energy_joules.sum()),
                   float(table.carbon_grams.sum()), float(table.cost.sum()), float(table.unknown_s.sum()),
                   duration_s)


def _grouped(table: AccountingTable, by: str, duration_s: float) -> dict[str, EnergyTotals]:
    keys, sums = table.group_sums(by)
    return order_groups(by, {str(k): _totals(float(sums["it_energy_joules"][i]),
                                             float(sums["facility_energy_joules"][i]), float(sums["carbon_grams"][i]),
                                             float(sums["cost"][i]), float(sums["unknown_s"][i]), duration_s)
                             for i, k in enumerate(keys)})


def order_groups(by: str, groups: dict[str, EnergyTotals]) -> dict[str, EnergyTotals]:
    """Tenants and workloads by energy, largest first (ties by name); regions and clusters by name."""
    if by in BY_ENERGY:
        return dict(sorted(groups.items(), key=lambda kv: (-kv[1].energy_kwh, kv[0])))
    return dict(sorted(groups.items()))


def _validate(source: AccountingSource, q: ReportQuery) -> tuple[float, float, str, str | None]:
    known_regions = source.regions()
    unknown = sorted(set(q.regions) - set(known_regions))
    if unknown:
        raise ReportArgumentError("--region", f"unknown region {', '.join(unknown)}; the source has "
                                  f"{', '.join(known_regions) or 'no regions'}")
    known_clusters = source.clusters()
    unknown = sorted(set(q.clusters) - set(known_clusters))
    if unknown:
        raise ReportArgumentError("--cluster", f"unknown cluster {', '.join(unknown)}; the source has "
                                  f"{', '.join(known_clusters) or 'no clusters'}")
    first_s, last_s = source.span()
    since_s = to_unix_s(q.since) if q.since is not None else first_s
    until_s = to_unix_s(q.until) if q.until is not None else last_s
    if until_s <= since_s:
        raise ReportArgumentError("--until", f"until ({from_unix_s(until_s).isoformat()}) must be after since "
                                  f"({from_unix_s(since_s).isoformat()})")
    if q.bucket_seconds is not None:
        res = source.resolution_s
        if q.bucket_seconds <= 0:
            raise ReportArgumentError("--bucket", "must be positive")
        if res > 0 and q.bucket_seconds < res:
            raise ReportArgumentError("--bucket", f"{q.bucket_seconds} s is finer than the source's "
                                      f"resolution of {res:g} s")
        if res > 0 and not math.isclose(q.bucket_seconds / res, round(q.bucket_seconds / res)):
            raise ReportArgumentError("--bucket", f"{q.bucket_seconds} s is not a multiple of the source's "
                                      f"resolution of {res:g} s")
    policies = source.policies()
    policy = q.policy or source.primary_policy
    if policy not in policies:
        raise ReportArgumentError("--policy", f"unknown policy {policy!r}; the source has {', '.join(policies)}")
    counterfactual = q.counterfactual
    if counterfactual is None:
        counterfactual = DEFAULT_COUNTERFACTUAL if DEFAULT_COUNTERFACTUAL in policies else None
    elif counterfactual not in policies:
        raise ReportArgumentError("--counterfactual", f"the source has no run of policy {counterfactual!r}; "
                                  f"it has {', '.join(policies)}")
    if counterfactual == policy:
        counterfactual = None
    return since_s, until_s, policy, counterfactual


def build_report(source: AccountingSource, query: ReportQuery | None = None) -> EnergyReport:
    q = query or ReportQuery()
    since_s, until_s, policy, counterfactual = _validate(source, q)
    duration_s = until_s - since_s
    whole = source.table(policy=policy, since_s=since_s, until_s=until_s).clip_to(since_s, until_s)
    table = whole
    if q.regions:
        table = table.select(np.isin(table.region, q.regions))
    if q.clusters:
        table = table.select(np.isin(table.cluster, q.clusters))

    notes: list[str] = []
    buckets: list[EnergyBucket] = []
    if q.bucket_seconds:
        starts, keys, sums = table.bucket_sums(q.group_by, origin_s=since_s, bucket_s=q.bucket_seconds)
        for b, start in enumerate(starts):
            end = min(start + q.bucket_seconds, until_s)
            for k, key in enumerate(keys):
                if sums["it_energy_joules"][b, k] == 0 and sums["unknown_s"][b, k] == 0:
                    continue
                buckets.append(EnergyBucket(
                    start=from_unix_s(start), end=from_unix_s(end), key=str(key),
                    totals=_totals(*(float(sums[c][b, k]) for c in ("it_energy_joules", "facility_energy_joules",
                                                                   "carbon_grams", "cost", "unknown_s")),
                                   end - start)))

    cf_model = None
    if counterfactual is not None:
        cf_table = source.table(policy=counterfactual, since_s=since_s, until_s=until_s).clip_to(since_s, until_s)
        cf = _sum_table(cf_table, duration_s)
        actual = _sum_table(whole, duration_s)
        saved = cf.carbon_kg - actual.carbon_kg
        # The recorded work is the whole run's: over part of its time range it is not known.
        whole_run = (since_s, until_s) == source.span()
        works = source if isinstance(source, RecordsWork) and whole_run else None
        cf_model = Counterfactual(policy=counterfactual, totals=cf, carbon_saved_kg=saved,
                                  carbon_saved_ratio=saved / cf.carbon_kg if cf.carbon_kg > 0 else 0.0,
                                  work=works.work(policy) if works else None,
                                  counterfactual_work=works.work(counterfactual) if works else None)
        if q.regions or q.clusters:
            notes.append(f"the counterfactual ({counterfactual}) compares the whole fleet's work over the same "
                         "time range, not only the selected regions/clusters")
    totals = _sum_table(table, duration_s)
    groups = _grouped(table, q.group_by, duration_s)
    if UNATTRIBUTED_TENANT in groups or IDLE_WORKLOAD in groups:
        notes.append(UNATTRIBUTED_NOTE)
    if totals.unknown_seconds > 0:
        notes.append(f"{totals.unknown_seconds:.0f} cluster-seconds had no telemetry; their energy is not "
                     "interpolated and not counted")
    return EnergyReport(
        regions=_grouped(table, "region", duration_s), totals=totals, group_by=q.group_by,
        groups=groups, source=source.name, policy=policy,
        currency=source.currency, since=from_unix_s(since_s), until=from_unix_s(until_s),
        bucket_seconds=q.bucket_seconds, resolution_seconds=source.resolution_s, buckets=buckets, counterfactual=cf_model, notes=notes)


# ---- rendering ------------------------------------------------------------------------------------

def counterfactual_sentence(report: EnergyReport) -> str | None:
    """The counterfactual's one-sentence claim (:func:`~global_scheduler.accounting.work.carbon_claim`);
    None without a counterfactual."""
    cf = report.counterfactual
    if cf is None:
        return None
    return carbon_claim(policy=report.policy, carbon_kg=cf.totals.carbon_kg - cf.carbon_saved_kg, work=cf.work,
                        baseline=cf.policy, baseline_carbon_kg=cf.totals.carbon_kg, baseline_work=cf.counterfactual_work)


def counterfactual_label(report: EnergyReport) -> str:
    """The counterfactual's row name: ``karmada (counterfactual, same work)`` only when it was."""
    cf = report.counterfactual
    assert cf is not None
    return f"{cf.policy} (counterfactual, same work)" if cf.same_work else f"{cf.policy} (counterfactual)"


TABLE_COLUMNS = ("energy_kwh", "facility_energy_kwh", "carbon_kg", "cost", "carbon_intensity_g_per_kwh",
                 "mean_power_watts", "unknown_seconds")


def render_csv(report: EnergyReport) -> str:
    """One row per group (or per bucket and group when buckets were asked for)."""
    out = io.StringIO()
    writer = csv.writer(out)
    if report.buckets:
        writer.writerow(["start", "end", report.group_by, *TABLE_COLUMNS])
        for b in report.buckets:
            writer.writerow([b.start.isoformat(), b.end.isoformat(), b.key,
                             *(_csv_value(getattr(b.totals, c)) for c in TABLE_COLUMNS)])
    else:
        writer.writerow([report.group_by, *TABLE_COLUMNS])
        for key, t in report.groups.items():
            writer.writerow([key, *(_csv_value(getattr(t, c)) for c in TABLE_COLUMNS)])
        writer.writerow(["total", *(_csv_value(getattr(report.totals, c)) for c in TABLE_COLUMNS)])
    return out.getvalue()


def _csv_value(v: float | None) -> str:
    return "" if v is None else repr(float(v))


def render_markdown(report: EnergyReport) -> str:
    """The table as Markdown (the README example and ``--format table`` in a file)."""
    head = f"| {report.group_by} | energy kWh | facility kWh | carbon kg | cost {report.currency} | mean gCO₂/kWh |"
    lines = [head, "|---|---:|---:|---:|---:|---:|"]

    def row(name: str, t: EnergyTotals) -> str:
        ci = "–" if t.carbon_intensity_g_per_kwh is None else f"{t.carbon_intensity_g_per_kwh:.1f}"
        return (f"| {name} | {t.energy_kwh:,.1f} | {t.facility_energy_kwh:,.1f} | {t.carbon_kg:,.1f} | "
                f"{t.cost:,.2f} | {ci} |")

    lines += [row(k, t) for k, t in report.groups.items()]
    lines.append(row("**total**", report.totals))
    if report.counterfactual is not None:
        lines.append(row(f"*{counterfactual_label(report)}*", report.counterfactual.totals))
        lines.append("")
        lines.append(str(counterfactual_sentence(report)))
    if UNATTRIBUTED_NOTE in report.notes:
        lines += ["", UNATTRIBUTED_NOTE + "."]
    return "\n".join(lines) + "\n"
