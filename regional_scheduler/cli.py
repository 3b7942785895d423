"""The regional scheduler's CLI commands (``meridian bench placement``, ``bench kubernetes``, …).

Registering them runs on every ``meridian`` start, so this module imports only typer, rich and the
policy registry's names; each command imports its benchmark (numpy, scipy, kubernetes, torch) when
it runs (tests/cli/test_cli_startup.py holds that).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meridian.cli import CliRoot
from regional_scheduler.policies.registry import BASELINES, REGISTRY

console = Console(width=None if Console().is_terminal else 160)


def _fmt(value: object, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def bench_placement(
    scenario: str = typer.Option("openb", help="openb | timeline | seed-50x200"),
    pods: Path | None = typer.Option(None, "--pods", help="openb pod list CSV (default: openb_pod_list_default.csv)"),
    nodes: Path | None = typer.Option(None, "--nodes", help="openb node list CSV (default: the 1,213 GPU nodes)"),
    policies: str = typer.Option(",".join(BASELINES), help="comma-separated policy names"),
    seeds: int = typer.Option(10, min=1, help="number of seeds (openb: 42, 43, …; seed-50x200: 0, 1, …)"),
    json_out: Path | None = typer.Option(None, "--json", help="write the results here"),
    paper: bool = typer.Option(False, "--paper/--online", help="--online (default): a policy sees only the pods "
                               "placed so far, as in a live scheduler; --paper: the FGD paper's protocol, the "
                               "target workload's distribution stated before the run (reported as such)"),
) -> None:
    """Place the same workload with every policy and compare GPU allocation, fragmentation and speed."""
    from regional_scheduler import bench_placement as bp

    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        if name not in REGISTRY:
            raise typer.BadParameter(str(REGISTRY.error(name)), param_hint="--policies")
    from meridian.traces import TracesNotFoundError

    try:
        inp = bp.load_input(scenario, pods_csv=pods, nodes_csv=nodes)
    except TracesNotFoundError:
        raise  # one line naming the folder and $MERIDIAN_TRACES (meridian.errors), not a usage error
    except (ValueError, OSError) as exc:
        raise typer.BadParameter(str(exc)) from exc
    seed_list = bp.seeds_for(scenario, seeds)
    total_gpus = sum(n.allocatable_resources.gpu for n in inp.nodes)
    results: dict[str, list] = {name: [] for name in names}
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        for seed in seed_list:
            steps = bp.n_steps(inp, seed)
            for name in names:
                label = f"{scenario} seed {seed} {name}"
                # Until the first pod: preparing (the paper protocol fills FGD's cache for the workload).
                task = progress.add_task(f"{label} (preparing)", total=steps)
                results[name].append(bp.run_one(inp, name, seed, paper=paper,
                                                on_step=lambda i, t=task, d=label: progress.update(
                                                    t, completed=i + 1, description=d)))
                progress.remove_task(task)
    summary = {name: bp.summarize(runs, total_gpus) for name, runs in results.items()}
    protocol = "paper protocol: the workload's distribution stated" if paper else "online: the past only"
    table = Table(title=f"meridian bench placement — {scenario} ({protocol}), {len(seed_list)} seed(s)")
    for col in ("policy", "GPU alloc @100%", "unalloc GPUs", "in shared GPUs", "share bound", "frag GPU %", "fail rate", "CPU alloc %",
                "frag (gini)", "util var", "p50 ms", "p99 ms", "s/seed"):
        table.add_column(col, justify="right" if col != "policy" else "left")
    for name, s in summary.items():
        table.add_row(name, _fmt(s["gpu_alloc_pct_at_100"]), _fmt(s["unallocated_gpus_at_100"], 0),
                      _fmt(s["idle_partial_gpus_at_100"], 0), _fmt(s["share_idle_bound_gpus_at_100"], 0),
                      _fmt(s["frag_gpu_pct_at_100"]), _fmt(s["failure_rate"], 4), _fmt(s["cpu_alloc_pct"]),
                      _fmt(s["frag_gini"]), _fmt(s["util_variance"], 4), _fmt(s["decision_ms_p50"], 3),
                      _fmt(s["decision_ms_p99"], 3), _fmt(s["wall_s_per_seed"], 1))
    console.print(table)
    if any(s["share_idle_bound_gpus_at_100"] is not None for s in summary.values()):
        console.print("in shared GPUs: unallocated capacity on GPUs partly in use; share bound: the least of it any "
                      "packing of the same placed GPU shares must leave (an LP bound), so the difference is what a "
                      "better placement of them could still win")
    for name, s in summary.items():
        if s.get("over_budget_decisions") is not None:  # the learned policy: budget counted, not enforced
            console.print(f"{name}: {s['over_budget_decisions']:.0f} decision(s) over the serving budget "
                          f"(serving would have used FGD's), {s['fallback_decisions']:.0f} fallback(s)")
        if s.get("gated_to_fgd_seeds"):
            console.print(f"{name}: on {s['gated_to_fgd_seeds']:.0f} of {len(s['seeds'])} seed(s) the workload's "
                          "GPU-model-constrained share reached the profile's gate_share, so FGD placed every pod")
    if json_out is not None:
        bp.write_json(json_out, {
            "scenario": scenario, "pods": str(pods) if pods else None, "nodes": str(nodes) if nodes else None,
            "seeds": seed_list, "protocol": "paper" if paper else "online", "online": not paper, "wall_s": time.perf_counter() - t0, "policies": summary,
        })
        console.print(f"wrote {json_out}")


class _RichProgress:
    """``bench_kubernetes.ProgressSink`` on a rich progress bar."""

    def __init__(self, progress: Any) -> None:
        self.progress = progress

    def begin(self, description: str, total: int) -> Any:
        return self.progress.add_task(description, total=total)

    def update(self, task: Any, completed: int, description: str | None = None) -> None:
        if description is None:
            self.progress.update(task, completed=completed)
        else:
            self.progress.update(task, completed=completed, description=description)

    def end(self, task: Any) -> None:
        self.progress.stop_task(task)


def bench_kubernetes_command(
    nodes: int | None = typer.Option(None, "--nodes", min=1, help="Nodes (default per mix: synthetic 1000, "
                                     "seed-50x200 50, openb all 1,213)"),
    pods: int | None = typer.Option(None, "--pods", min=1, help="backlog pods (default per mix: synthetic 5000, "
                                    "seed-50x200 200, openb the default list's 8,152)"),
    mix: str = typer.Option("synthetic", help="synthetic | seed-50x200 | openb"),
    seed: int = typer.Option(0, min=0, help="seed of the generated pod shapes (synthetic, seed-50x200)"),
    qps: float = typer.Option(50.0, help="client QPS of every scheduler (kube-scheduler's default 50)"),
    burst: int = typer.Option(100, min=1, help="client burst of every scheduler (kube-scheduler's default 100)"),
    # bench_kubernetes.KUBE_SCHEDULER first, as a literal: that module imports kubernetes and numpy.
    schedulers: str = typer.Option("kube-scheduler,meridian-fgd", help="comma-separated, run in turn: "
                                   "kube-scheduler, meridian-<policy> (meridian-fgd, meridian-learned, …)"),
    json_out: Path | None = typer.Option(None, "--json", help="write the results here"),
    timeout: float = typer.Option(1800.0, "--timeout", help="seconds a scheduler may take over its backlog"),
    idle: float = typer.Option(15.0, "--idle", help="seconds without a new binding that end a scheduler's run"),
) -> None:
    """Bind the same backlog with kube-scheduler and Meridian in turn on a real API server; compare
    throughput, latency, CPU and the feasibility of every binding."""
    from rich.markup import escape

    from regional_scheduler import bench_kubernetes as bk

    console = Console(width=None if Console().is_terminal else 180)
    if mix not in bk.MIXES:
        raise typer.BadParameter(f"unknown mix {mix!r}; choose {', '.join(bk.MIXES)}", param_hint="--mix")
    try:
        names = bk.parse_schedulers(schedulers)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--schedulers") from None
    settings = bk.BenchKubernetesSettings(mix=mix, nodes=nodes, pods=pods, seed=seed, qps=qps, burst=burst,
                                          schedulers=names, timeout_s=timeout, idle_s=idle)
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as bar:
            report = bk.run_benchmark(settings, progress=_RichProgress(bar))
    except bk.BenchError as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)  # log tails hold brackets
        raise typer.Exit(2) from None
    console.print(bk.render_table(report))
    for name, r in report.schedulers.items():
        if r.unschedulable_reasons:
            reasons = ", ".join(f"{k} ×{v}" for k, v in r.unschedulable_reasons.items())
            console.print(f"{name} unschedulable ({r.failed_scheduling_reports} FailedScheduling reports): {reasons}",
                          highlight=False)
        if r.foreign_cpu_s > 0.1 * max(r.wall_s, 1.0):
            console.print(f"{name}: other processes used {r.foreign_cpu_s:.0f} CPU s during its {r.wall_s:.0f} s run "
                          "(the machine was shared: its figures are noisy)", highlight=False)
        if r.infeasible_reasons:
            console.print(f"{name} infeasible bindings: "
                          + ", ".join(f"{k} ×{v}" for k, v in r.infeasible_reasons.items()), highlight=False)
    if json_out is not None:
        bk.write_json(json_out, report)
        console.print(f"wrote {json_out}")


def register(cli: CliRoot) -> None:
    from regional_scheduler.kube_cli import regional_scheduler_command
    from regional_scheduler.learned.commands import TRAIN_PLACEMENT_CONTEXT, explain_command, train_placement

    cli.bench.command("placement")(bench_placement)
    cli.bench.command("kubernetes")(bench_kubernetes_command)
    cli.train.command("placement", context_settings=TRAIN_PLACEMENT_CONTEXT)(train_placement)
    cli.app.command("explain")(explain_command)
    cli.app.command("regional-scheduler")(regional_scheduler_command)
