"""The work a policy did in a run, and the one rule for saying two policies did "the same work".

A carbon comparison between two policies (``meridian report energy``'s counterfactual, the demo's
replay line, the energy plot) says "for the same work" only when it was:

* the replica-hours run within the accounted horizon agree within :data:`SAME_WORK_REL_TOL` (0.5 %:
  a policy that defers work past the horizon, or fails some, did less, and emits less for less), and
* both placed the same number of workloads and failed the same number.

Otherwise the sentence gives both amounts of work, the failures when they differ, and the carbon per
replica-hour, which compares unequal amounts of work fairly. When the work was not recorded (a run
saved without it, or a report over part of a run's time range) the sentence says it is unknown
instead of claiming either.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

SAME_WORK_REL_TOL = 0.005


class WorkDone(BaseModel):
    """What one policy did over a run (the federation simulator's ``RunResult``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    replica_hours: float = Field(ge=0, description="Replica-hours run within the accounted horizon.")
    placed: int = Field(ge=0, description="Workloads placed.")
    failures: int = Field(ge=0, description="Workloads that failed.")
    slo_violations: int = Field(0, ge=0, description="Workloads that broke their latency SLO.")

    @classmethod
    def from_result(cls, result: Mapping[str, Any]) -> WorkDone:
        """From the federation simulator's ``RunResult.as_dict()`` (``meridian bench routing``'s JSON)."""
        return cls(replica_hours=float(result["workload_hours"]), placed=int(result["placed"]),
                   failures=int(result["failures"]), slo_violations=int(result.get("slo_violations", 0)))


def same_work(a: WorkDone, b: WorkDone, *, rel_tol: float = SAME_WORK_REL_TOL) -> bool:
    """Equal placements and failures, and replica-hours within ``rel_tol`` of the larger."""
    return (a.placed == b.placed and a.failures == b.failures
            and math.isclose(a.replica_hours, b.replica_hours, rel_tol=rel_tol, abs_tol=1e-9))


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def work_differences(work: WorkDone, other: WorkDone) -> list[str]:
    """``["48,326 vs 49,310 replica-hours", "1 vs 0 failed workloads", …]``: what differs, the work first."""
    out = []
    if not math.isclose(work.replica_hours, other.replica_hours, rel_tol=SAME_WORK_REL_TOL, abs_tol=1e-9):
        out.append(f"{work.replica_hours:,.0f} vs {other.replica_hours:,.0f} replica-hours")
    if work.placed != other.placed:
        out.append(f"{work.placed:,} vs {other.placed:,} workloads placed")
    if work.failures != other.failures:
        out.append(f"{work.failures:,} vs {other.failures:,} failed workloads")
    if work.slo_violations != other.slo_violations:
        out.append(f"{work.slo_violations:,} vs {other.slo_violations:,} SLO violations")
    return out


def carbon_claim(*, policy: str, carbon_kg: float, work: WorkDone | None, baseline: str, baseline_carbon_kg: float,
                 baseline_work: WorkDone | None) -> str:
    """One sentence comparing ``policy``'s carbon with ``baseline``'s, honest about the work (module doc).

    >>> carbon_claim(policy="gnn", carbon_kg=10.0, work=WorkDone(replica_hours=100, placed=5, failures=0),
    ...              baseline="karmada", baseline_carbon_kg=40.0,
    ...              baseline_work=WorkDone(replica_hours=100, placed=5, failures=0))
    'gnn emitted 30.00 kg CO₂ (75.0%) less than karmada for the same work (100 replica-hours, 5 workloads placed, 0 failed).'
    """
    saved = baseline_carbon_kg - carbon_kg
    ratio = abs(saved) / baseline_carbon_kg if baseline_carbon_kg > 0 else 0.0
    head = f"{policy} emitted {abs(saved):,.2f} kg CO₂ ({ratio:.1%}) {'less' if saved >= 0 else 'more'} than {baseline}"
    if work is None or baseline_work is None:
        return (f"{head} over the same time range; the work each did there was not recorded, so it may not "
                "have been the same work.")
    if same_work(work, baseline_work):
        slo = [d for d in work_differences(work, baseline_work) if "SLO" in d]
        return (f"{head} for the same work ({work.replica_hours:,.0f} replica-hours, "
                f"{_plural(work.placed, 'workload')} placed, {work.failures:,} failed)"
                + (f", with {slo[0]}." if slo else "."))
    text = f"{head}, but not for the same work: {', '.join(work_differences(work, baseline_work))}"
    if work.replica_hours > 0 and baseline_work.replica_hours > 0:
        per = 1000.0 * carbon_kg / work.replica_hours
        base_per = 1000.0 * baseline_carbon_kg / baseline_work.replica_hours
        change = (base_per - per) / base_per if base_per > 0 else 0.0
        text += (f"; per replica-hour {per:,.1f} vs {base_per:,.1f} g CO₂ "
                 f"({abs(change):.1%} {'less' if change >= 0 else 'more'})")
    return text + "."
