"""What the global scheduler's commands share: the API's connection options and the helpers that speak to it,
the federation window of the routing benches, the ``-o`` formats and the console they print to.

``experiments/carbon_bound.py`` shares the window options and their error handling with ``bench routing``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.console import Console

console = Console(width=None if Console().is_terminal else 160)  # tables whole in logs and pipes

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


def traces_default() -> Path:
    """``$MERIDIAN_TRACES``, else ``../shared/traces`` beside the project (meridian.traces.locate_traces)."""
    from meridian.traces import TracesNotFoundError, locate_traces

    try:
        return locate_traces().path
    except TracesNotFoundError as exc:
        raise typer.BadParameter(str(exc), param_hint="--traces") from None


def window(*, start: str, days: int, clusters: int, seed: int, traces: Path | None, carbon: Path | None,
            prices: Path | None) -> tuple[Any, Path]:
    """The federation window the routing benches share (their six window options), and the traces folder."""
    from global_scheduler.bench_routing import bench_config

    traces_dir = traces or traces_default()
    try:
        return bench_config(start=start, days=days, clusters=clusters, seed=seed, traces_dir=traces_dir,
                            carbon_dir=carbon, prices_file=prices), traces_dir
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def series_error(exc: KeyError) -> typer.BadParameter:
    """A region whose zone or price area the given series lack, or a window outside them."""
    return typer.BadParameter(str(exc.args[0] if exc.args else exc), param_hint="--carbon/--prices/--start")


def config_json(cfg: Any) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.__dict__.items()}


def api_client(api: str | None, token: str | None, ca: Path | None):
    from global_scheduler.client import GlobalClient

    return GlobalClient(api, token=token, root_certificates=ca.read_bytes() if ca else None)


def rpc_error(exc: Exception) -> None:
    import grpc

    if isinstance(exc, grpc.RpcError):
        from global_scheduler.errors import error_details

        typer.echo(f"error: {error_details(exc).describe()}", err=True)  # one line, as meridian.errors
        raise typer.Exit(2) from None
    raise exc


OUTPUT_OPT = typer.Option("table", "--output", "-o", help="table | wide | json | yaml | name")
REF_HELP = "The workload's ID, a unique prefix of it, or its name."
WORKLOAD_TENANT_OPT = typer.Option("", "--tenant", help="Look the name or ID prefix up in this tenant only.")


def output_format(output: str) -> str:
    """The ``-o`` value, or a one-line error and exit 2, before anything is asked of the server."""
    from global_scheduler.cli_output import OutputFormatError, check_output_format

    try:
        return check_output_format(output)
    except OutputFormatError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None


def terminal_width() -> int | None:
    """The terminal's width, to which a table's MESSAGE is cut; None in a pipe (nothing is cut)."""
    return console.width if console.is_terminal else None


def print_workloads(items: list[Any], output: str, *, as_list: bool = False, hide: tuple[str, ...] = ()) -> None:
    """The workloads in an ``-o`` format (global_scheduler/cli_output.py): one message, or a list for ``ls``;
    ``hide`` names table columns a filter makes redundant."""
    from global_scheduler.cli_output import render_workloads

    output = output_format(output)
    if not items and output in ("table", "wide"):
        typer.echo("No workloads found.", err=True)
        return
    text = render_workloads(items, output, as_list=as_list, width=terminal_width(), hide=hide)
    if text:
        typer.echo(text)


def resolve(client: Any, ref: str, tenant: str) -> Any:
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
        rpc_error(exc)

