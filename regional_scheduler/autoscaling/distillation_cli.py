"""``meridian bench distillation`` and ``meridian train distillation``: the autoscaling quantile forecaster
distilled from an MLP teacher into the linear model that is served (:mod:`.distillation`)."""

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

SERIES_HELP = "Series: 'all' or comma-separated shared series names (lora, nasa, twitter, wikipedia)."
STUDENT_HELP = ("The student's hidden layer widths: a tiny MLP with a linear skip, or '' for the linear "
                "22 × 3 model alone.")
MODEL_LABELS = {"teacher": "teacher (MLP)", "student": "student (distilled)",
                "student_direct": "student (direct)"}


def _paths(spec: str, traces: Path | None) -> dict[str, Path]:
    from meridian.traces import locate_traces
    from regional_scheduler.autoscaling.request_series import shared_series_paths

    paths = {p.name.split("_")[0]: p for p in shared_series_paths(traces or locate_traces().path)}
    names = sorted(paths) if spec == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = sorted(set(names) - set(paths))
    if unknown or not names:
        raise typer.BadParameter(f"unknown {unknown}; known: {', '.join(sorted(paths))}", param_hint="--series")
    return {n: paths[n] for n in names}


def _widths(text: str, hint: str, *, allow_empty: bool) -> tuple[int, ...]:
    try:
        widths = tuple(int(h) for h in text.split(",") if h.strip())
    except ValueError as exc:
        raise typer.BadParameter("comma-separated layer widths, e.g. 64,64", param_hint=hint) from exc
    if (not widths and not allow_empty) or (widths and min(widths) < 1):
        raise typer.BadParameter("layer widths ≥ 1" + ("" if allow_empty else ", at least one"), param_hint=hint)
    return widths


def _config(hidden: str, student_hidden: str, teacher_steps: int, student_steps: int, alpha: float, seed: int,
            calibrate: bool, tau_up: float, tau_down: float) -> Any:
    from regional_scheduler.autoscaling.distillation import DistillationConfig
    from regional_scheduler.autoscaling.federated import TAUS

    if not 0.0 <= alpha <= 1.0:
        raise typer.BadParameter("between 0 and 1", param_hint="--alpha")
    for value, hint in ((tau_up, "--tau-up"), (tau_down, "--tau-down")):
        if value not in TAUS:
            raise typer.BadParameter(f"one of {TAUS}", param_hint=hint)
    return DistillationConfig(hidden=_widths(hidden, "--hidden", allow_empty=False),
                              student_hidden=_widths(student_hidden, "--student-hidden", allow_empty=True),
                              teacher_steps=teacher_steps, student_steps=student_steps, alpha=alpha, seed=seed,
                              calibrate=calibrate, tau_up=tau_up, tau_down=tau_down)


def _run(paths: dict[str, Path], config: Any) -> tuple[dict[str, Any], list[Any]]:
    from regional_scheduler.autoscaling.distillation import MODELS, run

    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("distillation", total=len(paths) * (1 + len(MODELS)))
        return run(paths, config, advance=lambda label: progress.update(task, advance=1, description=label))


def _table(summary: dict[str, Any]) -> Table:
    table = Table(title="Distillation: held-back days (violation and replica minutes: the quantile policy "
                        "driven by each forecaster)")
    for col in ("series", "model", "params", "bytes", "p99 decision (ms)", "pinball", "violation min",
                "replica min"):
        table.add_column(col, justify="right")
    rows = [*summary["series"].items(), ("total", summary)]
    for series, metrics in rows:
        for model, label in MODEL_LABELS.items():
            m = metrics[model]
            table.add_row(series, label, f"{m['params']:,}", f"{m['bytes']:,}", f"{m['p99_ms']:.4f}",
                          f"{m['pinball']:.5f}", f"{m['violation_minutes']:,}", f"{m['replica_minutes']:,.0f}")
    return table


def bench_distillation(
    series: str = typer.Option("all", "--series", help=SERIES_HELP),
    hidden: str = typer.Option("64,64", "--hidden", help="The teacher MLP's hidden layer widths."),
    student_hidden: str = typer.Option("16", "--student-hidden", help=STUDENT_HELP),
    teacher_steps: int = typer.Option(3000, "--teacher-steps", min=0),
    student_steps: int = typer.Option(3000, "--student-steps", min=0),
    alpha: float = typer.Option(0.5, "--alpha", help="The teacher's share of the student's loss (1: pure "
                                                     "distillation, 0: the true pinball loss only)."),
    seed: int = typer.Option(0, "--seed"),
    calibrate: bool = typer.Option(True, "--calibrate/--fixed-levels",
                                   help="Budget-match the policy's quantile levels per forecaster on the last "
                                        "training week (as the autoscaling benchmark does), or use "
                                        "--tau-up/--tau-down for all."),
    tau_up: float = typer.Option(0.97, "--tau-up"),
    tau_down: float = typer.Option(0.9, "--tau-down"),
    traces: Path | None = typer.Option(None, "--traces", help="Shared traces (default: ../shared/traces)."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON here."),
) -> None:
    """Teacher vs distilled student vs directly trained student: sizes and quality on held-back days."""
    config = _config(hidden, student_hidden, teacher_steps, student_steps, alpha, seed, calibrate, tau_up,
                     tau_down)
    summary, _ = _run(_paths(series, traces), config)
    console.print(_table(summary))
    ratio = summary["ratio"]
    console.print(f"student / teacher parameters: {ratio['params']:.4f} (1/{1 / ratio['params']:.0f}); "
                  f"violation minutes vs teacher: distilled {ratio['violation_minutes_gap_pct']:+.1f} %, "
                  f"direct {ratio['direct_violation_minutes_gap_pct']:+.1f} %")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(summary, indent=2) + "\n")


def train_distillation(
    series: str = typer.Option("all", "--series", help=SERIES_HELP),
    hidden: str = typer.Option("64,64", "--hidden", help="The teacher MLP's hidden layer widths."),
    student_hidden: str = typer.Option("16", "--student-hidden", help=STUDENT_HELP),
    teacher_steps: int = typer.Option(3000, "--teacher-steps", min=0),
    student_steps: int = typer.Option(3000, "--student-steps", min=0),
    alpha: float = typer.Option(0.5, "--alpha", help="The teacher's share of the student's loss."),
    seed: int = typer.Option(0, "--seed"),
    traces: Path | None = typer.Option(None, "--traces"),
    out: Path = typer.Option(Path("bench-out/distilled-autoscaling.npz"), "--out",
                             help="Where every series' teacher and students go (numpy .npz)."),
) -> None:
    """Train the teacher and distil it into the served linear forecaster, per series (training days only)."""
    from regional_scheduler.autoscaling.distillation import SeriesResult, fit_all, save_weights, series_rows
    from regional_scheduler.autoscaling.scenario import build_scenario

    config = _config(hidden, student_hidden, teacher_steps, student_steps, alpha, seed, False, 0.97, 0.9)
    results = []
    with Progress(console=console, transient=True) as progress:
        paths = _paths(series, traces)
        task = progress.add_task("distillation", total=len(paths))
        for name, path in paths.items():
            fitted = fit_all(series_rows(build_scenario(path), name), config)
            results.append(SeriesResult(name, fitted, {}))
            progress.update(task, advance=1, description=name)
    save_weights(out, results)
    console.print(f"weights: {out} ({', '.join(paths)})")


def register(cli: CliRoot) -> None:
    cli.bench.command("distillation")(bench_distillation)
    cli.train.command("distillation")(train_distillation)
