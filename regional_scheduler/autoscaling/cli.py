"""CLI commands contributed to ``meridian`` through the ``meridian.cli`` entry point.

* ``meridian bench autoscale``: every policy on held-back days of every series (table + ``--json``).
* ``meridian train autoscale``: train the DQN on training days and write the checkpoint.
* ``meridian autoscaler``: the serving loop (:mod:`.serving`; Prometheus or a replayed series as the
  metrics source), driving a Deployment's scale subresource and/or serving KEDA's external-scaler gRPC
  API, with shadow mode.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meridian.cli import CliRoot

if TYPE_CHECKING:
    from regional_scheduler.autoscaling.online import OnlineAutoscaler
    from regional_scheduler.autoscaling.serving import MetricsSource
    from regional_scheduler.autoscaling.settings import AutoscalerSettings

log = logging.getLogger(__name__)


def _series_arg(series: list[Path] | None) -> list[Path]:
    from meridian.traces import TracesNotFoundError, default_traces_dir
    from regional_scheduler.autoscaling.request_series import shared_series_paths

    if series:
        return series
    try:
        traces = default_traces_dir()
    except TracesNotFoundError as exc:
        raise typer.BadParameter(f"no --series given and {exc}", param_hint="--series") from None
    found = shared_series_paths(traces)
    if not found:
        raise typer.BadParameter(f"no --series given and no shared series under {traces / 'requests'}")
    return found


def bench_autoscale(
    series: list[Path] | None = typer.Option(None, "--series", help="Request-rate CSV (repeatable); default: "
                                             "every shared series."),
    policies: str = typer.Option("hpa,quantile,quantile-budget,learned", "--policies",
                                 help="Comma-separated policy names."),
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="DQN checkpoint (default: committed)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON to this file."),
    validation: bool = typer.Option(False, "--validation", help="Evaluate on the last training week instead, "
                                    "with fitting and calibration ending before it (for choosing designs)."),
) -> None:
    """Compare autoscaling policies on held-back days (never used for training or calibration)."""
    from regional_scheduler.autoscaling.benchmark import run_benchmark
    from regional_scheduler.autoscaling.policies.registry import REGISTRY

    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [n for n in names if n not in REGISTRY]
    if unknown:
        raise typer.BadParameter(f"unknown policies {unknown}; known: {sorted(REGISTRY)}")
    paths = _series_arg(series)
    console = Console(width=170) if not Console().is_terminal else Console()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("autoscale", total=len(paths) * len(names))

        def advance(label: str) -> None:
            progress.update(task, advance=1, description=label)

        report = run_benchmark(paths, names, checkpoint=checkpoint, advance=advance, validation=validation)
    table = Table(title="Autoscaling on " + ("the last training week (validation)" if validation else "held-back days"))
    for column in ("series", "policy", "SLO-violation min", "p99 ms", "replica-h", "scale events",
                   "viol. reduction", "replica-h ratio", "target"):
        table.add_column(column, justify="right" if column not in ("series", "policy") else "left")
    for name, entry in report["series"].items():
        for policy, result in entry["policies"].items():
            vs = entry.get("vs_hpa", {}).get(policy)
            table.add_row(name, policy, str(result["slo_violation_minutes"]), f"{result['p99_latency_ms']:.0f}",
                          f"{result['replica_hours']:.1f}", str(result["scale_events"]),
                          f"{vs['violation_reduction']:.0%}" if vs else "", f"{vs['replica_hours_ratio']:.2f}" if vs else "",
                          ("met" if vs["meets_target"] else "missed") if vs else "")
    console.print(table)
    if json_out is not None:
        json_out.write_text(json.dumps(report, indent=2))
        console.print(f"wrote {json_out}")


def train_autoscale(
    series: list[Path] | None = typer.Option(None, "--series", help="Training series (repeatable); default: "
                                             "every shared series (training days only)."),
    steps: int = typer.Option(60_000, "--steps", help="Environment steps (one per simulated minute)."),
    seed: int = typer.Option(0, "--seed"),
    violation_penalty: float = typer.Option(2.0, "--violation-penalty",
                                            help="Reward cost of one SLO-violation minute, in reference-replica minutes / 20."),
    out: Path | None = typer.Option(None, "--out", help="Checkpoint path (default: the committed one)."),
) -> None:
    """Train the DQN autoscaler on training days and write a checkpoint."""
    from regional_scheduler.autoscaling.dqn.checkpoint import DEFAULT_CHECKPOINT
    from regional_scheduler.autoscaling.training import train_autoscaler

    paths = _series_arg(series)
    target = out or DEFAULT_CHECKPOINT
    with Progress(TextColumn("train autoscale"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("{task.fields[stats]}")) as progress:
        task = progress.add_task("train", total=steps, stats="")

        def on_step(step: int, stats: dict[str, float]) -> None:
            if step % 500 == 0 or step == steps:
                progress.update(task, completed=step, stats=" ".join(f"{k}={v:.3g}" for k, v in stats.items()))

        _, metadata = train_autoscaler(paths, total_steps=steps, seed=seed, out=target,
                                       violation_penalty=violation_penalty, progress=on_step)
    typer.echo(f"wrote {target} (trained on {[s['name'] for s in metadata['series']]})")


def prepare_serving(
    *, prometheus: str | None = None, rate_query: str | None = None, p99_query: str | None = None,
    error_query: str | None = None, cpu_usage_query: str | None = None, cpu_request_query: str | None = None,
    ready_query: str | None = None, replay: Path | None = None, policy: str | None = None,
    shadow: str | None = None, capacity_rpm: float | None = None,
) -> tuple[AutoscalerSettings, OnlineAutoscaler, MetricsSource]:
    """Validate ``meridian autoscaler``'s metrics and policy options and build what the loop runs, connecting
    to nothing (no Prometheus query, no API server, no port; only ``--replay``'s file is read).

    Every reason the autoscaler refuses to start is raised here, as :class:`typer.BadParameter` (a usage
    error, exit status 2): no or two metrics sources, a lone CPU query, an unknown policy, and a live or
    shadow policy that scales on CPU utilisation (``hpa``) without ``--cpu-usage-query`` and
    ``--cpu-request-query`` (:func:`.serving.check_metrics`). Policies left unset come from the environment
    (``MERIDIAN_AUTOSCALER_POLICY`` / ``_SHADOW_POLICY``), as in the CLI. The command calls it first; a test
    can call it on a manifest's arguments (tests/deploy/test_autoscaler_args.py).
    """
    from regional_scheduler.autoscaling.online import OnlineAutoscaler
    from regional_scheduler.autoscaling.policies.registry import get_policy
    from regional_scheduler.autoscaling.prometheus_source import PrometheusQueries, PrometheusSource
    from regional_scheduler.autoscaling.request_series import load_request_series
    from regional_scheduler.autoscaling.serving import (
        MissingMetricError,
        PrometheusMetrics,
        ReplayMetrics,
        check_metrics,
    )
    from regional_scheduler.autoscaling.settings import AutoscalerSettings
    from regional_scheduler.autoscaling.shadow import ShadowRunner

    if (prometheus is None) == (replay is None):
        raise typer.BadParameter("give exactly one metrics source: --prometheus URL --rate-query Q, or --replay FILE")
    if prometheus is not None and not rate_query:
        raise typer.BadParameter("--prometheus needs --rate-query")
    if prometheus is None and (cpu_usage_query or cpu_request_query or ready_query):
        raise typer.BadParameter("the CPU queries need --prometheus (a replayed series has no CPU metrics)")
    if bool(cpu_usage_query) != bool(cpu_request_query):
        raise typer.BadParameter("--cpu-usage-query and --cpu-request-query go together (utilisation = usage / request)")
    settings = AutoscalerSettings()
    policy = policy or settings.policy
    shadow = shadow or settings.shadow_policy
    try:
        live = get_policy(policy)
        runner = ShadowRunner(live, get_policy(shadow)) if shadow else live
    except KeyError as exc:
        raise typer.BadParameter(str(exc.args[0])) from None
    # A replayed series has no CPU metrics: its utilisation is modelled from the rate (a demo).
    online = OnlineAutoscaler(runner, settings, capacity_per_replica_rpm=capacity_rpm,
                              model_utilisation=replay is not None)
    source: MetricsSource
    if prometheus is not None:
        source = PrometheusMetrics(PrometheusSource(prometheus, PrometheusQueries(
            rate_query or "", p99_query, error_query, cpu_usage_cores=cpu_usage_query,
            cpu_request_cores=cpu_request_query, ready_pods=ready_query)))
    else:
        assert replay is not None
        source = ReplayMetrics(load_request_series(replay).requests_per_minute)
    try:
        check_metrics(online, source)  # before connecting to anything
    except MissingMetricError as exc:
        raise typer.BadParameter(str(exc), param_hint="--policy/--shadow") from None
    return settings, online, source


def autoscaler(
    deployment: str = typer.Option(..., "--deployment", help="Deployment whose scale subresource is driven."),
    namespace: str = typer.Option("default", "--namespace"),
    prometheus: str | None = typer.Option(None, "--prometheus", help="Prometheus base URL (metrics source)."),
    rate_query: str | None = typer.Option(None, "--rate-query", help="PromQL: requests per second (one sample)."),
    p99_query: str | None = typer.Option(None, "--p99-query", help="PromQL: p99 latency in seconds (optional)."),
    error_query: str | None = typer.Option(None, "--error-query", help="PromQL: error ratio (optional)."),
    cpu_usage_query: str | None = typer.Option(None, "--cpu-usage-query", help="PromQL: CPU in use per pod, in "
                                               "cores (one sample per pod, label `pod`). With --cpu-request-query "
                                               "it gives the CPU utilisation the hpa policy needs."),
    cpu_request_query: str | None = typer.Option(None, "--cpu-request-query", help="PromQL: CPU request per pod, "
                                                 "in cores (label `pod`); its pods are the target's pods."),
    ready_query: str | None = typer.Option(None, "--ready-query", help="PromQL: readiness per pod (label `pod`, "
                                           "> 0 = ready); default: every pod reporting usage is ready."),
    replay: Path | None = typer.Option(None, "--replay", help="Instead of Prometheus, replay a request-rate CSV "
                                       "(one row per --interval): a demo and a dry run of the loop."),
    interval_s: float = typer.Option(60.0, "--interval", help="Seconds between decisions (one sample each)."),
    drive_scale: bool = typer.Option(False, "--drive-scale/--no-drive-scale",
                                     help="Write spec.replicas of the Deployment's scale subresource."),
    dry_run: bool = typer.Option(True, "--dry-run/--no-dry-run", help="Server-side dry run of scale writes."),
    keda: bool = typer.Option(True, "--keda/--no-keda", help="Serve KEDA's external scaler gRPC API."),
    policy: str | None = typer.Option(None, "--policy", help="Live policy; default MERIDIAN_AUTOSCALER_POLICY, "
                                      "else quantile-budget (the benchmark's best: quantile forecasts under an "
                                      "online budget of the HPA's replica-hours)."),
    shadow: str | None = typer.Option(None, "--shadow", help="Also run this policy in shadow mode (logged); "
                                      "default MERIDIAN_AUTOSCALER_SHADOW_POLICY."),
    capacity_rpm: float | None = typer.Option(None, "--capacity-rpm", help="Requests per minute one replica "
                                              "serves at 100% (from a load test); default: derived from history."),
    minutes: int | None = typer.Option(None, "--minutes", help="Stop after this many decisions."),
) -> None:
    """Run the autoscaling loop: decisions to the scale subresource and/or to KEDA."""
    from regional_scheduler.autoscaling.k8s_driver import ScaleSubresourceDriver
    from regional_scheduler.autoscaling.keda_scaler import PredictiveExternalScaler, serve
    from regional_scheduler.autoscaling.serving import ServingLoop

    settings, online, source = prepare_serving(
        prometheus=prometheus, rate_query=rate_query, p99_query=p99_query, error_query=error_query,
        cpu_usage_query=cpu_usage_query, cpu_request_query=cpu_request_query, ready_query=ready_query,
        replay=replay, policy=policy, shadow=shadow, capacity_rpm=capacity_rpm)
    driver = ScaleSubresourceDriver.from_cluster(name=deployment, namespace=namespace, dry_run=dry_run) \
        if drive_scale else None
    stop = threading.Event()
    server = None
    if keda:
        server, _ = serve(PredictiveExternalScaler(lambda _ref: online.current_desired(), settings.keda, stop),
                          settings.keda.address)
    loop = ServingLoop(online, source, driver=driver, interval_s=interval_s, wait=stop.wait)
    try:
        loop.run(minutes)
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        if server is not None:
            server.stop(grace=1.0)


def register(cli: CliRoot) -> None:
    """Add this component's commands to the ``meridian`` CLI."""
    cli.bench.command("autoscale")(bench_autoscale)
    cli.train.command("autoscale")(train_autoscale)
    cli.app.command("autoscaler")(autoscaler)
