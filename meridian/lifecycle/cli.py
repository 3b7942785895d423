"""``meridian learn`` (the continual learner: a service, and a one-shot retrain) and ``meridian bench
lifecycle`` (each tier's regime change through the bus, the registry and the gates).

Registered through the ``meridian.cli`` entry point; heavy imports (torch through the tiers, numpy, redis) happen
inside the commands. The tiers are found through the ``meridian.lifecycle`` entry-point group.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meridian.cli import CliRoot

if TYPE_CHECKING:
    from meridian.lifecycle.learner import ContinualLearner

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_ARTIFACTS = Path("~/.local/share/meridian/models")
MODELS = ("placement", "autoscaling", "routing")


def _models(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown or not names:
        raise typer.BadParameter(f"unknown {', '.join(unknown) or 'empty list'}; choose from {', '.join(MODELS)}",
                                 param_hint="--scenarios")
    return names


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _summary_table(report: dict[str, Any]) -> Table:
    table = Table(title="Model lifecycle: regime changes through the bus, the registry and the gates")
    for column in ("scenario", "metric", "detection delay (windows)", "false alarms", "stale", "continual",
                   "oracle", "ends active", "sabotage promoted", "rollback within (windows)", "checks"):
        table.add_column(column, justify="left" if column in ("scenario", "metric", "checks") else "right")
    for name, s in report["scenarios"].items():
        cmp = s["comparison"]
        metric = cmp["metric"]
        delay = s["detection_delay"]["windows"] if s["detection_delay"] else "none"
        promoted = "/".join(f"{v['promoted']} of {v['injected']}" for v in s["sabotage_promotions"].values())
        within = "/".join(str(v["windows"]) if v["rolled_back"] else f"not in {v['windows']}"
                          for v in s["rollback_within"].values())
        failed = [k for k, ok in s["checks"].items() if not ok]
        table.add_row(name, metric, _fmt(delay), _fmt(s["false_alarms"]), _fmt(s["stale"]), _fmt(s["continual"]),
                      _fmt(s["oracle"]), _fmt(cmp["final_active"][metric]), promoted, within,
                      "all pass" if not failed else "failed: " + ", ".join(failed))
    return table


def bench_lifecycle(
    scenarios: str = typer.Option(",".join(MODELS), "--scenarios", help="Which tiers' regime changes, "
                                  "comma-separated: placement, autoscaling, routing."),
    quick: bool = typer.Option(False, "--quick", help="Each tier's small scenario (seconds each)."),
    seed: int = typer.Option(0, "--seed"),
    injections: int = typer.Option(20, "--injections", min=0, help="Sabotaged candidates of each kind."),
    redis_url: str = typer.Option(DEFAULT_REDIS_URL, "--redis", envvar="MERIDIAN_BENCH_REDIS_URL",
                                  help="The Redis the replay runs on (under a private key prefix, removed after)."),
    out_dir: Path = typer.Option(Path("bench-out/lifecycle"), "--out-dir", help="Checkpoints and artifacts."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the report as JSON here."),
) -> None:
    """Regime changes per tier: drift detection delay, stale vs continually retrained vs oracle, sabotaged
    candidates (0 promotions expected) and forced rollbacks."""
    from meridian.lifecycle.bench import LifecycleBenchSettings, run_lifecycle_bench
    from meridian.lifecycle.tiers import lifecycle_for

    lifecycles = {name: lifecycle_for(name) for name in _models(scenarios)}
    # Every registration and transition is in the run's audit stream; a line each would bury the progress bar.
    logging.getLogger("meridian.model_registry").setLevel(logging.WARNING)
    settings = LifecycleBenchSettings(quick=quick, seed=seed, injections=injections)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as bar:
        tasks: dict[str, Any] = {}

        def progress(what: str, done: float, total: float) -> None:
            if what not in tasks:
                tasks[what] = bar.add_task(what, total=total)
            bar.update(tasks[what], completed=done, total=total)

        report = run_lifecycle_bench(lifecycles, redis_url=redis_url, out_dir=out_dir, settings=settings,
                                     progress=progress)
    console = Console() if Console().is_terminal else Console(width=200)
    console.print(_summary_table(report))
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(report, indent=2, sort_keys=True, default=str))
        typer.echo(f"wrote {json_out}")


def _learner(model: str, redis_url: str, artifacts: Path, out_dir: Path, consumer: str,
             retrain_every: int | None, key_prefix: str) -> ContinualLearner:
    from meridian.bus import open_bus
    from meridian.drift import TIER_FEATURES
    from meridian.lifecycle.learner import ContinualLearner, LearnerSettings
    from meridian.lifecycle.tiers import lifecycle_for
    from meridian.model_registry.registry import open_registry

    lifecycle = lifecycle_for(model)
    registry = open_registry(redis_url, artifacts_dir=Path(os.path.expanduser(artifacts)), key_prefix=key_prefix)
    settings = LearnerSettings(consumer=consumer, retrain_every=retrain_every)
    features = TIER_FEATURES[lifecycle.tier]  # live tiers publish their tier's default drift features
    return ContinualLearner(model=model, tier=lifecycle.tier, registry=registry,
                            bus=open_bus(redis_url, key_prefix=key_prefix),
                            retrainer=lifecycle.retrainer(), features=features, out_dir=out_dir,
                            who=f"learner@{consumer}", settings=settings)


MODEL_OPTION = typer.Option(..., "--model", help="placement, routing or autoscaling.")
REDIS_OPTION = typer.Option(DEFAULT_REDIS_URL, "--redis", envvar="MERIDIAN_MODELS_REDIS_URL",
                            help="The bus's Redis: the records' streams and the registry.")
ARTIFACTS_OPTION = typer.Option(DEFAULT_ARTIFACTS, "--artifacts", envvar="MERIDIAN_MODELS_ARTIFACTS",
                                help="The registry's checkpoint store.")
PREFIX_OPTION = typer.Option("", "--key-prefix", envvar="MERIDIAN_MODELS_KEY_PREFIX", hidden=True,
                             help="A prefix for every Redis key (tests).")
OUT_OPTION = typer.Option(Path("~/.local/share/meridian/retrained"), "--out-dir",
                          help="Where retrained checkpoints are written before registration.")


def learn_serve(model: str = MODEL_OPTION, redis_url: str = REDIS_OPTION, artifacts: Path = ARTIFACTS_OPTION,
                out_dir: Path = OUT_OPTION,
                consumer: str = typer.Option("learner-1", "--consumer", help="This learner's consumer name."),
                retrain_every: int | None = typer.Option(None, "--retrain-every", min=1, help="Also retrain every "
                                                         "n windows; default: only on drift."),
                key_prefix: str = PREFIX_OPTION) -> None:
    """Consume MODEL's learning and evaluation records until Ctrl-C: drift, retrain, register, evaluate."""
    from meridian.bus.consumer import run_with_backoff
    from meridian.bus.settings import ConsumerSettings

    learner = _learner(model, redis_url, artifacts, Path(os.path.expanduser(out_dir)), consumer, retrain_every,
                       key_prefix)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    typer.echo(f"learning {model} from {', '.join(learner.bus_streams())} (Ctrl-C to stop)")

    lost_bus = threading.Event()

    def step() -> None:
        if lost_bus.is_set():  # a restarted Redis may have lost the consumer groups
            learner.ensure_groups()
            lost_bus.clear()
        if learner.step(block_ms=1000):
            s = learner.state
            typer.echo(f"records={s.records} drift_alerts={len(s.drift_alerts)} retrains={len(s.retrains)} "
                       f"failed_retrains={s.failed_retrains} dead_lettered={s.dead_lettered}")

    def on_failure(exc: Exception, delay: float) -> None:
        # Unacknowledged records stay pending in the group and are read again once Redis is back.
        lost_bus.set()
        typer.echo(f"bus unavailable ({exc}); retrying in {delay:g} s", err=True)

    with contextlib.suppress(KeyboardInterrupt):
        run_with_backoff(stop, step, delays=ConsumerSettings().backoff_s, on_failure=on_failure)


def learn_once(model: str = MODEL_OPTION, redis_url: str = REDIS_OPTION, artifacts: Path = ARTIFACTS_OPTION,
               out_dir: Path = OUT_OPTION,
               consumer: str = typer.Option("learner-once", "--consumer", help="Consumer name for this run."),
               key_prefix: str = PREFIX_OPTION) -> None:
    """Read MODEL's pending learning records, retrain on them now, register the candidate and start its shadow."""
    from meridian.errors import UserError

    learner = _learner(model, redis_url, artifacts, Path(os.path.expanduser(out_dir)), consumer, None, key_prefix)
    while learner.step():
        pass
    if not learner.window:
        raise UserError(f"no learning records of {model} to train on", hint=f"a tier publishes them on "
                        f"{learner.bus_streams()[0]}; see docs/model-lifecycle.md")
    version = learner.retrain(why="one-shot (meridian learn once)")
    typer.echo(json.dumps(version.model_dump(mode="json"), indent=2, sort_keys=True))


def register(cli: CliRoot) -> None:
    """Add ``meridian learn`` and ``meridian bench lifecycle``."""
    learn = typer.Typer(help="Continual learning: retrain a model from the records its tier publishes, on drift "
                             "or a schedule, and take the result through shadow and canary.", no_args_is_help=True)
    learn.command("serve")(learn_serve)
    learn.command("once")(learn_once)
    cli.app.add_typer(learn, name="learn")
    cli.bench.command("lifecycle")(bench_lifecycle)
