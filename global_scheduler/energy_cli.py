"""``meridian report energy``: energy, carbon and cost per region from a saved run or a live system.

Offline, ``--run DIR`` reads what ``--save-run DIR`` wrote (:mod:`global_scheduler.accounting.run_store`);
live, ``--target HOST:PORT`` asks the global scheduler's ``GetEnergyReport``. Both give the same report
model, rendered as a table, JSON or CSV, and optionally a PNG (power per region over time, grid
intensity beneath, totals beside).

Registering the command runs on every ``meridian`` start, so the report (numpy), the run store, gRPC
and the plot (matplotlib) are imported when the command runs.
"""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from meridian.cli import CliRoot

if TYPE_CHECKING:
    from global_scheduler.accounting.report import EnergyReport, ReportQuery

FORMATS = ("table", "json", "csv")
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)\s*([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}
PLOT_POINTS = 200


def parse_duration_s(text: str, *, option: str) -> int:
    """``900``, ``900s``, ``15m``, ``1h``, ``1d`` → seconds."""
    m = _DURATION.match(text.strip().lower())
    if not m:
        raise typer.BadParameter(f"{text!r} is not a duration such as 900, 15m, 1h or 1d", param_hint=option)
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if seconds <= 0 or seconds != int(seconds):
        raise typer.BadParameter(f"{text!r} must be a positive whole number of seconds", param_hint=option)
    return int(seconds)


def parse_time(text: str | None, *, option: str, now: datetime | None = None) -> datetime | None:
    """ISO 8601 (a date or a date-time; without a zone it is UTC) or ``-6h`` / ``-2d`` before now."""
    if text is None:
        return None
    text = text.strip()
    if text.startswith("-"):
        return (now or datetime.now(UTC)) - timedelta(seconds=parse_duration_s(text[1:], option=option))
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither an ISO 8601 time (2022-12-01T06:00) nor a relative one "
                                 "(-6h)", param_hint=option) from None
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def render_table(report: EnergyReport, console: Console) -> None:
    title = (f"Energy report — {report.policy} — {report.since:%Y-%m-%d %H:%M} to {report.until:%Y-%m-%d %H:%M} UTC"
             f" — by {report.group_by}")
    table = Table(title=title, title_justify="left")
    for name in (report.group_by, "energy kWh", "facility kWh", "carbon kg", f"cost {report.currency}",
                 "gCO₂/kWh", "mean kW", "unknown s"):
        table.add_column(name, justify="left" if name == report.group_by else "right")

    def cells(t: object) -> list[str]:
        ci = t.carbon_intensity_g_per_kwh  # type: ignore[attr-defined]
        return [f"{t.energy_kwh:,.2f}", f"{t.facility_energy_kwh:,.2f}", f"{t.carbon_kg:,.2f}",  # type: ignore[attr-defined]
                f"{t.cost:,.2f}", "–" if ci is None else f"{ci:,.1f}",  # type: ignore[attr-defined]
                f"{t.mean_power_watts / 1000:,.2f}", f"{t.unknown_seconds:,.0f}"]  # type: ignore[attr-defined]

    from global_scheduler.accounting.report import counterfactual_label, counterfactual_sentence

    for key, totals in report.groups.items():  # tenants and workloads by energy, largest first
        table.add_row(key, *cells(totals))
    table.add_section()
    table.add_row("total", *cells(report.totals), style="bold")
    if report.counterfactual is not None:
        table.add_row(counterfactual_label(report), *cells(report.counterfactual.totals), style="dim")
    console.print(table)
    if report.counterfactual is not None:
        console.print(counterfactual_sentence(report))
    for note in report.notes:
        console.print(f"note: {note}", style="yellow")


def energy_report(
    run: Path | None = typer.Option(None, "--run", help="A run directory written with --save-run."),
    target: str | None = typer.Option(None, "--target", help="A live global scheduler, HOST:PORT."),
    token: str | None = typer.Option(None, "--token", envvar="MERIDIAN_TOKEN",
                                     help="Bearer token for --target."),
    region: list[str] = typer.Option([], "--region", help="Only this region (repeatable)."),
    cluster: list[str] = typer.Option([], "--cluster", help="Only this cluster (repeatable)."),
    since: str | None = typer.Option(None, "--since", help="ISO 8601 (UTC if no zone) or -6h, -2d."),
    until: str | None = typer.Option(None, "--until", help="ISO 8601 (UTC if no zone) or -1h."),
    by: str = typer.Option("region", "--by", help="Group by region, cluster, tenant or workload."),
    bucket: str | None = typer.Option(None, "--bucket", help="Time buckets: 900, 15m, 1h, 1d."),
    policy: str | None = typer.Option(None, "--policy", help="Which policy of a multi-policy run (default: "
                                      "the run's primary)."),
    counterfactual: str | None = typer.Option(None, "--counterfactual", help="Policy to compare with "
                                              "(default: karmada when the run has it)."),
    output_format: str = typer.Option("table", "--format", help="table, json or csv."),
    plot: Path | None = typer.Option(None, "--plot", help="Also write a PNG here."),
) -> None:
    """Energy, carbon and cost per region (or cluster, tenant, workload) over a time range."""
    import grpc

    from global_scheduler.accounting.report import ReportArgumentError, ReportQuery

    _check_report_options(run=run, target=target, by=by, output_format=output_format, plot=plot)
    now = datetime.now(UTC)
    query = ReportQuery(regions=region, clusters=cluster, since=parse_time(since, option="--since", now=now),
                        until=parse_time(until, option="--until", now=now), group_by=by,  # type: ignore[arg-type]
                        bucket_seconds=parse_duration_s(bucket, option="--bucket") if bucket else None,
                        policy=policy, counterfactual=counterfactual)
    try:
        if run is not None:
            report = _report_from_run(run, query, plot)
        else:
            assert target is not None
            report = _report_from_target(target, query, token=token, plot=plot)
    except ReportArgumentError as exc:
        raise typer.BadParameter(str(exc).split(": ", 1)[1], param_hint=exc.argument) from None
    except grpc.RpcError as exc:
        code = exc.code()  # type: ignore[attr-defined]
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            raise typer.BadParameter(exc.details(), param_hint="--target") from None  # type: ignore[attr-defined]
        typer.echo(f"error: {target}: {code.name}: {exc.details()}", err=True)  # type: ignore[attr-defined]
        raise typer.Exit(1) from None
    _write_report(report, output_format=output_format, plot=plot)


def _check_report_options(*, run: Path | None, target: str | None, by: str, output_format: str,
                          plot: Path | None) -> None:
    from global_scheduler.accounting.report import GROUP_BY_VALUES

    if (run is None) == (target is None):
        raise typer.BadParameter("give exactly one of --run DIR or --target HOST:PORT", param_hint="--run")
    if by not in GROUP_BY_VALUES:
        raise typer.BadParameter(f"{by!r} is not one of {', '.join(GROUP_BY_VALUES)}", param_hint="--by")
    if output_format not in FORMATS:
        raise typer.BadParameter(f"{output_format!r} is not one of {', '.join(FORMATS)}", param_hint="--format")
    if plot is not None and plot.suffix.lower() != ".png":
        raise typer.BadParameter("the plot is written as PNG; give a .png path", param_hint="--plot")


def _report_from_run(run: Path, query: ReportQuery, plot: Path | None) -> EnergyReport:
    """The report of a saved run (and its plot, when asked)."""
    from global_scheduler.accounting.report import build_report
    from global_scheduler.accounting.run_store import RunFormatError, load_run

    try:
        source = load_run(run)
    except RunFormatError as exc:
        raise typer.BadParameter(str(exc), param_hint="--run") from None
    report = build_report(source, query)
    if plot is not None:
        from global_scheduler.accounting.plot import plot_report

        plot_report(source, report, plot)
    return report


def _report_from_target(target: str, query: ReportQuery, *, token: str | None, plot: Path | None) -> EnergyReport:
    """A live global scheduler's report; the plot, when asked, from a second report bucketed by region at
    about ``PLOT_POINTS`` points."""
    from global_scheduler.accounting.service import fetch_report

    report = fetch_report(target, query, token=token)
    if plot is not None:
        from global_scheduler.accounting.plot import plot_from_buckets

        span_s = (report.until - report.since).total_seconds()
        res_s = max(report.resolution_seconds, 1.0)
        series = fetch_report(target, query.model_copy(update={
            "group_by": "region", "counterfactual": None, "policy": None,
            "bucket_seconds": int(res_s * max(1, int(span_s / PLOT_POINTS / res_s)))}), token=token)
        plot_from_buckets(series, report, plot)
    return report


def _write_report(report: EnergyReport, *, output_format: str, plot: Path | None) -> None:
    from global_scheduler.accounting.report import render_csv

    if output_format == "json":
        typer.echo(json.dumps(report.model_dump(mode="json"), indent=2))
    elif output_format == "csv":
        typer.echo(render_csv(report), nl=False)
    else:
        render_table(report, Console(width=int(os.environ.get("COLUMNS", "140"))))
    if plot is not None and output_format == "table":
        typer.echo(f"plot written to {plot}")


def register(cli: CliRoot) -> None:
    """Add ``meridian report energy``."""
    cli.report.command("energy")(energy_report)
