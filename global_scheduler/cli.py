"""CLI commands contributed to ``meridian`` through the ``meridian.cli`` entry point.

Operators: ``submit``, ``get``, ``ls``, ``watch``, ``cancel``, ``clusters`` (they speak to the API at
``--api`` / ``$MERIDIAN_API``, with ``--token`` / ``$MERIDIAN_TOKEN``); ``global-scheduler`` serves
the API. Benchmarks: ``bench routing`` and ``bench api`` (the carbon lower bound is an experiment:
``python -m experiments.carbon_bound``). Training: ``train routing``.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.table import Table

from meridian.cli import CliRoot

console = Console(width=None if Console().is_terminal else 160)  # tables whole in logs and pipes
log = logging.getLogger(__name__)

API_OPT = typer.Option(None, "--api", envvar="MERIDIAN_API", help="host:port of the global API (default 127.0.0.1:50051).")
TOKEN_OPT = typer.Option(None, "--token", envvar="MERIDIAN_TOKEN", help="Bearer token.")
CA_OPT = typer.Option(None, "--ca", help="PEM file of the CA that signed the server's certificate (enables TLS).")
# The federation window of `bench routing` (and of `python -m experiments.carbon_bound`); default: the held-back week.
CARBON_OPT = typer.Option(None, "--carbon", help="Carbon series folder (default: shared carbon/).")
PRICES_OPT = typer.Option(None, "--prices", help="ENTSO-E price CSV (default: the shared one).")
START_OPT = typer.Option("12-01", "--start", help="Window start, MM-DD or YYYY-MM-DD (held-back default).")
DAYS_OPT = typer.Option(7, "--days", min=1, max=60)
CLUSTERS_OPT = typer.Option(12, "--clusters", min=1, max=1000)
SEED_OPT = typer.Option(0, "--seed")
TRACES_OPT = typer.Option(None, "--traces", help="Shared traces folder.")


def _traces_default() -> Path:
    """``$MERIDIAN_TRACES``, else ``../shared/traces`` beside the project (meridian.traces.locate_traces)."""
    from meridian.traces import TracesNotFoundError, locate_traces

    try:
        return locate_traces().path
    except TracesNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="--traces") from None


def _window(*, start: str, days: int, clusters: int, seed: int, traces: Path | None, carbon: Path | None,
            prices: Path | None) -> tuple[Any, Path]:
    """The federation window the routing benches share (their six window options), and the traces folder."""
    from global_scheduler.bench_routing import bench_config

    traces_dir = traces or _traces_default()
    try:
        return bench_config(start=start, days=days, clusters=clusters, seed=seed, traces_dir=traces_dir,
                            carbon_dir=carbon, prices_file=prices), traces_dir
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _series_error(exc: KeyError) -> typer.BadParameter:
    """A region whose zone or price area the given series lack, or a window outside them."""
    return typer.BadParameter(str(exc.args[0] if exc.args else exc), param_hint="--carbon/--prices/--start")


def _config_json(cfg: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()}


def _client(api: str | None, token: str | None, ca: Path | None):
    from global_scheduler.client import GlobalClient

    return GlobalClient(api, token=token, root_certificates=ca.read_bytes() if ca else None)


def _rpc_error(exc: Exception) -> None:
    import grpc

    if isinstance(exc, grpc.RpcError):
        from global_scheduler.errors import error_details

        typer.echo(f"error: {error_details(exc).describe()}", err=True)  # one line, as meridian.errors
        raise typer.Exit(2) from None
    raise exc


OUTPUT_OPT = typer.Option("table", "--output", "-o", help="table | wide | json | yaml | name")
REF_HELP = "The workload's ID, a unique prefix of it, or its name."
WORKLOAD_TENANT_OPT = typer.Option("", "--tenant", help="Look the name or ID prefix up in this tenant only.")


def _output_format(output: str) -> str:
    """The ``-o`` value, or a one-line error and exit 2, before anything is asked of the server."""
    from global_scheduler.cli_output import OutputFormatError, check_output_format

    try:
        return check_output_format(output)
    except OutputFormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def _terminal_width() -> int | None:
    """The terminal's width, to which a table's MESSAGE is cut; None in a pipe (nothing is cut)."""
    return console.width if console.is_terminal else None


def _print_workloads(items: list[Any], output: str, *, as_list: bool = False, hide: tuple[str, ...] = ()) -> None:
    """The workloads in an ``-o`` format (global_scheduler/cli_output.py): one message, or a list for ``ls``;
    ``hide`` names table columns a filter makes redundant."""
    from global_scheduler.cli_output import render_workloads

    output = _output_format(output)
    if not items and output in ("table", "wide"):
        typer.echo("No workloads found.", err=True)
        return
    text = render_workloads(items, output, as_list=as_list, width=_terminal_width(), hide=hide)
    if text:
        typer.echo(text)


def _resolve(client: Any, ref: str, tenant: str) -> Any:
    """The workload an ID, a unique ID prefix or a name refers to; an ambiguous one is an error (exit 2)
    that lists the candidates."""
    from global_scheduler.client import AmbiguousWorkloadError, state_name

    try:
        return client.resolve(ref, tenant=tenant)
    except AmbiguousWorkloadError as exc:
        typer.echo(f"error: {exc}:", err=True)
        for w in exc.candidates:
            typer.echo(f"  {w.id}  {w.spec.name}  {w.spec.tenant}  {state_name(w.state)}", err=True)
        raise typer.Exit(2) from None
    except Exception as exc:
        _rpc_error(exc)


def register(cli: CliRoot) -> None:
    """Add this component's commands to the ``meridian`` CLI."""
    app, bench, train = cli.app, cli.bench, cli.train

    @app.command("submit")
    def submit(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="Workload YAML."),
               idempotency_key: str = typer.Option("", "--idempotency-key", help="Overrides the file's key."),
               output: str = OUTPUT_OPT,
               api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
        """Submit a workload described in FILE.yaml (checked here as the API checks it: one line per problem).

        Warns when the tenant already has a workload of that name that has not ended: names are how
        ``get``, ``watch`` and ``cancel`` find a workload, so a second one makes them ambiguous."""
        from global_scheduler.workload_file import WorkloadFileError, load_workload_file

        output = _output_format(output)  # an unknown -o is refused before anything is submitted
        try:
            spec, key = load_workload_file(file)
        except WorkloadFileError as exc:
            for problem in exc.problems:
                typer.echo(problem, err=True)
            raise typer.Exit(2) from None
        with _client(api, token, ca) as client:
            try:
                w = client.submit(spec, idempotency_key or key)
                others = client.find_active_by_name(w.spec.name, w.spec.tenant, exclude_id=w.id)
            except Exception as exc:
                _rpc_error(exc)
            if others:
                typer.echo(f"warning: tenant {w.spec.tenant} already has {w.spec.name!r} not ended: "
                           + ", ".join(o.id for o in others) + "; refer to them by ID", err=True)
        _print_workloads([w], output)

    @app.command("get")
    def get(workload_ref: str = typer.Argument(..., metavar="ID|NAME", help=REF_HELP),
            tenant: str = WORKLOAD_TENANT_OPT, output: str = OUTPUT_OPT,
            api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
        """Show one workload."""
        output = _output_format(output)
        with _client(api, token, ca) as client:
            w = _resolve(client, workload_ref, tenant)
        _print_workloads([w], output)

    @app.command("ls")
    def ls(tenant: str = typer.Option("", help="Only this tenant."),
           state: str = typer.Option("", help="Only this state (pending, dispatched, scheduled, running, failed, cancelled)."),
           cluster: str = typer.Option("", help="Only this cluster."),
           limit: int = typer.Option(100, min=0, help="At most this many rows (0 = every page)."),
           output: str = OUTPUT_OPT,
           api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
        """List workloads (following page tokens, up to --limit)."""
        from protos import global_api_pb2 as pb

        output = _output_format(output)
        state_value = 0
        if state:
            try:
                state_value = pb.WorkloadState.Value("WORKLOAD_STATE_" + state.upper())
            except ValueError:
                raise typer.BadParameter(f"unknown state {state!r}", param_hint="--state") from None
        items = []
        with _client(api, token, ca) as client:
            try:
                for w in client.list(tenant=tenant, state=state_value, cluster=cluster,
                                     page_size=min(limit, 1000) if limit else 1000):
                    items.append(w)
                    if limit and len(items) >= limit:
                        break
            except Exception as exc:
                _rpc_error(exc)
        _print_workloads(items, output, as_list=True, hide=("TENANT",) if tenant else ())

    @app.command("watch")
    def watch(workload_ref: str = typer.Argument(..., metavar="ID|NAME", help=REF_HELP),
              until: str = typer.Option("", "--until", metavar="STATE",
                                        help="Stop (exit 0) at this state: pending, dispatched, scheduled, running "
                                             "(or a later one of these), failed, cancelled. Default: any end. Another "
                                             "end, or the deadline, exits 1."),
              deadline_s: float = typer.Option(0.0, "--deadline", "--timeout", min=0.0,
                                               help="Give up after this many seconds in all, reconnections included, "
                                                    "with a message and exit 1 (0 = no limit)."),
              reconnect: bool = typer.Option(True, "--reconnect/--no-reconnect",
                                             help="Open the watch again, with back-off, when the connection breaks "
                                                  "(server restart) before a terminal state."),
              tenant: str = WORKLOAD_TENANT_OPT, output: str = OUTPUT_OPT,
              api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
        """Print a line each time a workload changes, until it reaches --until's state or ends (Ctrl-C to stop)."""
        import grpc

        from global_scheduler.cli_output import watch_key, watch_line
        from global_scheduler.client import TERMINAL_STATES, parse_state, state_name, state_reached

        output = _output_format(output)
        try:
            goal = parse_state(until) if until else None
        except ValueError as exc:
            typer.echo(f"error: --until: {exc}", err=True)
            raise typer.Exit(2) from None
        err_console = Console(stderr=True)

        def reconnecting(why: str, delay_s: float) -> None:
            err_console.print(f"[yellow]watch interrupted ({why[:200]}); reconnecting in {delay_s:.1f} s[/yellow]")

        last, shown = None, None
        with _client(api, token, ca) as client:
            wid = _resolve(client, workload_ref, tenant).id
            updates = (client.follow(wid, deadline_s=deadline_s or None, on_reconnect=reconnecting)
                       if reconnect else client.watch(wid, timeout_s=deadline_s or None))
            try:
                for w in updates:
                    last = w
                    if watch_key(w) != shown:  # a snapshot that changes nothing shown prints nothing
                        shown = watch_key(w)
                        typer.echo(watch_line(w, output))
                    if state_reached(w.state, goal):
                        return
                    if w.state in TERMINAL_STATES:
                        break
            except KeyboardInterrupt:
                raise typer.Exit(130) from None
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.DEADLINE_EXCEEDED:
                    _rpc_error(client.explain(exc))
        wanted = "end" if goal is None else f"be {state_name(goal)}"
        now = f"; it is {state_name(last.state)}" if last is not None else ""
        if last is not None and last.state in TERMINAL_STATES:
            why = f"workload {wid} is {state_name(last.state)} ({last.message}): it will not {wanted}"
        elif deadline_s:
            why = f"timed out after {deadline_s:g} s waiting for workload {wid} to {wanted}{now}"
        else:
            why = f"the watch of workload {wid} ended before it came to {wanted}{now}"
        typer.echo(f"error: {why}", err=True)
        raise typer.Exit(1)

    @app.command("cancel")
    def cancel(workload_ref: str = typer.Argument(..., metavar="ID|NAME", help=REF_HELP),
               tenant: str = WORKLOAD_TENANT_OPT, output: str = OUTPUT_OPT,
               api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
        """Cancel a workload (its cluster releases it)."""
        output = _output_format(output)
        with _client(api, token, ca) as client:
            wid = _resolve(client, workload_ref, tenant).id
            try:
                w = client.cancel(wid)
            except Exception as exc:
                _rpc_error(exc)
        _print_workloads([w], output)

    @app.command("clusters")
    def clusters(output: str = OUTPUT_OPT,
                 api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
        """The clusters the global scheduler knows, with free capacity and grid intensity."""
        from global_scheduler.cli_output import render_clusters

        output = _output_format(output)
        with _client(api, token, ca) as client:
            try:
                items = client.clusters()
            except Exception as exc:
                _rpc_error(exc)
        if not items and output in ("table", "wide"):
            typer.echo("No clusters have reported.", err=True)
            return
        text = render_clusters(items, output, width=_terminal_width())
        if text:
            typer.echo(text)

    @app.command("global-scheduler")
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
        from global_scheduler.settings import GlobalSchedulerSettings
        from meridian.bus import open_bus

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
        from global_scheduler.settings import unsafe_api_reason

        reason = unsafe_api_reason(settings.api)
        if reason is not None:
            typer.echo(f"error: {reason}", err=True)
            raise typer.Exit(2)
        from meridian.errors import UserError, check_listen

        # Everyday mistakes are one line each (meridian.errors), found before seconds of imports and start-up.
        if settings.bus.url.startswith(("redis://", "rediss://", "unix://")):
            from meridian.bus import require_redis

            require_redis(settings.bus.url, setting="--bus or MERIDIAN_GLOBAL_BUS__URL")
        check_listen(settings.api.listen, what="the global API", setting="--listen or MERIDIAN_GLOBAL_API__LISTEN")
        if metrics_port:
            from meridian.observability import MetricsSettings, start_metrics_server

            # Loopback outside a pod (MERIDIAN_METRICS_ADDRESS).
            start_metrics_server(MetricsSettings(port=metrics_port), port_setting="--metrics-port (0 = off)")
        from global_scheduler.routing.registry import names as routing_policies  # torch: seconds

        if settings.routing.policy not in routing_policies():
            raise UserError(f"unknown routing policy {settings.routing.policy!r}",
                            hint=f"choose one of {', '.join(routing_policies())} with --policy or "
                                 "MERIDIAN_GLOBAL_ROUTING__POLICY")
        from global_scheduler.scheduler import GlobalScheduler
        from global_scheduler.server import build_server

        hooks = []
        if energy and settings.bus.url.startswith(("redis://", "rediss://", "unix://")):
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
        stop_accounting: threading.Event | None = None
        if hooks:
            # Fill the ledger that EnergyReports serves: energy of each interval between two summaries of a
            # cluster, once per summary (restart-safe; global_scheduler/accounting/consumer.py).
            import socket

            from global_scheduler.accounting.consumer import SummaryAccountant, start_accounting

            accountant = SummaryAccountant(
                bus=open_bus(settings.bus.url, key_prefix=settings.bus.key_prefix), ledger=ledger,
                consumer=f"accounting-{socket.gethostname()}",
                price_per_mwh=lambda region, t_s: (replica.engine if replica else engine).registry.prices.get(region, 0.0))
            _, stop_accounting = start_accounting(accountant)
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

    @bench.command("routing")
    def bench_routing(
        policies: str | None = typer.Option(None, help="Comma-separated routing policies (default: gnn and every "
                                            "baseline, bench_routing.DEFAULT_POLICIES)."),
        carbon: Path | None = CARBON_OPT,
        prices: Path | None = PRICES_OPT,
        start: str = START_OPT,
        days: int = DAYS_OPT,
        clusters: int = CLUSTERS_OPT,
        seed: int = SEED_OPT,
        checkpoint: Path | None = typer.Option(None, "--checkpoint", help="GNN checkpoint (default: committed)."),
        traces: Path | None = TRACES_OPT,
        json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON here."),
        save_run: Path | None = typer.Option(None, "--save-run", help="Save per-interval accounting for `report energy`."),
        latency_clusters: int = typer.Option(100, "--latency-clusters", help="Also time each policy's decisions "
                                             "over a federation of this many clusters (0 = skip)."),
        same_work_as: str | None = typer.Option(None, "--same-work-as", help="Run every policy on only the workloads "
                                                "this policy starts (carbon on the same work, when it fails some)."),
    ) -> None:
        """Compare routing policies on the held-back federation window (real carbon, prices, DLRM workloads)."""
        from global_scheduler.bench_routing import (
            DEFAULT_POLICIES,
            comparison,
            decision_latency,
            run_routing_bench,
        )
        from global_scheduler.routing.registry import names
        from meridian.grid_data import GridDataError

        names_list = [p.strip() for p in policies.split(",") if p.strip()] if policies else list(DEFAULT_POLICIES)
        unknown = [p for p in names_list if p not in names()]
        if unknown:
            raise typer.BadParameter(f"unknown {unknown}; known: {', '.join(names())}", param_hint="--policies")
        if same_work_as is not None and same_work_as not in names():
            raise typer.BadParameter(f"unknown {same_work_as!r}; known: {', '.join(names())}",
                                     param_hint="--same-work-as")
        cfg, traces_dir = _window(start=start, days=days, clusters=clusters, seed=seed, traces=traces,
                                  carbon=carbon, prices=prices)
        hooks: dict[str, Any] = {}
        on_interval = None
        if save_run is not None:
            from global_scheduler.accounting.run_store import FederationRunHook

            def on_interval(name: str) -> Any:
                hooks[name] = FederationRunHook(name)
                return hooks[name]
        try:
            with console.status("routing…") as status:
                results = run_routing_bench(cfg, traces_dir=traces_dir, policies=names_list, carbon_dir=carbon,
                                            prices_file=prices, checkpoint=checkpoint, on_interval=on_interval,
                                            progress=lambda name: status.update(f"routing with {name}…"),
                                            same_work_as=same_work_as)
        except KeyError as exc:
            raise _series_error(exc) from None
        except GridDataError as exc:  # a --carbon/--prices file or folder that cannot be read
            raise typer.BadParameter(str(exc), param_hint="--carbon/--prices") from None
        work = f", only the work {same_work_as} starts" if same_work_as else ""
        table = Table(title=f"routing: {cfg.clusters} clusters in {len(cfg.regions)} regions, {cfg.days} days from "
                      f"{cfg.start}, {next(iter(results.values()))['workloads']} workloads{work}")
        for col in ("policy", "energy kWh", "carbon kg", "cost EUR", "SLO viol.", "failures", "deadline miss",
                    "Jain", "p50 ms", "p99 ms"):
            table.add_column(col, justify="right")
        for name, r in results.items():
            table.add_row(name, f"{r['energy_kwh']:,.0f}", f"{r['carbon_kg']:,.0f}", f"{r['cost']:,.0f}",
                          str(r["slo_violations"]), str(r["failures"]), str(r["deadline_misses"]),
                          f"{r['jain_fairness']:.3f}", f"{r['decision_ms_p50']:.3f}", f"{r['decision_ms_p99']:.3f}")
        console.print(table)
        if latency_clusters:
            lat_table = Table(title=f"decision latency over {latency_clusters} clusters (one thread)")
            for col in ("policy", "wall p50 ms", "wall p99 ms", "CPU p50 ms", "CPU p99 ms"):
                lat_table.add_column(col, justify="right")
            with console.status("timing decisions…"):
                for name in names_list:
                    lat = decision_latency(name, clusters=latency_clusters, traces_dir=traces_dir, checkpoint=checkpoint)
                    results[name][f"decision_latency_{latency_clusters}_clusters"] = lat
                    lat_table.add_row(name, f"{lat['wall_ms_p50']:.3f}", f"{lat['wall_ms_p99']:.3f}",
                                      f"{lat['cpu_ms_p50']:.3f}", f"{lat['cpu_ms_p99']:.3f}")
            console.print(lat_table)
        summary = comparison(results)
        if summary:
            console.print(summary)
        if save_run is not None and hooks:
            from global_scheduler.accounting.run_store import save_federation_run
            from global_scheduler.accounting.work import WorkDone

            path = save_federation_run(save_run, hooks, provenance={"command": "meridian bench routing",
                                                                    "config": {k: str(v) for k, v in cfg.__dict__.items()}},
                                       work={n: WorkDone.from_result(r) for n, r in results.items()})
            console.print(f"run saved to {path}")
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps({"config": _config_json(cfg), "same_work_as": same_work_as,
                                            "policies": results, "comparison": summary}, indent=2, default=str))

    @bench.command("api")
    def bench_api(
        duration: float = typer.Option(10.0, "--duration", help="Seconds of sustained load (60 for the target)."),
        rate: float = typer.Option(1000.0, "--rate", help="Offered SubmitWorkload calls per second (all clients)."),
        clients: int = typer.Option(2, "--clients", min=1, help="Client processes."),
        clusters: int = typer.Option(10, "--clusters", min=1),
        policy: str = typer.Option("gnn", "--policy", help="Routing policy the server uses."),
        redis_url: str = typer.Option("redis://127.0.0.1:6379/0", "--redis", help="Redis for the dispatch streams."),
        json_out: Path | None = typer.Option(None, "--json", help="Write the result as JSON here."),
        gil_switch_ms: float = typer.Option(0.5, "--gil-switch-ms", min=0.0,
                                            help="The server's thread switch interval (api.gil_switch_interval_ms); "
                                                 "0 keeps Python's default 5 ms, for comparison."),
        routing_process: bool = typer.Option(True, "--routing-process/--routing-in-api",
                                             help="Route in a child process (routing.worker_process) or in a "
                                                  "thread of the API's process."),
        hostile: bool = typer.Option(False, "--hostile", help="Measure the load alone, then beside a hostile mix "
                                     "(idle watches, oversized requests, garbage bytes), with a health check every "
                                     "100 ms; reports the throughput ratio (target ≥ 0.90)."),
        watches: int = typer.Option(100, "--watches", min=0, help="With --hostile: idle watches kept open."),
        watch_tokens: int = typer.Option(10, "--watch-tokens", min=1, help="With --hostile: tokens they use."),
        oversized_rate: float = typer.Option(20.0, "--oversized-rate", min=0.0,
                                             help="With --hostile: requests over the receive limit per second."),
        garbage_rate: float = typer.Option(100.0, "--garbage-rate", min=0.0,
                                           help="With --hostile: garbage-byte calls per second."),
        kill_leader_at: float | None = typer.Option(None, "--kill-leader-at", min=0.0, max=1.0,
                                                    help="High availability: run two replicas (ha.enabled), clients on "
                                                         "both, and kill -9 the leader at this fraction of the run; "
                                                         "reports accepted, lost, dispatched_twice and failover_s."),
        lease_s: float = typer.Option(5.0, "--lease-s", min=0.1, help="With --kill-leader-at: the leader lease "
                                      "(ha.lease_duration_s; renew deadline 0.7x, retry period 0.1x)."),
    ) -> None:
        """Sustained SubmitWorkload load over loopback; checks every accepted workload is dispatched once."""
        from global_scheduler.bench_api import run_api_bench

        if kill_leader_at is not None:
            _bench_api_ha(duration=duration, rate=rate, clients=clients, clusters=clusters, policy=policy,
                          redis_url=redis_url, json_out=json_out, gil_switch_ms=gil_switch_ms,
                          routing_process=routing_process, kill_leader_at=kill_leader_at, lease_s=lease_s)
            return

        if hostile:
            _bench_api_hostile(duration=duration, rate=rate, clients=clients, clusters=clusters, policy=policy,
                               redis_url=redis_url, json_out=json_out, gil_switch_ms=gil_switch_ms,
                               routing_process=routing_process, watches=watches, watch_tokens=watch_tokens,
                               oversized_rate=oversized_rate, garbage_rate=garbage_rate)
            return
        with console.status(f"{rate:.0f} calls/s for {duration:.0f} s…"):
            r = run_api_bench(redis_url=redis_url, rate=rate, duration_s=duration, clients=clients, clusters=clusters,
                              policy=policy, gil_switch_interval_ms=gil_switch_ms or None,
                              routing_process=routing_process)
        where = "a routing process" if routing_process else "routing in the API's process"
        table = Table(title=f"SubmitWorkload over loopback ({clients} client processes, policy {policy}, {where})")
        for col in ("offered/s", "accepted", "errors", "throughput/s", "p50 ms", "p99 ms", "max ms", "dispatched",
                    "duplicates", "missing"):
            table.add_column(col, justify="right")
        table.add_row(f"{r.offered_per_s:.0f}", str(r.accepted), str(r.errors), f"{r.throughput_per_s:.0f}",
                      f"{r.latency_ms_p50:.1f}", f"{r.latency_ms_p99:.1f}", f"{r.latency_ms_max:.1f}",
                      str(r.dispatched_unique), str(r.duplicates), str(r.missing))
        console.print(table)
        d = r.as_dict()
        console.print(f"server: GIL switch interval {d['server_switch_interval_ms']:.2f} ms; "
                      f"{d['server_gc_collections']} GC collections, longest {d['server_gc_pause_ms_max']:.1f} ms; "
                      f"routing p99 {d['server_decision_ms_p99']:.2f} ms per workload; accepted → dispatched "
                      f"p50 {d['server_dispatch_lag_ms_p50']:.0f} / p99 {d['server_dispatch_lag_ms_p99']:.0f} / "
                      f"max {d['server_dispatch_lag_ms_max']:.0f} ms")
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(d, indent=2))

    def _bench_api_ha(*, duration: float, rate: float, clients: int, clusters: int, policy: str, redis_url: str,
                      json_out: Path | None, gil_switch_ms: float, routing_process: bool, kill_leader_at: float,
                      lease_s: float) -> None:
        from global_scheduler.bench_api import run_ha_api_bench

        with console.status(f"{rate:.0f} calls/s for {duration:.0f} s on two replicas, the leader killed at "
                            f"{kill_leader_at:.0%}…"):
            r = run_ha_api_bench(redis_url=redis_url, rate=rate, duration_s=duration, clients=clients,
                                 clusters=clusters, policy=policy, kill_leader_at=kill_leader_at,
                                 lease_duration_s=lease_s, gil_switch_interval_ms=gil_switch_ms or None,
                                 routing_process=routing_process)
        table = Table(title=f"SubmitWorkload on two replicas, leader killed at {kill_leader_at:.0%} of the run "
                            f"(lease {lease_s:g} s, policy {policy})")
        for col in ("offered/s", "accepted", "errors", "lost", "dispatched", "dispatched_twice", "missing",
                    "failover_s", "lock_takeover_s", "p99 ms"):
            table.add_column(col, justify="right")

        def secs(v: float | None) -> str:
            return "-" if v is None else f"{v:.2f}"

        table.add_row(f"{r['offered_per_s']:.0f}", str(r["accepted"]), str(r["errors"]), str(r["lost"]),
                      str(r["dispatched_unique"]), str(r["dispatched_twice"]), str(r["missing"]),
                      secs(r["failover_s"]), secs(r["lock_takeover_s"]), f"{r['latency_ms_p99']:.1f}")
        console.print(table)
        if r["missing"]:
            console.print(f"{r['unpublished_at_kill']} of the {r['missing']} missing were made durable by the killed "
                          "leader but not yet published (DISPATCHED: reconciliation publishes them)")
        if r["error_codes"]:
            console.print(f"failed submissions by code: {r['error_codes']} ({r['errors_after_kill']} completed after "
                          "the kill)")
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(r, indent=2, default=str))

    def _bench_api_hostile(*, duration: float, rate: float, clients: int, clusters: int, policy: str,
                           redis_url: str, json_out: Path | None, gil_switch_ms: float, routing_process: bool,
                           watches: int, watch_tokens: int, oversized_rate: float, garbage_rate: float) -> None:
        from global_scheduler.bench_api import run_hostile_api_bench

        with console.status(f"{rate:.0f} calls/s for {duration:.0f} s, clean then hostile…"):
            r = run_hostile_api_bench(redis_url=redis_url, rate=rate, duration_s=duration, clients=clients,
                                      clusters=clusters, policy=policy, watches=watches, watch_tokens=watch_tokens,
                                      oversized_per_s=oversized_rate, garbage_per_s=garbage_rate,
                                      gil_switch_interval_ms=gil_switch_ms or None, routing_process=routing_process)
        mix = r["hostile_mix"]
        table = Table(title=f"SubmitWorkload at {rate:.0f}/s offered, alone and beside {watches} idle watches "
                      f"({watch_tokens} tokens), {oversized_rate:g} oversized/s, {garbage_rate:g} garbage/s")
        for col in ("phase", "throughput/s", "errors", "p50 ms", "p99 ms", "health probes", "missed",
                    "health p99 ms", "health max ms"):
            table.add_column(col, justify="right")
        for phase in ("clean", "hostile"):
            load, health = r[phase], r["health"][phase]
            table.add_row(phase, f"{load['throughput_per_s']:.0f}", str(load["errors"]),
                          f"{load['latency_ms_p50']:.1f}", f"{load['latency_ms_p99']:.1f}", str(health["probes"]),
                          str(health["missed"]), f"{health['latency_ms_p99']:.1f}", f"{health['latency_ms_max']:.1f}")
        console.print(table)
        met = "[green]met[/green]" if r["ratio_met"] else "[red]missed[/red]"
        console.print(f"hostile / clean throughput {r['ratio']:.3f} (target ≥ {r['target_ratio']:.2f}: {met}); "
                      f"watches open at most {mix['watches_open_max']} of {watches} (server limit "
                      f"{r['server']['watch_limit']}, {r['server']['max_watches_per_token']} per token), "
                      f"{mix['watch_refusals']} refusals; oversized {mix['oversized_codes']}; "
                      f"garbage {mix['garbage_codes']}; dispatched {r['dispatch']['dispatched_unique']} of "
                      f"{r['dispatch']['accepted']} accepted, {r['dispatch']['duplicates']} duplicates")
        if json_out is not None:
            json_out.parent.mkdir(parents=True, exist_ok=True)
            json_out.write_text(json.dumps(r, indent=2))

    @train.command("routing")
    def train_routing_cmd(
        out: Path = typer.Option(Path("gnn/checkpoints/router.pt"), "--out", help="Checkpoint to write."),
        iterations: int = typer.Option(3, help="DAgger passes (the first follows the teacher)."),
        episodes: int = typer.Option(6, help="Simulated episodes per pass."),
        days: int = typer.Option(5, help="Days per training episode."),
        epochs: int = typer.Option(6, help="Passes over the collected decisions after each DAgger pass."),
        seed: int = typer.Option(0),
        layers: int = typer.Option(1, help="GATv2 layers."),
        traces: Path | None = typer.Option(None, "--traces", help="Shared traces folder."),
    ) -> None:
        """Train the GNN router on simulated federations (training regions, Jan-Oct, trace days 0-18)."""
        import torch
        from rich.progress import Progress

        from global_scheduler.routing_training import TrainConfig, train_routing

        torch.set_num_threads(1)
        tc = TrainConfig(iterations=iterations, episodes_per_iteration=episodes, days=days, epochs=epochs, seed=seed,
                         layers=layers)
        with Progress(console=console) as progress:
            task = progress.add_task("training", total=1.0)
            meta = train_routing(tc, traces or _traces_default(), out,
                                 progress=lambda msg, frac: progress.update(task, completed=frac, description=msg))
        console.print(f"checkpoint written to {out}")
        console.print(meta["history"])
