"""CLI commands contributed to ``meridian`` through the ``meridian.cli`` entry point.

Operators: ``submit``, ``get``, ``ls``, ``watch``, ``cancel``, ``clusters`` (they speak to the API at
``--api`` / ``$MERIDIAN_API``, with ``--token`` / ``$MERIDIAN_TOKEN``); ``global-scheduler`` serves
the API. Benchmarks: ``bench routing`` and ``bench api`` (the carbon lower bound is an experiment:
``python -m experiments.carbon_bound``). Training: ``train routing``.

Each command group is a module of its own (``cli_workloads``, ``cli_serve``, ``cli_bench``, ``cli_train``, and
what they share in ``cli_common``); none imports a heavy library until its command runs.
"""

from __future__ import annotations

from global_scheduler import cli_bench, cli_serve, cli_train, cli_workloads
from meridian.cli import CliRoot


def register(cli: CliRoot) -> None:
    """Add this component's commands to the ``meridian`` CLI."""
    cli_workloads.register(cli)
    cli_serve.register(cli)
    cli_bench.register(cli)
    cli_train.register(cli)
