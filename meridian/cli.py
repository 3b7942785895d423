"""The ``meridian`` command line.

The core owns the root command and its groups (``bench``, ``train``, ``report``); component
packages contribute their commands through the ``meridian.cli`` entry-point group declared in
``pyproject.toml``. Each entry point is a ``register(cli: CliRoot) -> None`` function. This keeps
the dependency arrow pointing one way (components → core) while still giving operators one tool.

Every command builds the whole tree first, so a ``register`` and the module it lives in import only
what the options need (typer, rich, names and defaults); heavy libraries are imported inside the
commands that use them. ``meridian bench cli`` measures the start-up and
tests/cli/test_cli_startup.py names any entry point that imports torch, scipy, matplotlib, numpy
or kubernetes while registering.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from importlib.metadata import entry_points

import typer
from typer.core import TyperGroup

from meridian import __version__
from meridian.cli_bench import bench_cli
from meridian.errors import USER_ERROR_EXIT, describe


@dataclass(frozen=True)
class CliRoot:
    """The command groups a component may add commands to."""

    app: typer.Typer
    bench: typer.Typer
    train: typer.Typer
    report: typer.Typer


class RootGroup(TyperGroup):
    """The root command: an everyday mistake that reaches it (:func:`meridian.errors.describe`) is one line,
    ``error: …; what to do next`` on stderr with exit status 2; ``--verbose`` shows the traceback instead."""

    def invoke(self, ctx: typer.Context) -> object:
        try:
            return super().invoke(ctx)
        except Exception as exc:  # click's own exits (typer.Exit, usage errors) are described as None
            problem = describe(exc)
            if problem is None or ctx.params.get("verbose"):
                raise
            typer.echo(f"error: {problem}", err=True)
            raise typer.Exit(USER_ERROR_EXIT) from None


def build_app() -> typer.Typer:
    app = typer.Typer(
        cls=RootGroup,
        name="meridian",
        help="Meridian: multi-cluster Kubernetes scheduling with learned placement and carbon-aware routing.",
        no_args_is_help=True,
        pretty_exceptions_show_locals=False,
    )
    bench = typer.Typer(help="Benchmarks: print a table and optionally write JSON.", no_args_is_help=True)
    train = typer.Typer(help="Train learned policies and write checkpoints.", no_args_is_help=True)
    report = typer.Typer(help="Reports over saved runs or a live system.", no_args_is_help=True)
    app.add_typer(bench, name="bench")
    app.add_typer(train, name="train")
    app.add_typer(report, name="report")

    @app.callback()
    def _root(
        verbose: bool = typer.Option(False, "--verbose", "-v", help="Log at DEBUG level, and show the traceback "
                                      "of an error that is otherwise one line."),
    ) -> None:
        logging.basicConfig(
            level=logging.DEBUG if verbose else logging.INFO,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )

    @app.command("version")
    def _version() -> None:
        """Print Meridian's version."""
        typer.echo(__version__)

    bench.command("cli")(bench_cli)

    root = CliRoot(app=app, bench=bench, train=train, report=report)
    for ep in sorted(entry_points(group="meridian.cli"), key=lambda e: e.name):
        register = ep.load()
        register(root)
    return app


def main() -> None:
    build_app()()


if __name__ == "__main__":
    main()
