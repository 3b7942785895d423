"""``meridian train routing``: train the GNN router on simulated federations."""

from __future__ import annotations

from pathlib import Path

import typer

from global_scheduler.cli_common import console, traces_default
from meridian.cli import CliRoot


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
        meta = train_routing(tc, traces or traces_default(), out,
                             progress=lambda msg, frac: progress.update(task, completed=frac, description=msg))
    console.print(f"checkpoint written to {out}")
    console.print(meta["history"])


def register(cli: CliRoot) -> None:
    """Add ``train routing`` to the ``meridian`` CLI."""
    cli.train.command("routing")(train_routing_cmd)
