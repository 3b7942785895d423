"""``meridian regional-scheduler``: the regional tier on a real cluster (secondary scheduler, extender)."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from meridian.observability import MetricsServer
    from regional_scheduler.extender import ExtenderServer
    from regional_scheduler.kube_scheduler import KubernetesScheduler, KubeSchedulerSettings
    from regional_scheduler.policies.base import ScorePolicy
    from regional_scheduler.service import RegionalScheduler
    from regional_scheduler.summary_publisher import RegionalTelemetry


def regional_scheduler_command(
    kubeconfig: Path | None = typer.Option(None, "--kubeconfig", help="kubeconfig file (default: in-cluster config "
                                           "inside a pod, else ~/.kube/config)"),
    cluster: str | None = typer.Option(None, help="this cluster's name [env MERIDIAN_REGIONAL_CLUSTER]"),
    policy: str | None = typer.Option(None, help="placement policy, e.g. fgd, learned, best-fit "
                                      "[env MERIDIAN_REGIONAL_POLICY, default fgd]"),
    scheduler_name: str | None = typer.Option(None, help="schedule pods with this spec.schedulerName "
                                              "[default meridian]"),
    kube_api_qps: float | None = typer.Option(None, "--kube-api-qps", help="client QPS limit (kube-scheduler's "
                                              "default 50; <= 0 disables)"),
    kube_api_burst: int | None = typer.Option(None, "--kube-api-burst", help="client burst (default 100)"),
    bind_workers: int | None = typer.Option(None, help="bindings in flight at once (default 16)"),
    leader_elect: bool | None = typer.Option(None, "--leader-elect/--no-leader-elect", help="schedule only while "
                                             "holding the Lease (default on)"),
    lease_namespace: str | None = typer.Option(None, help="namespace of the leader Lease"),
    lease_name: str | None = typer.Option(None, help="name of the leader Lease (default meridian-regional-scheduler)"),
    lease_duration_s: float | None = typer.Option(None, "--lease-duration", help="seconds before a standby takes "
                                                  "over (default 15)"),
    renew_deadline_s: float | None = typer.Option(None, "--renew-deadline", help="seconds a leader may fail to renew"),
    retry_period_s: float | None = typer.Option(None, "--retry-period", help="seconds between Lease attempts"),
    identity: str | None = typer.Option(None, help="this replica's identity in the Lease (default: host name)"),
    extender: str | None = typer.Option(None, "--extender", help="also serve kube-scheduler's extender protocol on "
                                        "HOST:PORT (path prefix /meridian)"),
    schedule: bool = typer.Option(True, "--schedule/--no-schedule", help="--no-schedule: only the extender"),
    metrics_port: int | None = typer.Option(None, "--metrics-port", help="Prometheus port (default 9464; 0 = any)"),
    bus_url: str | None = typer.Option(None, "--bus-url", help="Redis of the node agents' telemetry: consume "
                                       "meridian:{<cluster>}:telemetry into this scheduler's state and publish its "
                                       "summaries for the global tier [env MERIDIAN_REGIONAL_BUS_URL; off if empty]"),
    region: str | None = typer.Option(None, help="region named in the summaries [env MERIDIAN_REGIONAL_REGION]"),
    dispatch: bool = typer.Option(True, "--dispatch/--no-dispatch", help="with --bus-url: create the Deployments "
                                  "and Jobs the global tier dispatches to this cluster (meridian:{<cluster>}:dispatch) "
                                  "and report their status; the leader only"),
    workload_namespace: str | None = typer.Option(None, "--workload-namespace", help="namespace of the dispatched "
                                                  "workloads' objects [env MERIDIAN_KUBE_DISPATCH_NAMESPACE, default "
                                                  "meridian-workloads]"),
    models_from_registry: bool = typer.Option(False, "--models-from-registry/--no-models-from-registry",
                                              envvar="MERIDIAN_REGIONAL_MODELS_FROM_REGISTRY",
                                              help="with --bus-url: serve the model registry's active placement "
                                              "version (--policy while there is none) and judge its candidate in "
                                              "shadow or canary (docs/model-lifecycle.md); read at start-up"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="debug logging"),
) -> None:
    """Schedule the cluster's pods that set schedulerName: meridian (and/or serve the extender)."""
    from meridian import observability as obs
    from regional_scheduler.kube_scheduler import KubernetesScheduler
    from regional_scheduler.service import RegionalScheduler

    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = _scheduler_settings({
        "cluster": cluster, "policy": policy, "scheduler_name": scheduler_name, "kube_api_qps": kube_api_qps,
        "kube_api_burst": kube_api_burst, "bind_workers": bind_workers, "leader_elect": leader_elect,
        "lease_namespace": lease_namespace, "lease_name": lease_name, "lease_duration_s": lease_duration_s,
        "renew_deadline_s": renew_deadline_s, "retry_period_s": retry_period_s, "identity": identity,
        "bus_url": bus_url, "region": region,
    })
    api = _kube_api(kubeconfig, pool_size=settings.bind_workers + 8)
    service = RegionalScheduler(cluster=settings.cluster, policy=served_policy(settings, models_from_registry))
    runner = KubernetesScheduler(api=api, service=service, settings=settings)
    metrics = obs.start_metrics_server(obs.MetricsSettings(**({"port": metrics_port} if metrics_port is not None
                                                              else {})))
    server = _start_extender(extender, service) if extender else None
    telemetry = None
    if settings.bus_url:
        telemetry = _start_telemetry(settings, service, runner, kubeconfig=kubeconfig, dispatch=dispatch,
                                     workload_namespace=workload_namespace)
    sys.exit(_serve(runner, schedule=schedule, telemetry=telemetry, server=server, metrics=metrics))


def served_policy(settings: KubeSchedulerSettings, from_registry: bool) -> str | ScorePolicy:
    """The placement policy: the settings' name, or the registry's active version and candidate
    (:func:`regional_scheduler.learned.registry_policy.policy_from_registry`) on the bus's Redis."""
    if not from_registry:
        return settings.policy
    if not settings.bus_url:
        raise typer.BadParameter("--models-from-registry needs --bus-url (the registry lives in the bus's Redis)")
    from meridian.bus import open_bus
    from meridian.model_registry.registry import open_registry
    from regional_scheduler.learned.registry_policy import policy_from_registry

    # The same variables as `meridian models` (MERIDIAN_MODELS_KEY_PREFIX: a test's private prefix).
    artifacts = os.path.expanduser(os.environ.get("MERIDIAN_MODELS_ARTIFACTS", "~/.local/share/meridian/models"))
    prefix = os.environ.get("MERIDIAN_MODELS_KEY_PREFIX", "")
    registry = open_registry(settings.bus_url, artifacts_dir=artifacts, key_prefix=prefix, with_bus=False)
    try:
        return policy_from_registry(registry, open_bus(settings.bus_url, key_prefix=prefix), fallback=settings.policy)
    finally:
        registry.close()


def _scheduler_settings(options: dict[str, object]) -> KubeSchedulerSettings:
    """The settings from the environment, overridden by the options given (those not None)."""
    from regional_scheduler.kube_scheduler import KubeSchedulerSettings
    from regional_scheduler.policies.registry import REGISTRY

    overrides = {k: v for k, v in options.items() if v is not None}
    settings = KubeSchedulerSettings(**overrides)  # type: ignore[arg-type]
    if settings.policy not in REGISTRY:
        raise typer.BadParameter(f"unknown policy {settings.policy!r}; known: {', '.join(REGISTRY)}",
                                 param_hint="--policy")
    return settings


def _kube_api(kubeconfig: Path | None, *, pool_size: int) -> ApiClient:
    """An API client from ``--kubeconfig`` (or the in-cluster config); exit 2 with a hint when none loads."""
    from kubernetes.config.config_exception import ConfigException

    from regional_scheduler.kube_scheduler import api_client_from

    try:
        return api_client_from(str(kubeconfig) if kubeconfig else None, pool_size=pool_size)
    except (ConfigException, OSError) as exc:
        typer.echo(f"error: cannot load a Kubernetes configuration ({exc}); pass --kubeconfig FILE or run in a pod",
                   err=True)
        raise typer.Exit(2) from None


def _start_extender(listen: str, service: RegionalScheduler) -> ExtenderServer:
    """Serve kube-scheduler's extender protocol on ``listen`` (HOST:PORT); exit 2 when it cannot."""
    from regional_scheduler.extender import ExtenderServer, parse_listen

    try:
        server = ExtenderServer(parse_listen(listen), service).start()
    except (ValueError, OSError) as exc:
        typer.echo(f"error: cannot serve the extender on {listen}: {exc}", err=True)
        raise typer.Exit(2) from None
    logging.getLogger(__name__).info("extender at %s", server.url)
    return server


def _start_telemetry(settings: KubeSchedulerSettings, service: RegionalScheduler, runner: KubernetesScheduler, *,
                     kubeconfig: Path | None, dispatch: bool, workload_namespace: str | None) -> RegionalTelemetry:
    """Consume the node agents' telemetry from ``settings.bus_url`` and publish summaries; with ``dispatch``,
    also create the dispatched workloads' objects in a thread (the leader only). Exit 2 when the bus fails."""
    from meridian.bus import BusError, redact_url
    from regional_scheduler.kube_scheduler import api_client_from
    from regional_scheduler.summary_publisher import RegionalTelemetry, SummarySettings
    from regional_scheduler.telemetry_state import TelemetryConsumerSettings

    assert settings.bus_url
    try:
        consumer_settings = TelemetryConsumerSettings(cluster=settings.cluster, bus_url=settings.bus_url)
        dispatcher = None
        if dispatch:
            from meridian.bus import open_bus
            from regional_scheduler.kube_dispatch import KubeDispatchSettings, KubeDispatchWorker

            dispatch_settings = KubeDispatchSettings(**({"namespace": workload_namespace}
                                                        if workload_namespace else {}))
            dispatcher = KubeDispatchWorker(
                bus=open_bus(settings.bus_url, key_prefix=consumer_settings.key_prefix),
                api=api_client_from(str(kubeconfig) if kubeconfig else None, pool_size=8),
                cluster=settings.cluster, settings=dispatch_settings)
        telemetry = RegionalTelemetry(settings=consumer_settings, summary=SummarySettings(region=settings.region),
                                      scheduler=service, objects=dispatcher).start()
    except BusError as exc:
        typer.echo(f"error: cannot open the bus at {redact_url(settings.bus_url)}: {exc}", err=True)
        raise typer.Exit(2) from None
    if dispatcher is not None:
        import threading

        leading = runner.elector.leading if runner.elector is not None else None
        threading.Thread(target=dispatcher.run, args=(runner.stop,), kwargs={"leading": leading},
                         name="kube-dispatch", daemon=True).start()
        logging.getLogger(__name__).info("dispatching workloads into namespace %s",
                                         dispatcher.settings.namespace)
    return telemetry


def _serve(runner: KubernetesScheduler, *, schedule: bool, telemetry: RegionalTelemetry | None,
           server: ExtenderServer | None, metrics: MetricsServer | None) -> int:
    """Schedule (or, with ``schedule`` off, only keep the informers for the extender) until SIGTERM or
    SIGINT, then stop what was started; returns the exit code."""

    def _stop(*_: object) -> None:
        runner.stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    code = 0
    try:
        if schedule:
            code = runner.run()
        else:
            runner.start_informers()
            runner.stop.wait()
            runner.shutdown()
    finally:
        if telemetry is not None:
            telemetry.close()
        if server is not None:
            server.stop()
        if metrics is not None:
            metrics.shutdown()
    return code


def main() -> None:
    """``python -m regional_scheduler.kube_cli``: the same command without the ``meridian`` CLI's other
    components (no torch, scipy or gRPC to import), so a scheduler pod starts in about a second."""
    typer.run(regional_scheduler_command)


if __name__ == "__main__":
    main()
