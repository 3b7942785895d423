"""The report's picture: power per region over time, the grid's carbon intensity beneath, and totals.

Series come from the same accounting table as the numbers (mean power = IT energy / bucket length;
intensity = carbon / facility energy), so the picture can never disagree with the table.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: reports are written on servers and in CI

import matplotlib.dates as mdates
import matplotlib.pyplot as plt
import numpy as np

from global_scheduler.accounting.report import (
    AccountingSource,
    EnergyReport,
    from_unix_s,
    to_unix_s,
)
from global_scheduler.accounting.work import work_differences
from meridian.energy import JOULES_PER_KWH


def _plot_bucket_s(source: AccountingSource, since_s: float, until_s: float) -> float:
    # About 200 points across the range, at a whole multiple of the source's resolution.
    res = max(source.resolution_s, 1.0)
    return res * max(1, int((until_s - since_s) / 200 / res))


def plot_report(source: AccountingSource, report: EnergyReport, path: str | Path) -> Path:
    """Write a PNG for ``report`` (which ``source`` produced); returns the path."""
    since_s, until_s = to_unix_s(report.since), to_unix_s(report.until)
    table = source.table(policy=report.policy, since_s=since_s, until_s=until_s).clip_to(since_s, until_s)
    table = table.select(np.isin(table.region, sorted(report.regions)))
    bucket_s = _plot_bucket_s(source, since_s, until_s)
    starts, keys, sums = table.bucket_sums("region", origin_s=since_s, bucket_s=bucket_s)
    grid_ci = _grid_intensity(source, report.policy, starts, [str(k) for k in keys], bucket_s)
    return _draw(report, starts, [str(k) for k in keys], sums["it_energy_joules"], sums["facility_energy_joules"],
                 sums["carbon_grams"], bucket_s, Path(path), grid_ci)


def _grid_intensity(source: AccountingSource, policy: str, starts: np.ndarray, keys: list[str],
                    bucket_s: float) -> np.ndarray | None:
    """The recorded grid intensity per region and plot bucket, when the source kept it (a saved run).

    Better than carbon / energy: it shows a region's grid even in hours when nothing ran there.
    """
    series = getattr(source, "series", {}).get(policy)
    if series is None or not len(starts) or not len(series["start_s"]):
        return None
    b = np.floor((series["start_s"] - starts[0]) / bucket_s).astype(np.int64)
    k = np.searchsorted(keys, series["region"])
    ok = (b >= 0) & (b < len(starts)) & (k < len(keys))
    ok[ok] &= np.asarray(keys)[k[ok]] == series["region"][ok]
    flat = b[ok] * len(keys) + k[ok]
    n = len(starts) * len(keys)
    total = np.bincount(flat, series["carbon_intensity_g_per_kwh"][ok], minlength=n)
    count = np.bincount(flat, minlength=n)
    return np.divide(total, count, out=np.full(n, np.nan), where=count > 0).reshape(len(starts), len(keys))


def plot_from_buckets(series: EnergyReport, report: EnergyReport, path: str | Path) -> Path:
    """The same picture from a report bucketed by region (what a live ``--target`` returns)."""
    if series.group_by != "region" or not series.bucket_seconds:
        raise ValueError("the series report must be grouped by region and bucketed")
    bucket_s = float(series.bucket_seconds)
    since_s = to_unix_s(series.since)
    keys = sorted({b.key for b in series.buckets})
    n_b = int(np.ceil((to_unix_s(series.until) - since_s) / bucket_s))
    it_j, fac_j, co2_g = (np.zeros((n_b, len(keys))) for _ in range(3))
    for b in series.buckets:
        i = int((to_unix_s(b.start) - since_s) // bucket_s)
        k = keys.index(b.key)
        it_j[i, k] = b.totals.energy_kwh * JOULES_PER_KWH
        fac_j[i, k] = b.totals.facility_energy_kwh * JOULES_PER_KWH
        co2_g[i, k] = b.totals.carbon_kg * 1000.0
    starts = since_s + np.arange(n_b) * bucket_s
    return _draw(report, starts, keys, it_j, fac_j, co2_g, bucket_s, Path(path))


def counterfactual_caption(report: EnergyReport) -> str:
    """The plot's short claim: ``2,153 kg (61.6%) less than karmada``, then whether it was the same work."""
    cf = report.counterfactual
    assert cf is not None
    verb = "less" if cf.carbon_saved_kg >= 0 else "more"
    head = f"{abs(cf.carbon_saved_kg):,.0f} kg ({abs(cf.carbon_saved_ratio):.1%}) {verb}\nthan {cf.policy}"
    if cf.same_work is None:
        return f"{head}\n(work done not recorded)"
    if cf.same_work:
        return f"{head}\nfor the same work"
    assert cf.work is not None and cf.counterfactual_work is not None
    return f"{head}, not the same work:\n" + "\n".join(work_differences(cf.work, cf.counterfactual_work))


def _draw(report: EnergyReport, starts: np.ndarray, keys: list[str], it_j: np.ndarray, fac_j: np.ndarray,
          co2_g: np.ndarray, bucket_s: float, path: Path, grid_ci: np.ndarray | None = None) -> Path:
    regions = sorted(report.regions)
    times = [from_unix_s(s) for s in starts]
    power_kw = it_j / bucket_s / 1000.0
    fac_kwh = fac_j / JOULES_PER_KWH
    intensity = np.divide(co2_g, fac_kwh, out=np.full_like(fac_kwh, np.nan), where=fac_kwh > 0)
    if grid_ci is not None:
        intensity = grid_ci

    fig = plt.figure(figsize=(12, 6.5), dpi=110)
    grid = fig.add_gridspec(2, 2, width_ratios=(3.2, 1), hspace=0.08, wspace=0.28)
    ax_power = fig.add_subplot(grid[0, 0])
    ax_ci = fig.add_subplot(grid[1, 0], sharex=ax_power)
    ax_tot = fig.add_subplot(grid[:, 1])
    colours = {k: plt.get_cmap("tab10")(i % 10) for i, k in enumerate(regions)}
    for i, key in enumerate(keys):
        colour = colours.get(key, "0.5")
        ax_power.plot(times, power_kw[:, i], color=colour, lw=1.3, label=key)
        ax_ci.plot(times, intensity[:, i], color=colour, lw=1.3)
    ax_power.set_ylabel("IT power (kW)")
    ax_power.set_title(f"Energy report: {report.policy} — {report.since:%Y-%m-%d %H:%M} to "
                       f"{report.until:%Y-%m-%d %H:%M} UTC", loc="left", fontsize=11)
    ax_power.legend(loc="upper left", fontsize=8, ncol=len(keys) or 1)
    ax_power.grid(alpha=0.3)
    plt.setp(ax_power.get_xticklabels(), visible=False)
    ax_ci.set_ylabel("grid intensity (gCO₂/kWh)")
    ax_ci.grid(alpha=0.3)
    ax_ci.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M"))
    plt.setp(ax_ci.get_xticklabels(), rotation=30, ha="right", fontsize=8)

    names = list(regions)
    carbon = [report.regions[r].carbon_kg for r in names]
    bars_colours = [colours[r] for r in names]
    if report.counterfactual is not None:
        names.append(f"total\n({report.policy})")
        carbon.append(report.totals.carbon_kg)
        bars_colours.append("0.35")
        names.append(f"total\n({report.counterfactual.policy})")
        carbon.append(report.counterfactual.totals.carbon_kg)
        bars_colours.append("0.75")
    else:
        names.append("total")
        carbon.append(report.totals.carbon_kg)
        bars_colours.append("0.35")
    y = np.arange(len(names))
    ax_tot.barh(y, carbon, color=bars_colours)
    ax_tot.set_yticks(y, names, fontsize=8)
    ax_tot.invert_yaxis()
    ax_tot.set_xlabel("carbon (kg CO₂e)")
    ax_tot.set_title("carbon totals", loc="left", fontsize=11)
    # Each label starts with the bar's own value and unit (kg CO₂e); energy and cost follow.
    totals = [report.regions[r] for r in regions] + [report.totals] + (
        [report.counterfactual.totals] if report.counterfactual is not None else [])
    for yi, t in zip(y, totals, strict=True):
        ax_tot.annotate(f"{t.carbon_kg:,.0f} kg CO₂e\n{t.energy_kwh:,.0f} kWh, {t.cost:,.0f} {report.currency}",
                        (t.carbon_kg, yi), xytext=(3, 0), textcoords="offset points", va="center", fontsize=7)
    if report.counterfactual is not None:
        ax_tot.text(0.0, -0.13, counterfactual_caption(report), transform=ax_tot.transAxes, fontsize=8,
                    va="top")  # under the axis, clear of the bars
    ax_tot.margins(x=0.35)
    fig.savefig(path, bbox_inches="tight")
    plt.close(fig)
    return path
