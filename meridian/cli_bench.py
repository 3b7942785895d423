"""``meridian bench cli``: how long ``meridian`` takes to start, beside a bare Python.

Every ``meridian`` command first builds the whole command tree: each component's ``register``
(the ``meridian.cli`` entry points) runs and imports its CLI module. An operator's ``meridian ls``
pays for all of them, so those modules import heavy libraries only inside the commands that use
them (tests/cli/test_cli_startup.py names the module that breaks this).

The benchmark runs each command as a fresh subprocess, the same way the ``meridian`` console
script does (``from meridian.cli import main``), ``--repeat`` times. The commands take turns within
each round (the order rotating from round to round), so load on a shared machine falls on all of
them alike; one unrecorded round first warms the page cache and the bytecode cache. It reports the
median, the 90th percentile (nearest rank) and the fastest run, and the median over the
``python -c pass`` baseline measured in the same run: the part that is Meridian's. A last run of
each command under ``-X importtime`` lists any of :data:`HEAVY_MODULES` it imported.

Imports only the standard library, typer and rich: this module is registered on every start too.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import typer

# Libraries no command may import while the CLI is built (each costs 0.1-2 s to import).
HEAVY_MODULES = ("torch", "torch_geometric", "scipy", "matplotlib", "pandas", "sklearn", "numpy", "kubernetes")

# What the ``meridian`` console script runs; ``-c`` keeps the current directory first on sys.path.
MERIDIAN_MAIN = "import sys; from meridian.cli import main; sys.argv[0] = 'meridian'; sys.exit(main())"
BASELINE = "python -c pass"
MERIDIAN_COMMANDS: tuple[tuple[str, ...], ...] = (("--help",), ("ls", "--help"), ("clusters", "--help"), ("version",))


@dataclass
class StartupCase:
    """One command line, timed as a subprocess."""

    label: str
    argv: list[str]
    samples_s: list[float] = field(default_factory=list)
    heavy_modules: list[str] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return 1000 * statistics.median(self.samples_s)

    @property
    def p90_ms(self) -> float:
        ranked = sorted(self.samples_s)
        return 1000 * ranked[math.ceil(0.9 * len(ranked)) - 1]

    @property
    def min_ms(self) -> float:
        return 1000 * min(self.samples_s)


def startup_cases(python: str = sys.executable) -> list[StartupCase]:
    """The baseline first, then each ``meridian`` command."""
    cases = [StartupCase(BASELINE, [python, "-c", "pass"])]
    cases += [StartupCase("meridian " + " ".join(args), [python, "-c", MERIDIAN_MAIN, *args])
              for args in MERIDIAN_COMMANDS]
    return cases


def time_once(argv: list[str]) -> float:
    """Wall seconds of one run; a command that fails stops the benchmark with its output."""
    started = time.perf_counter()
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {done.returncode}: {(done.stderr or done.stdout)[-2000:]}")
    return elapsed


def heavy_imports(argv: list[str]) -> list[str]:
    """Which of :data:`HEAVY_MODULES` the command imports (one run under ``-X importtime``)."""
    done = subprocess.run([argv[0], "-X", "importtime", *argv[1:]], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, check=False)
    found = set()
    for line in done.stderr.splitlines():
        # "import time:  self [us] | cumulative | imported package"
        if line.startswith("import time:") and line.count("|") == 2:
            top = line.rsplit("|", 1)[1].strip().split(".")[0]
            if top in HEAVY_MODULES:
                found.add(top)
    return sorted(found)


def run_startup_bench(cases: list[StartupCase], *, repeat: int, warmup: int = 1) -> list[StartupCase]:
    """Time every case ``repeat`` times, round-robin, after ``warmup`` unrecorded rounds."""
    for round_index in range(warmup + repeat):
        shift = round_index % len(cases)
        for case in cases[shift:] + cases[:shift]:
            elapsed = time_once(case.argv)
            if round_index >= warmup:
                case.samples_s.append(elapsed)
    for case in cases[1:]:
        case.heavy_modules = heavy_imports(case.argv)
    return cases


def bench_cli(
    repeat: int = typer.Option(10, "--repeat", "-n", min=1, help="Timed runs of each command."),
    warmup: int = typer.Option(1, "--warmup", min=0, help="Unrecorded rounds first (page and bytecode caches)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the figures and every sample here."),
) -> None:
    """Start-up time of meridian --help, ls --help, clusters --help and version, beside python -c pass."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=None if Console().is_terminal else 140)
    load_before = os.getloadavg()[0]
    try:
        with console.status(f"timing {len(MERIDIAN_COMMANDS) + 1} commands × {repeat} runs …"):
            cases = run_startup_bench(startup_cases(), repeat=repeat, warmup=warmup)
    except RuntimeError as exc:
        console.print(f"[red]error:[/red] {exc}", highlight=False, markup=False)
        raise typer.Exit(1) from None
    baseline_ms = cases[0].median_ms
    table = Table(title=f"meridian bench cli — {repeat} run(s) each, {os.cpu_count()} CPUs, "
                        f"load {load_before:.2f} → {os.getloadavg()[0]:.2f}")
    for col in ("command", "median ms", "p90 ms", "min ms", "median − baseline ms", "heavy imports"):
        table.add_column(col, justify="left" if col in ("command", "heavy imports") else "right")
    for case in cases:
        over = "–" if case is cases[0] else f"{case.median_ms - baseline_ms:.0f}"
        heavy = "–" if case is cases[0] else (", ".join(case.heavy_modules) or "none")
        table.add_row(case.label, f"{case.median_ms:.0f}", f"{case.p90_ms:.0f}", f"{case.min_ms:.0f}", over, heavy)
    console.print(table)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({
            "repeat": repeat, "warmup": warmup, "python": platform.python_version(), "cpus": os.cpu_count(),
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "commands": {case.label: {
                "argv": case.argv[1:], "median_ms": round(case.median_ms, 1), "p90_ms": round(case.p90_ms, 1),
                "min_ms": round(case.min_ms, 1),
                "median_over_baseline_ms": None if case is cases[0] else round(case.median_ms - baseline_ms, 1),
                "heavy_modules": None if case is cases[0] else case.heavy_modules,
                "samples_ms": [round(1000 * s, 1) for s in case.samples_s]} for case in cases},
        }, indent=2) + "\n")
        console.print(f"wrote {json_out}")
