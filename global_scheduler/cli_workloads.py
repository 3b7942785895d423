"""The operators' commands: ``submit``, ``get``, ``ls``, ``watch``, ``cancel`` and ``clusters``, which speak to the
global API at ``--api`` / ``$MERIDIAN_API`` with ``--token`` / ``$MERIDIAN_TOKEN``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

from global_scheduler.cli_common import (
    API_OPT,
    CA_OPT,
    OUTPUT_OPT,
    REF_HELP,
    TOKEN_OPT,
    WORKLOAD_TENANT_OPT,
    api_client,
    output_format,
    print_workloads,
    resolve,
    rpc_error,
    terminal_width,
)
from meridian.cli import CliRoot


def submit(file: Path = typer.Argument(..., exists=True, dir_okay=False, help="Workload YAML."),
           idempotency_key: str = typer.Option("", "--idempotency-key", help="Overrides the file's key."),
           output: str = OUTPUT_OPT,
           api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
    """Submit a workload described in FILE.yaml (checked here as the API checks it: one line per problem).

    Warns when the tenant already has a workload of that name that has not ended: names are how
    ``get``, ``watch`` and ``cancel`` find a workload, so a second one makes them ambiguous."""
    from global_scheduler.workload_file import WorkloadFileError, load_workload_file

    output = output_format(output)  # an unknown -o is refused before anything is submitted
    try:
        spec, key = load_workload_file(file)
    except WorkloadFileError as exc:
        for problem in exc.problems:
            typer.echo(problem, err=True)
        raise typer.Exit(2) from None
    with api_client(api, token, ca) as client:
        try:
            w = client.submit(spec, idempotency_key or key)
            others = client.find_active_by_name(w.spec.name, w.spec.tenant, exclude_id=w.id)
        except Exception as exc:
            rpc_error(exc)
        if others:
            typer.echo(f"warning: tenant {w.spec.tenant} already has {w.spec.name!r} not ended: "
                       + ", ".join(o.id for o in others) + "; refer to them by ID", err=True)
    print_workloads([w], output)


def get(workload_ref: str = typer.Argument(..., metavar="ID|NAME", help=REF_HELP),
        tenant: str = WORKLOAD_TENANT_OPT, output: str = OUTPUT_OPT,
        api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
    """Show one workload."""
    output = output_format(output)
    with api_client(api, token, ca) as client:
        w = resolve(client, workload_ref, tenant)
    print_workloads([w], output)


def ls(tenant: str = typer.Option("", help="Only this tenant."),
       state: str = typer.Option("", help="Only this state (pending, dispatched, scheduled, running, failed, cancelled)."),
       cluster: str = typer.Option("", help="Only this cluster."),
       limit: int = typer.Option(100, min=0, help="At most this many rows (0 = every page)."),
       output: str = OUTPUT_OPT,
       api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
    """List workloads (following page tokens, up to --limit)."""
    from protos import global_api_pb2 as pb

    output = output_format(output)
    state_value = 0
    if state:
        try:
            state_value = pb.WorkloadState.Value("WORKLOAD_STATE_" + state.upper())
        except ValueError:
            raise typer.BadParameter(f"unknown state {state!r}", param_hint="--state") from None
    items = []
    with api_client(api, token, ca) as client:
        try:
            for w in client.list(tenant=tenant, state=state_value, cluster=cluster,
                                 page_size=min(limit, 1000) if limit else 1000):
                items.append(w)
                if limit and len(items) >= limit:
                    break
        except Exception as exc:
            rpc_error(exc)
    print_workloads(items, output, as_list=True, hide=("TENANT",) if tenant else ())


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

    output = output_format(output)
    try:
        goal = parse_state(until) if until else None
    except ValueError as exc:
        typer.echo(f"error: --until: {exc}", err=True)
        raise typer.Exit(2) from None
    err_console = Console(stderr=True)

    def reconnecting(why: str, delay_s: float) -> None:
        err_console.print(f"[yellow]watch interrupted ({why[:200]}); reconnecting in {delay_s:.1f} s[/yellow]")

    last, shown = None, None
    with api_client(api, token, ca) as client:
        wid = resolve(client, workload_ref, tenant).id
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
                rpc_error(client.explain(exc))
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


def cancel(workload_ref: str = typer.Argument(..., metavar="ID|NAME", help=REF_HELP),
           tenant: str = WORKLOAD_TENANT_OPT, output: str = OUTPUT_OPT,
           api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
    """Cancel a workload (its cluster releases it)."""
    output = output_format(output)
    with api_client(api, token, ca) as client:
        wid = resolve(client, workload_ref, tenant).id
        try:
            w = client.cancel(wid)
        except Exception as exc:
            rpc_error(exc)
    print_workloads([w], output)


def clusters(output: str = OUTPUT_OPT,
             api: str | None = API_OPT, token: str | None = TOKEN_OPT, ca: Path | None = CA_OPT) -> None:
    """The clusters the global scheduler knows, with free capacity and grid intensity."""
    from global_scheduler.cli_output import render_clusters

    output = output_format(output)
    with api_client(api, token, ca) as client:
        try:
            items = client.clusters()
        except Exception as exc:
            rpc_error(exc)
    if not items and output in ("table", "wide"):
        typer.echo("No clusters have reported.", err=True)
        return
    text = render_clusters(items, output, width=terminal_width())
    if text:
        typer.echo(text)


def register(cli: CliRoot) -> None:
    """Add ``submit``, ``get``, ``ls``, ``watch``, ``cancel`` and ``clusters`` to the ``meridian`` CLI."""
    cli.app.command("submit")(submit)
    cli.app.command("get")(get)
    cli.app.command("ls")(ls)
    cli.app.command("watch")(watch)
    cli.app.command("cancel")(cancel)
    cli.app.command("clusters")(clusters)
