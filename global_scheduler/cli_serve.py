"""``meridian global-scheduler``: serve the global API (settings: ``MERIDIAN_GLOBAL_*`` environment variables)."""

from __future__ import annotations

import logging
import signal
import threading
from pathlib import Path
from typing import Any

import typer

from global_scheduler.cli_common import console
from meridian.cli import CliRoot

log = logging.getLogger(__name__)


def serve(listen: str | None = typer.Option(None, help="host:port (default from MERIDIAN_GLOBAL_API__LISTEN)."),
          bus: str | None = typer.Option(None, help="Bus URL (default from MERIDIAN_GLOBAL_BUS__URL)."),
          policy: str | None = typer.Option(None, help="Routing policy (default gnn)."),
          energy: bool = typer.Option(True, help="Serve EnergyReports from the Redis energy ledger too."),
          metrics_port: int = typer.Option(0, help="Serve Prometheus metrics on this port (0 = off)."),
          insecure: bool = typer.Option(False, "--insecure", help="Allow serving without tokens beyond "
                                        "loopback (a trusted network only)."),
          ha: bool | None = typer.Option(None, "--ha/--no-ha", help="High availability: one of several replicas "
                                         "electing a leader on the bus's Redis; only the leader routes, the others "
                                         "forward API calls to it (default from MERIDIAN_GLOBAL_HA__ENABLED, off)."),
          advertise: str | None = typer.Option(None, help="With --ha: host:port the other replicas forward calls to "
                                               "(default: the listen address; MERIDIAN_GLOBAL_HA__ADVERTISE)."),
          federation_config: Path | None = typer.Option(
              None, "--federation-config", dir_okay=False, help="Federation file: regions and member clusters "
              "(docs/federation-config.md; default from MERIDIAN_GLOBAL_REGISTRY__CONFIG_FILE)."),
          ) -> None:
    """Serve the global API (settings: MERIDIAN_GLOBAL_* environment variables)."""
    settings = _settings(listen=listen, bus=bus, policy=policy, insecure=insecure, ha=ha, advertise=advertise,
                         federation_config=federation_config)
    _check_and_start_metrics(settings, metrics_port)
    hooks, ledger = _energy_service(settings) if energy else ([], None)
    engine, replica = _engine(settings)
    stop_accounting = _start_accounting(settings, ledger, engine, replica) if hooks else None
    from global_scheduler.server import build_server

    running = build_server(engine, extra_services=hooks, replica=replica)
    console.print(f"global scheduler listening on port {running.port} (policy {settings.routing.policy}"
                  f"{', high availability: ' + str(replica.advertise) if replica else ''})")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    if stop_accounting is not None:
        stop_accounting.set()
    running.stop()


def _settings(*, listen: str | None, bus: str | None, policy: str | None, insecure: bool, ha: bool | None,
              advertise: str | None, federation_config: Path | None) -> Any:
    """The settings from the environment, with the options given on the command line over them."""
    from global_scheduler.settings import GlobalSchedulerSettings

    settings = GlobalSchedulerSettings()
    if listen:
        settings.api.listen = listen
    if bus:
        settings.bus.url = bus
    if policy:
        settings.routing.policy = policy
    if insecure:
        settings.api.insecure = True
    if ha is not None:
        settings.ha.enabled = ha
    if advertise:
        settings.ha.advertise = advertise
    if federation_config:
        settings.registry.config_file = federation_config
    return settings


def _check_and_start_metrics(settings: Any, metrics_port: int) -> None:
    """Refuse an unsafe API and the everyday mistakes, start the metrics server, refuse an unknown policy."""
    from global_scheduler.settings import unsafe_api_reason

    reason = unsafe_api_reason(settings.api)
    if reason is not None:
        typer.echo(f"error: {reason}", err=True)
        raise typer.Exit(2)
    from meridian.errors import UserError, check_listen

    # Everyday mistakes are one line each (meridian.errors), found before seconds of imports and start-up.
    if _on_redis(settings):
        from meridian.bus import require_redis

        require_redis(settings.bus.url, setting="--bus or MERIDIAN_GLOBAL_BUS__URL")
    check_listen(settings.api.listen, what="the global API", setting="--listen or MERIDIAN_GLOBAL_API__LISTEN")
    if metrics_port:
        from meridian.observability import MetricsSettings, start_metrics_server

        # Loopback outside a pod (MERIDIAN_METRICS_ADDRESS).
        start_metrics_server(MetricsSettings(port=metrics_port), port_setting="--metrics-port (0 = off)")
    from global_scheduler.routing.registry import names as routing_policies

    if settings.routing.policy not in routing_policies():
        raise UserError(f"unknown routing policy {settings.routing.policy!r}",
                        hint=f"choose one of {', '.join(routing_policies())} with --policy or "
                             "MERIDIAN_GLOBAL_ROUTING__POLICY")


def _on_redis(settings: Any) -> bool:
    return settings.bus.url.startswith(("redis://", "rediss://", "unix://"))


def _energy_service(settings: Any) -> tuple[list[Any], Any]:
    """The server hook that serves EnergyReports from the Redis energy ledger, and that ledger; none without
    Redis or without the accounting package (optional for the API)."""
    hooks: list[Any] = []
    ledger = None
    if settings.bus.url.split("://", 1)[0].endswith("+cluster"):
        log.warning("energy reports not served: the energy ledger's scripts need one Redis, and the bus is a Redis "
                    "Cluster; run the accounting consumer against a Redis of its own (docs/redis-cluster.md)")
    if _on_redis(settings):
        try:
            from global_scheduler.accounting.ledger import RedisLedger
            from global_scheduler.accounting.service import SERVICE_NAME, add_energy_service
            from meridian.bus import redis_client

            # The bus's credentials and TLS (MERIDIAN_REDIS_*, a password file), not only the URL's.
            ledger = RedisLedger(redis_client(settings.bus.url), prefix=settings.bus.key_prefix + "meridian:")

            def _energy(server: Any) -> str:
                add_energy_service(server, ledger)
                return SERVICE_NAME

            hooks.append(_energy)
        except ImportError as exc:  # the accounting package is optional for the API
            log.warning("energy reports not served: %s", exc)
    return hooks, ledger


def _engine(settings: Any) -> tuple[Any, Any]:
    """The routing engine, and with high availability the replica that holds it (else None)."""
    from global_scheduler.scheduler import GlobalScheduler
    from meridian.bus import open_bus
    from meridian.errors import UserError

    replica = None
    if settings.ha.enabled:
        from global_scheduler.leadership import Replica

        try:
            replica = Replica.from_settings(settings, make_engine=lambda fence: GlobalScheduler(
                settings=settings, bus=open_bus(settings.bus.url, key_prefix=settings.bus.key_prefix),
                fence=fence))
        except ValueError as exc:
            raise UserError(str(exc), hint="see docs/high-availability.md, or run without --ha") from exc
        engine = replica.engine
    else:
        engine = GlobalScheduler(settings=settings, bus=open_bus(settings.bus.url,
                                                                 key_prefix=settings.bus.key_prefix))
    return engine, replica


def _start_accounting(settings: Any, ledger: Any, engine: Any, replica: Any) -> threading.Event:
    """Fill the ledger that EnergyReports serves: energy of each interval between two summaries of a
    cluster, once per summary (restart-safe; global_scheduler/accounting/consumer.py). Returns its stop event."""
    import socket

    from global_scheduler.accounting.consumer import SummaryAccountant, start_accounting
    from meridian.bus import open_bus

    accountant = SummaryAccountant(
        bus=open_bus(settings.bus.url, key_prefix=settings.bus.key_prefix), ledger=ledger,
        consumer=f"accounting-{socket.gethostname()}",
        price_per_mwh=lambda region, t_s: (replica.engine if replica else engine).registry.prices.get(region, 0.0))
    _, stop_accounting = start_accounting(accountant)
    return stop_accounting


def register(cli: CliRoot) -> None:
    """Add ``global-scheduler`` to the ``meridian`` CLI."""
    cli.app.command("global-scheduler")(serve)
