"""Sequential promotion gates and automatic rollback for the learned models (issue 26, part 2).

A candidate model and the active one are compared on a stream of **paired** outcomes of a lower-is-better
metric: for each decision (or window of decisions) the candidate's outcome ``c_i`` and the active
model's ``a_i`` on the same input (shadow: counterfactual; canary: matched windows). The stream has no
fixed length, so the test must be valid whenever it is looked at; a fixed-sample t-test checked after
every window would promote a worse model far more often than its stated 5 %.

The test is a **confidence sequence** (CS) for the mean of a linear statistic ``x_i = c_i − k·a_i − b``:
bounds ``[L_n, U_n]`` that contain the true mean *at every n simultaneously* with probability ≥ 1 − α.
The boundary is the two-sided normal mixture of Howard, Ramdas, McAuliffe and Sekhon (2021,
"Time-uniform, nonparametric, nonasymptotic confidence sequences", Ann. Statist.; its two-sided
normal-mixture boundary):

    |S_n − n·μ| ≤ σ · sqrt( 2 (n + ρ) · log( sqrt((n + ρ) / ρ) / α ) )

with ``ρ`` (in samples) chosen so the boundary is tightest near ``optimise_at`` samples. With a known
sub-Gaussian scale ``σ`` (bounded differences: half their range) the CS is exact; without one, ``σ`` is
the running sample standard deviation, which makes it the *asymptotic* CS of Waudby-Smith, Arnold, Wu,
Wang and Ramdas (2021, "Time-uniform central limit theory and asymptotic confidence sequences") —
valid as n grows, which is why decisions wait for ``min_samples``.

Decisions (``margin`` m relative, ``absolute_margin`` b, lower is better):

* **REJECT** when the candidate is worse with confidence: ``L_n(c − (1 + r)·a) > 0`` (``r`` the reject
  margin, 0 by default: any harm shown rejects). Checked first: a model shown worse is never promoted.
* **PROMOTE** when it is no worse than the active one by more than the margin, with confidence:
  ``U_n(c − (1 + m)·a − b) ≤ 0``, after ``min_samples``.
* **HOLD** otherwise. Decisions latch: once made, later samples are ignored.

Because the CS holds uniformly in n, P(ever promoting a candidate whose mean exceeds (1 + m)·active + b)
≤ α and P(ever rejecting one no worse than (1 + r)·active) ≤ α, however long the stream. A gate over
several metrics splits α between its statistical tests (Bonferroni). **Hard** metrics (routing's SLO
violations) are not tested: the candidate is rejected as soon as its cumulative excess over the active
model passes a bound.

The :class:`RollbackMonitor` runs the same CS on a canary or newly active model against the model it
replaced: **ROLLBACK** when ``L_n(new − (1 + bound)·old) > 0`` (regressed past ``bound``, shown), **KEEP**
when ``U_n(...) ≤ 0`` (shown within the bound). If neither by ``max_decisions`` the conservative rule
applies: **roll back** — a model is kept only once shown within the bound, so the monitor always decides
within ``max_decisions`` and P(keeping a model regressed past the bound) ≤ α.

Every result carries its :class:`Evidence` (n, means, the CS of the mean difference, the decision bounds)
so an audit record can store why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Literal

import numpy as np
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

Tier = Literal["placement", "routing", "autoscaling"]


class GateDecision(StrEnum):
    PROMOTE = "promote"
    HOLD = "hold"
    REJECT = "reject"


class RollbackDecision(StrEnum):
    KEEP = "keep"
    WATCH = "watch"
    ROLLBACK = "rollback"


class SequentialTestSettings(BaseModel):
    """The confidence sequence shared by gates and rollback monitors."""

    confidence: float = Field(0.95, gt=0.5, lt=1.0, description="Probability that the confidence sequence "
                              "holds at every sample size at once. 0.95: the issue's 'stated confidence'; at most "
                              "5 % of worse-than-margin candidates are ever promoted, however long they run.")
    min_samples: int = Field(100, ge=2, description="Paired samples before any decision. Without a known scale "
                             "the CS uses the sample standard deviation, whose relative error is ≈ 1/sqrt(2n): "
                             "~7 % at 100 samples, small enough for the asymptotic CS to hold.")
    optimise_at: int = Field(1000, ge=1, description="Sample size where the boundary is tightest (it is valid at "
                             "every size). 1000 paired windows: a canary of a few hours at one window a minute "
                             "per cluster or deployment.")
    scale: float | None = Field(None, gt=0, description="Known sub-Gaussian scale of the paired statistic (half "
                                "the range of bounded differences): makes the CS exact (Howard et al. 2021). "
                                "None: the running sample standard deviation (asymptotic CS), because outcome "
                                "counts such as unschedulable pods have no natural bound.")


class GateSettings(BaseSettings):
    """Promotion gates per tier. Environment: ``MERIDIAN_GATES_*`` with ``__`` between levels."""

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_GATES_", env_nested_delimiter="__", extra="ignore")

    test: SequentialTestSettings = Field(default_factory=SequentialTestSettings, description="The confidence "
                                         "sequence: confidence, minimum sample, where it is tightest.")
    margin: float = Field(0.02, ge=0, description="Non-inferiority margin on each tier's primary metric, "
                          "relative to the active model's mean: promote when the candidate costs at most 2 % "
                          "more. Smaller margins make equal models wait longer (the CS width falls as "
                          "1/sqrt(n): halving the margin needs ~4× the samples).")
    absolute_margin: float = Field(0.0, ge=0, description="Margin in the metric's own units added to the "
                                   "relative one; 0 so a metric's units never need a per-deployment choice. Raise "
                                   "it for metrics that are mostly zero (a relative margin on zero is zero).")
    constraint_margin: float = Field(0.01, ge=0, description="Relative margin on the constraint metrics (GPU "
                                     "fragmentation, replica-hours): 1 %, tighter than the primary's because "
                                     "these are measured exactly and 'no more replica-hours' is the promise.")
    reject_margin: float = Field(0.0, ge=0, description="Relative harm the candidate must be shown to do "
                                 "before rejection; 0: any harm shown with confidence rejects.")
    slo_excess_bound: float = Field(0.0, ge=0, description="Routing's hard gate: SLO violations the candidate "
                                    "may have beyond the active model's, cumulatively, before rejection. 0: SLO "
                                    "violations are never traded for carbon.")


class RollbackSettings(BaseModel):
    """When a canary or newly active model is undone."""

    test: SequentialTestSettings = Field(default_factory=lambda: SequentialTestSettings(
        min_samples=50, optimise_at=300), description="The confidence sequence, tightest near 300 decisions and "
        "deciding from 50: a bad model must be caught within hundreds of decisions, not the gate's thousands.")
    bound: float = Field(0.10, ge=0, description="Regression, relative to the replaced model, that must be "
                         "undone: 10 %, five times the promotion margin, so a model promoted by the gate is not "
                         "rolled back for the noise the gate tolerated.")
    absolute_bound: float = Field(0.0, ge=0, description="Regression in the metric's own units added to the "
                                  "relative bound; 0 for the same reason as the gate's absolute margin.")
    max_decisions: int = Field(2000, ge=2, description="The monitor decides within this many paired decisions; "
                               "if still undecided it rolls back (a model is kept only once shown within the "
                               "bound). 2000: a 30 % regression of a count metric of mean 5 (paired, Poisson-like) is "
                               "shown in 100-250 decisions (tests/model_registry/test_gates.py), and 2000 is "
                               "under two days at one window a minute.")


@dataclass(frozen=True)
class Evidence:
    """What a decision rests on, for the audit record."""

    metric: str
    n: int
    mean_candidate: float
    mean_active: float
    mean_difference: float  # candidate − active (positive: candidate worse)
    lower: float  # the CS of the mean difference at this n
    upper: float
    decision_lower: float  # L_n of the reject (or rollback) statistic: > 0 rejects
    decision_upper: float  # U_n of the promote (or keep) statistic: ≤ 0 promotes
    confidence: float
    excess_total: float  # Σ candidate − Σ active: the damage (or saving) so far

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def mixture_rho(optimise_at: int, alpha: float) -> float:
    """``ρ`` (in samples) making the normal-mixture boundary tightest near ``optimise_at`` samples: the
    closed-form approximation given by Howard et al. (2021) and used by Waudby-Smith et al. (2021)."""
    log_term = 2.0 * math.log(1.0 / alpha)
    return optimise_at / (log_term + math.log(1.0 + log_term))


def mixture_half_width(n: np.ndarray, scale: np.ndarray, alpha: float, rho: float) -> np.ndarray:
    """Half-width on the *mean* of the two-sided normal-mixture CS at each ``n`` (vectorised)."""
    v = n + rho
    return scale * np.sqrt(2.0 * v * np.log(np.sqrt(v / rho) / alpha)) / n


@dataclass
class PairedMoments:
    """Running sums of a paired stream; any linear statistic's mean and variance follow from them."""

    n: int = 0
    sum_c: float = 0.0
    sum_a: float = 0.0
    sum_cc: float = 0.0
    sum_aa: float = 0.0
    sum_ca: float = 0.0

    def prefixes(self, candidate: np.ndarray, active: np.ndarray) -> dict[str, np.ndarray]:
        """The sums after each new sample (this state's totals as offset), vectorised."""
        c, a = candidate.astype(float), active.astype(float)
        return {"n": self.n + np.arange(1, c.size + 1, dtype=float),
                "c": self.sum_c + np.cumsum(c), "a": self.sum_a + np.cumsum(a),
                "cc": self.sum_cc + np.cumsum(c * c), "aa": self.sum_aa + np.cumsum(a * a),
                "ca": self.sum_ca + np.cumsum(c * a)}

    def advance(self, prefix: Mapping[str, np.ndarray], upto: int) -> None:
        """Take the sums at index ``upto`` of ``prefix`` as the new state."""
        self.n = int(prefix["n"][upto])
        self.sum_c, self.sum_a = float(prefix["c"][upto]), float(prefix["a"][upto])
        self.sum_cc, self.sum_aa, self.sum_ca = (float(prefix[k][upto]) for k in ("cc", "aa", "ca"))


def linear_statistic(prefix: Mapping[str, np.ndarray], k: float, b: float) -> tuple[np.ndarray, np.ndarray]:
    """Mean and (population) standard deviation of ``c − k·a − b`` at each prefix."""
    n = prefix["n"]
    mean_raw = (prefix["c"] - k * prefix["a"]) / n
    second = (prefix["cc"] - 2.0 * k * prefix["ca"] + k * k * prefix["aa"]) / n
    std = np.sqrt(np.maximum(second - mean_raw * mean_raw, 0.0))
    return mean_raw - b, std


@dataclass
class SequentialComparison:
    """The CS machinery for one metric: the decision bounds at every prefix of a paired stream.

    ``promote_k, promote_b``: statistic ``c − promote_k·a − promote_b`` whose upper bound ≤ 0 passes;
    ``reject_k, reject_b``: statistic whose lower bound > 0 fails.
    """

    metric: str
    settings: SequentialTestSettings
    alpha: float
    promote_k: float
    promote_b: float
    reject_k: float
    reject_b: float
    moments: PairedMoments = field(default_factory=PairedMoments)

    @property
    def rho(self) -> float:
        return mixture_rho(self.settings.optimise_at, self.alpha)

    def _bound(self, prefix: Mapping[str, np.ndarray], k: float, b: float) -> tuple[np.ndarray, np.ndarray]:
        mean, std = linear_statistic(prefix, k, b)
        scale = np.full_like(mean, self.settings.scale) if self.settings.scale is not None else std
        # A stream that has been constant so far has no spread yet; a tiny floor keeps the bound finite.
        scale = np.maximum(scale, 1e-12)
        return mean, mixture_half_width(prefix["n"], scale, self.alpha, self.rho)

    def evaluate(self, candidate: np.ndarray, active: np.ndarray) -> tuple[dict[str, np.ndarray], np.ndarray,
                                                                           np.ndarray]:
        """Prefix sums, and per prefix: passes (promote/keep bound ≤ 0), fails (reject bound > 0)."""
        prefix = self.moments.prefixes(candidate, active)
        ok_mean, ok_half = self._bound(prefix, self.promote_k, self.promote_b)
        bad_mean, bad_half = self._bound(prefix, self.reject_k, self.reject_b)
        return prefix, ok_mean + ok_half <= 0.0, bad_mean - bad_half > 0.0

    def evidence(self, prefix: Mapping[str, np.ndarray], at: int) -> Evidence:
        """The evidence at index ``at`` of ``prefix``."""
        one = {key: values[at:at + 1] for key, values in prefix.items()}
        diff_mean, diff_half = self._bound(one, 1.0, 0.0)
        ok_mean, ok_half = self._bound(one, self.promote_k, self.promote_b)
        bad_mean, bad_half = self._bound(one, self.reject_k, self.reject_b)
        n = float(one["n"][0])
        return Evidence(metric=self.metric, n=int(n), mean_candidate=float(one["c"][0] / n),
                        mean_active=float(one["a"][0] / n), mean_difference=float(diff_mean[0]),
                        lower=float(diff_mean[0] - diff_half[0]), upper=float(diff_mean[0] + diff_half[0]),
                        decision_lower=float(bad_mean[0] - bad_half[0]),
                        decision_upper=float(ok_mean[0] + ok_half[0]), confidence=1.0 - self.alpha,
                        excess_total=float(one["c"][0] - one["a"][0]))


@dataclass(frozen=True)
class MetricSpec:
    """One metric a gate compares: ``statistical`` (sequential non-inferiority) or ``hard`` (a bound on the
    cumulative excess, no statistics)."""

    name: str
    kind: Literal["statistical", "hard"] = "statistical"
    margin: float = 0.0
    absolute_margin: float = 0.0
    reject_margin: float = 0.0
    hard_bound: float = 0.0


@dataclass(frozen=True)
class GateResult:
    decision: GateDecision
    evidence: tuple[Evidence, ...]
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"decision": str(self.decision), "reason": self.reason,
                "evidence": [e.as_dict() for e in self.evidence]}


def _as_arrays(candidate: Mapping[str, Sequence[float] | np.ndarray], active: Mapping[str, Sequence[float] | np.ndarray],
               names: Sequence[str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    cand = {name: np.asarray(candidate[name], dtype=float).ravel() for name in names}
    act = {name: np.asarray(active[name], dtype=float).ravel() for name in names}
    sizes = {v.size for v in (*cand.values(), *act.values())}
    if len(sizes) != 1:
        raise ValueError(f"paired streams must have one length per update, got {sorted(sizes)}")
    return cand, act, sizes.pop()


class PromotionGate:
    """Sequential promotion gate over one tier's metrics (see the module docstring for the rule)."""

    def __init__(self, metrics: Sequence[MetricSpec], test: SequentialTestSettings | None = None) -> None:
        if not metrics:
            raise ValueError("a gate needs at least one metric")
        self.metrics = tuple(metrics)
        self.test = test or SequentialTestSettings()
        statistical = [m for m in self.metrics if m.kind == "statistical"]
        alpha = (1.0 - self.test.confidence) / max(1, len(statistical))  # Bonferroni over the tests
        self.comparisons = {m.name: SequentialComparison(
            m.name, self.test, alpha, promote_k=1.0 + m.margin, promote_b=m.absolute_margin,
            reject_k=1.0 + m.reject_margin, reject_b=0.0) for m in self.metrics}
        self.result = GateResult(GateDecision.HOLD, (), "no samples yet")

    @property
    def decided(self) -> bool:
        return self.result.decision is not GateDecision.HOLD

    def update(self, candidate: Mapping[str, float], active: Mapping[str, float]) -> GateResult:
        """One paired sample per metric."""
        return self.update_many({k: [v] for k, v in candidate.items()}, {k: [v] for k, v in active.items()})

    def update_many(self, candidate: Mapping[str, Sequence[float] | np.ndarray],
                    active: Mapping[str, Sequence[float] | np.ndarray]) -> GateResult:
        """Paired samples per metric (equal lengths); stops at the first decision (which latches)."""
        if self.decided:
            return self.result
        names = [m.name for m in self.metrics]
        cand, act, size = _as_arrays(candidate, active, names)
        if size == 0:
            return self.result
        prefixes, passes, fails, reasons = {}, np.ones(size, bool), np.zeros(size, bool), {}
        for spec in self.metrics:
            prefix, ok, bad = self.comparisons[spec.name].evaluate(cand[spec.name], act[spec.name])
            enough = prefix["n"] >= self.test.min_samples
            if spec.kind == "hard":  # no statistics: the cumulative excess, from the first sample
                ok, bad = enough, prefix["c"] - prefix["a"] > spec.hard_bound
            else:
                ok, bad = ok & enough, bad & enough
            prefixes[spec.name] = prefix
            passes &= ok
            fails |= bad
            reasons[spec.name] = bad
        return self._conclude(prefixes, passes, fails, reasons)

    def _conclude(self, prefixes: Mapping[str, Mapping[str, np.ndarray]], passes: np.ndarray,
                  fails: np.ndarray, reasons: Mapping[str, np.ndarray]) -> GateResult:
        decided = np.flatnonzero(passes | fails)
        at = int(decided[0]) if decided.size else passes.size - 1
        for spec in self.metrics:
            self.comparisons[spec.name].moments.advance(prefixes[spec.name], at)
        evidence = tuple(self.comparisons[s.name].evidence(prefixes[s.name], at) for s in self.metrics)
        if not decided.size:
            self.result = GateResult(GateDecision.HOLD, evidence, "undecided: no bound crossed yet")
        elif fails[at]:
            failed = [name for name, bad in reasons.items() if bad[at]]
            self.result = GateResult(GateDecision.REJECT, evidence, f"candidate worse on {', '.join(failed)}")
        else:
            self.result = GateResult(GateDecision.PROMOTE, evidence, "candidate no worse than the active model "
                                     "by more than the margin on every metric")
        return self.result


#: Each tier's outcome metrics, lower is better; the first is the primary one.
TIER_METRICS: dict[Tier, tuple[tuple[str, Literal["primary", "constraint", "hard"]], ...]] = {
    "placement": (("unschedulable_pods", "primary"), ("gpu_fragmentation", "constraint")),
    "routing": (("carbon_per_replica_hour", "primary"), ("slo_violations", "hard")),
    "autoscaling": (("slo_violation_minutes", "primary"), ("replica_hours", "constraint")),
}


def tier_gate(tier: Tier, settings: GateSettings | None = None) -> PromotionGate:
    """The promotion gate of one tier with its metrics (:data:`TIER_METRICS`) and the settings' margins."""
    s = settings or GateSettings()
    specs = []
    for name, role in TIER_METRICS[tier]:
        if role == "hard":
            specs.append(MetricSpec(name, "hard", hard_bound=s.slo_excess_bound))
        else:
            margin = s.margin if role == "primary" else s.constraint_margin
            specs.append(MetricSpec(name, margin=margin, absolute_margin=s.absolute_margin if role == "primary"
                                    else 0.0, reject_margin=s.reject_margin))
    return PromotionGate(specs, s.test)


@dataclass(frozen=True)
class RollbackResult:
    decision: RollbackDecision
    evidence: Evidence
    reason: str

    def as_dict(self) -> dict[str, object]:
        return {"decision": str(self.decision), "reason": self.reason, "evidence": self.evidence.as_dict()}


class RollbackMonitor:
    """Watches a canary or newly active model against the model it replaced, on one metric.

    Its decision is final: KEEP ends the watch (a later regression of a kept model is drift's to see, and a
    promotion to full rollout starts a new monitor), ROLLBACK is acted on at once.
    """

    def __init__(self, metric: str, settings: RollbackSettings | None = None) -> None:
        self.settings = settings or RollbackSettings()
        s = self.settings
        k = 1.0 + s.bound
        self.comparison = SequentialComparison(metric, s.test, 1.0 - s.test.confidence, promote_k=k,
                                               promote_b=s.absolute_bound, reject_k=k, reject_b=s.absolute_bound)
        self.result: RollbackResult | None = None

    @property
    def decided(self) -> bool:
        return self.result is not None and self.result.decision is not RollbackDecision.WATCH

    def update(self, new: float, replaced: float) -> RollbackResult:
        return self.update_many([new], [replaced])

    def update_many(self, new: Sequence[float] | np.ndarray, replaced: Sequence[float] | np.ndarray) -> RollbackResult:
        """Paired outcomes of the new model and the replaced one; stops at the first decision."""
        if self.decided:
            assert self.result is not None
            return self.result
        s = self.settings
        new_a, old_a = np.asarray(new, float).ravel(), np.asarray(replaced, float).ravel()
        if new_a.size != old_a.size:
            raise ValueError("paired streams must have equal lengths")
        room = s.max_decisions - self.comparison.moments.n
        new_a, old_a = new_a[:room], old_a[:room]
        if new_a.size == 0:
            return self.result or self._watch_empty()
        prefix, keep, back = self.comparison.evaluate(new_a, old_a)
        enough = prefix["n"] >= s.test.min_samples
        keep, back = keep & enough, back & enough
        back |= (prefix["n"] >= s.max_decisions) & ~keep  # the conservative rule at the deadline
        decided = np.flatnonzero(keep | back)
        at = int(decided[0]) if decided.size else new_a.size - 1
        self.comparison.moments.advance(prefix, at)
        evidence = self.comparison.evidence(prefix, at)
        if not decided.size:
            self.result = RollbackResult(RollbackDecision.WATCH, evidence, "undecided")
        elif keep[at]:
            self.result = RollbackResult(RollbackDecision.KEEP, evidence, f"shown within {s.bound:.0%} of the "
                                         "replaced model")
        elif evidence.decision_lower > 0:
            self.result = RollbackResult(RollbackDecision.ROLLBACK, evidence, f"regressed past {s.bound:.0%}, "
                                         "shown with confidence")
        else:
            self.result = RollbackResult(RollbackDecision.ROLLBACK, evidence, f"undecided after "
                                         f"{s.max_decisions} decisions: rolled back (conservative rule)")
        return self.result

    def _watch_empty(self) -> RollbackResult:
        nan = float("nan")
        return RollbackResult(RollbackDecision.WATCH, Evidence(self.comparison.metric, 0, nan, nan, nan, nan, nan,
                                                               nan, nan, 1.0 - self.comparison.alpha, 0.0),
                              "no samples yet")


class RollbackPanel:
    """Rollback monitors on several metrics of one model, so a model that keeps the primary metric but spends
    more (an autoscaler with fewer violations at +60 % replica-hours) is undone too: **ROLLBACK** as soon as
    any metric's monitor rolls back (regressed past the bound, or the conservative rule), **KEEP** once every
    metric's monitor keeps, **WATCH** otherwise. Each monitor latches on its own; the panel's decision is final
    too. Its result carries the deciding metric's evidence (the primary's while watching or keeping)."""

    def __init__(self, metrics: Sequence[str], settings: RollbackSettings | None = None) -> None:
        if not metrics:
            raise ValueError("a rollback panel needs at least one metric")
        self.settings = settings or RollbackSettings()
        self.metrics = tuple(metrics)
        self.monitors = {m: RollbackMonitor(m, self.settings) for m in self.metrics}
        self.result: RollbackResult | None = None

    @property
    def primary(self) -> str:
        return self.metrics[0]

    @property
    def decided(self) -> bool:
        return self.result is not None and self.result.decision is not RollbackDecision.WATCH

    def update_many(self, new: Mapping[str, Sequence[float] | np.ndarray],
                    replaced: Mapping[str, Sequence[float] | np.ndarray]) -> RollbackResult:
        """Paired outcomes per metric (every panel metric present in both)."""
        if self.decided:
            assert self.result is not None
            return self.result
        missing = [m for m in self.metrics if m not in new or m not in replaced]
        if missing:
            raise ValueError(f"outcomes lack the rollback metrics {missing}")
        verdicts = {m: monitor.update_many(new[m], replaced[m]) for m, monitor in self.monitors.items()}
        back = [m for m, v in verdicts.items() if v.decision is RollbackDecision.ROLLBACK]
        if back:
            v = verdicts[back[0]]
            self.result = RollbackResult(RollbackDecision.ROLLBACK, v.evidence, f"{back[0]}: {v.reason}")
        elif all(v.decision is RollbackDecision.KEEP for v in verdicts.values()):
            v = verdicts[self.primary]
            self.result = RollbackResult(RollbackDecision.KEEP, v.evidence,
                                         f"{', '.join(self.metrics)}: {v.reason}")
        else:
            watching = [m for m, v in verdicts.items() if v.decision is RollbackDecision.WATCH]
            self.result = RollbackResult(RollbackDecision.WATCH, verdicts[self.primary].evidence,
                                         f"undecided on {', '.join(watching)}")
        return self.result


def tier_rollback(tier: Tier, settings: RollbackSettings | None = None) -> RollbackPanel:
    """The rollback panel of one tier: every metric of its gate (:data:`TIER_METRICS`), the primary first."""
    return RollbackPanel([name for name, _ in TIER_METRICS[tier]], settings)

