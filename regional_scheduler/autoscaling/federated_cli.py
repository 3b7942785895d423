"""``meridian train federated`` and ``meridian bench federated``: the autoscaling forecaster trained across
regions on Flower (:mod:`.federated`), each region on its own request series."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from meridian.cli import CliRoot

console = Console()

REGIONS_HELP = ("Regions: 'all', a count (the first N shared request series), or comma-separated series names "
                "(lora, nasa, twitter, wikipedia); each region trains on its own series.")


def _regions(spec: str, traces: Path | None) -> list[Any]:
    from meridian.traces import locate_traces
    from regional_scheduler.autoscaling.federated import region_data
    from regional_scheduler.autoscaling.request_series import shared_series_paths

    paths = {p.name.split("_")[0]: p for p in shared_series_paths(traces or locate_traces().path)}
    if spec == "all":
        names = sorted(paths)
    elif spec.isdigit():
        if not 2 <= int(spec) <= len(paths):
            raise typer.BadParameter(f"between 2 and {len(paths)} regions (one per shared series)",
                                     param_hint="--regions")
        names = sorted(paths)[: int(spec)]
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = sorted(set(names) - set(paths))
        if unknown or len(names) < 2:
            raise typer.BadParameter(f"unknown {unknown}; known: {', '.join(sorted(paths))} (at least 2)",
                                     param_hint="--regions")
    return [region_data(paths[n], n) for n in names]


def _run(regions: list[Any], *, rounds: int, steps: int, strategy: str, mu: float, seed: int) -> Any:
    from regional_scheduler.autoscaling.federated import compare

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(f"{strategy}: {len(regions)} regions", total=rounds)
        comparison, result = compare(regions, rounds=rounds, steps_per_round=steps, strategy=strategy,
                                     proximal_mu=mu, seed=seed,
                                     on_round=lambda s: progress.update(task, completed=s.round))
    return comparison, result


def _table(title: str, comparison: Any) -> Table:
    table = Table(title=title)
    for col in ("region", "untrained", "local", "federated", "federated + fine-tune", "central"):
        table.add_column(col, justify="right")
    for name, v in comparison.regions.items():
        table.add_row(name, *(f"{v[k]:.4f}" for k in ("untrained", "local", "federated", "federated_finetuned",
                                                       "central")))
    t = comparison.totals
    table.add_row("mean", *(f"{t[k]:.4f}" for k in ("untrained", "local", "federated", "federated_finetuned",
                                                     "central")))
    return table


def train_federated(
    model: str = typer.Option("autoscaling", "--model", help="autoscaling (the quantile forecaster)."),
    regions: str = typer.Option("all", "--regions", help=REGIONS_HELP),
    rounds: int = typer.Option(20, "--rounds", min=1),
    steps: int = typer.Option(25, "--steps-per-round", min=1, help="Optimiser steps per region per round."),
    strategy: str = typer.Option("fedavg", "--strategy", help="fedavg or fedprox."),
    mu: float = typer.Option(0.1, "--proximal-mu", min=0.0, help="FedProx's proximal weight."),
    seed: int = typer.Option(0, "--seed"),
    traces: Path | None = typer.Option(None, "--traces", help="Shared traces (default: ../shared/traces)."),
    out: Path = typer.Option(Path("bench-out/federated-autoscaling.npz"), "--out",
                             help="Where the federated weights go (numpy .npz, with the run's settings)."),
) -> None:
    """Train the autoscaling forecaster across regions on Flower: only weights leave a region."""
    import numpy as np

    if model != "autoscaling":
        raise typer.BadParameter("only 'autoscaling' is federated so far (the placement correction is not)",
                                 param_hint="--model")
    if strategy not in ("fedavg", "fedprox"):
        raise typer.BadParameter("fedavg or fedprox", param_hint="--strategy")
    data = _regions(regions, traces)
    comparison, result = _run(data, rounds=rounds, steps=steps, strategy=strategy, mu=mu, seed=seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, weights=result.parameters[0], regions=np.array([r.name for r in data]),
             rounds=rounds, steps_per_round=steps, strategy=strategy, proximal_mu=mu, seed=seed)
    console.print(_table(f"held-back mean pinball loss per region ({strategy}, {rounds} rounds)", comparison))
    console.print(f"weights: {out}; refused updates: {comparison.refused_updates}")


def bench_federated(
    regions: str = typer.Option("2,4", "--region-counts", help="Comma-separated region counts to run (2 to 4)."),
    rounds: int = typer.Option(20, "--rounds", min=1),
    steps: int = typer.Option(25, "--steps-per-round", min=1),
    strategy: str = typer.Option("fedavg", "--strategy", help="fedavg or fedprox."),
    mu: float = typer.Option(0.1, "--proximal-mu", min=0.0),
    seed: int = typer.Option(0, "--seed"),
    traces: Path | None = typer.Option(None, "--traces"),
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON here."),
) -> None:
    """Local vs federated vs central forecasters on every region's held-back days, for each region count."""
    results: dict[str, Any] = {}
    for count in [c.strip() for c in regions.split(",") if c.strip()]:
        data = _regions(count, traces)
        comparison, _ = _run(data, rounds=rounds, steps=steps, strategy=strategy, mu=mu, seed=seed)
        console.print(_table(f"{count} regions, {strategy}, {rounds} rounds: held-back mean pinball loss", comparison))
        per_round = comparison.rounds
        console.print(f"per round: {sum(r.wall_s for r in per_round) / max(len(per_round), 1):.2f} s, "
                      f"{per_round[0].bytes_to_server if per_round else 0:,} bytes to the server and as many back")
        results[count] = comparison.as_dict()
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"strategy": strategy, "rounds": rounds, "steps_per_round": steps,
                                        "seed": seed, "runs": results}, indent=2) + "\n")


def register(cli: CliRoot) -> None:
    cli.train.command("federated")(train_federated)
    cli.bench.command("federated")(bench_federated)
