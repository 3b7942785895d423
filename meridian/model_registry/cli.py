"""``meridian models``: the model registry for operators (``ls``, ``show``, ``diff``, ``register``, ``promote``,
``rollback``, ``audit``), each with ``--json``; rich tables otherwise.

Registered through the ``meridian.cli`` entry point. Only typer and rich are imported at registration; the
registry (redis, pydantic, prometheus) is imported by the commands. Registry mistakes (an unknown model or
version, a transition the table forbids, a checkpoint of another feature layout, Redis unreachable) become
one line, ``error: …; what to do next``, through :class:`~meridian.errors.UserError`.
"""

from __future__ import annotations

import getpass
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table

from meridian.cli import CliRoot

if TYPE_CHECKING:
    from meridian.model_registry.registry import ModelRegistry, TransitionResult
    from meridian.model_registry.versions import ModelVersion, TransitionRecord

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"
DEFAULT_ARTIFACTS = Path("~/.local/share/meridian/models")
JSON_HELP = "Print JSON instead of a table."


@dataclass(frozen=True)
class RegistryOptions:
    redis_url: str
    artifacts: Path
    key_prefix: str


def _hint_for(exc: Exception) -> str:
    from meridian.model_registry import registry, validators, versions
    from meridian.model_registry.artifacts import ArtifactDigestError

    hints: list[tuple[type[Exception], str]] = [
        (registry.RegistryUnavailableError, "start Redis there, or point --redis (MERIDIAN_MODELS_REDIS_URL) at a "
                                            "running one"),
        (versions.UnknownModelError, "use placement, routing or autoscaling"),
        (versions.UnknownVersionError, "list the versions with `meridian models ls`"),
        (versions.ForbiddenTransitionError, "see the allowed transitions in docs/model-lifecycle.md"),
        (validators.CheckpointRefusedError, "retrain the model for this build's feature layout"),
        (ArtifactDigestError, "check --artifacts (MERIDIAN_MODELS_ARTIFACTS)"),
        (registry.NothingToRollBackError, "a rollback needs an earlier active version"),
    ]
    return next((hint for kind, hint in hints if isinstance(exc, kind)), "")


@contextmanager
def _registry(ctx: typer.Context) -> Iterator[ModelRegistry]:
    """The registry the group's options name; registry errors become one-line user errors."""
    from meridian.errors import UserError
    from meridian.model_registry.registry import open_registry
    from meridian.model_registry.versions import ModelRegistryError

    options: RegistryOptions = ctx.obj
    registry = open_registry(options.redis_url, artifacts_dir=options.artifacts, key_prefix=options.key_prefix)
    try:
        yield registry
    except ModelRegistryError as exc:
        raise UserError(str(exc), hint=_hint_for(exc)) from exc
    finally:
        registry.close()


def _json_object(text: str, option: str) -> dict[str, Any]:
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not valid JSON: {exc}", param_hint=option) from None
    if not isinstance(value, dict):
        raise typer.BadParameter("must be a JSON object", param_hint=option)
    return value


def _echo_json(value: object) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def _version_json(version: ModelVersion) -> dict[str, Any]:
    return version.model_dump(mode="json")


def _record_json(record: TransitionRecord) -> dict[str, Any]:
    return record.model_dump(mode="json")


def _console() -> Console:
    return Console(width=160) if not Console().is_terminal else Console()


def _metrics_text(metrics: dict[str, float], limit: int = 3) -> str:
    shown = [f"{k}={v:.4g}" for k, v in sorted(metrics.items())[:limit]]
    return ", ".join(shown) + (" …" if len(metrics) > limit else "")


def _versions_table(versions: list[ModelVersion], title: str) -> Table:
    table = Table(title=title)
    for column in ("version", "state", "parent", "created (UTC)", "data window", "metrics", "size", "sha256"):
        table.add_column(column, justify="right" if column == "size" else "left")
    for v in versions:
        window = f"{v.data_window.start:%Y-%m-%d} → {v.data_window.end:%Y-%m-%d}"
        table.add_row(v.version_id, v.state.value, v.parent or "-", f"{v.created_at:%Y-%m-%d %H:%M}", window,
                      _metrics_text(v.metrics), f"{v.artifact_size_bytes / 1024:.0f} KiB", v.artifact_digest[:12])
    return table


def _transitions_table(records: list[TransitionRecord], title: str) -> Table:
    table = Table(title=title)
    for column in ("when (UTC)", "version", "from", "to", "who", "why", "evidence"):
        table.add_column(column)
    for r in records:
        table.add_row(f"{r.at:%Y-%m-%d %H:%M:%S}", r.version_id, r.from_state, r.to_state, r.who, r.why,
                      json.dumps(r.evidence, sort_keys=True, default=str) if r.evidence else "")
    return table


def _print_result(result: TransitionResult, as_json: bool) -> None:
    if as_json:
        _echo_json({"version": _version_json(result.version),
                    "retired": _version_json(result.retired) if result.retired else None,
                    "transitions": [_record_json(r) for r in result.transitions]})
        return
    _console().print(_transitions_table(result.transitions, f"{result.version.version_id} is now "
                                                            f"{result.version.state.value}"))


def models_ls(ctx: typer.Context,
              model: str | None = typer.Option(None, "--model", help="Only this model (placement, routing, "
                                               "autoscaling)."),
              as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """List the registered versions, oldest first."""
    with _registry(ctx) as registry:
        versions = registry.versions(model)
    if as_json:
        _echo_json([_version_json(v) for v in versions])
    else:
        _console().print(_versions_table(versions, f"Model versions ({model or 'all models'})"))


def models_show(ctx: typer.Context, version_id: str = typer.Argument(..., metavar="VERSION"),
                as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """One version: its record, its lineage and its audit trail."""
    with _registry(ctx) as registry:
        lineage = registry.lineage(version_id)
        version = lineage[0]
        trail = [r for r in registry.audit(version.model) if r.version_id == version_id]
    if as_json:
        _echo_json({"version": _version_json(version), "lineage": [v.version_id for v in lineage],
                    "audit": [_record_json(r) for r in trail]})
        return
    console = _console()
    facts = Table(title=f"{version_id} ({version.state.value})", show_header=False)
    facts.add_column("field")
    facts.add_column("value")
    for name, value in _version_json(version).items():
        facts.add_row(name, json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else str(value))
    facts.add_row("lineage", " → ".join(v.version_id for v in lineage))
    console.print(facts)
    console.print(_transitions_table(trail, f"Audit of {version_id}"))


def models_diff(ctx: typer.Context, a: str = typer.Argument(..., metavar="A"),
                b: str = typer.Argument(..., metavar="B"),
                as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """Lineage and metric differences of two versions of one model (delta = B − A)."""
    from meridian.errors import UserError
    from meridian.model_registry.diff import version_diff

    with _registry(ctx) as registry:
        left, right = registry.lineage(a), registry.lineage(b)
    if left[0].model != right[0].model:
        raise UserError(f"{a} and {b} are versions of different models", hint="diff two versions of one model")
    report = version_diff(left, right)
    if as_json:
        _echo_json(report)
        return
    console = _console()
    lineage = report["lineage"]
    console.print(f"common ancestor: {lineage['common_ancestor'] or 'none'}; {a} since: "
                  f"{', '.join(lineage['a_since_ancestor']) or '-'}; {b} since: "
                  f"{', '.join(lineage['b_since_ancestor']) or '-'}")
    table = Table(title=f"Metrics: {a} → {b}")
    for column in ("metric", a, b, "delta"):
        table.add_column(column, justify="left" if column == "metric" else "right")
    for name, row in report["metrics"].items():
        table.add_row(name, *("-" if row[k] is None else f"{row[k]:.6g}" for k in ("a", "b", "delta")))
    console.print(table)
    for name, change in report["fields"].items():
        console.print(f"{name}: {change['a']} → {change['b']}")


def models_register(
    ctx: typer.Context,
    model: str = typer.Option(..., "--model", help="placement, routing or autoscaling."),
    checkpoint: Path = typer.Option(..., "--checkpoint", exists=True, dir_okay=False, readable=True,
                                    help="The checkpoint file (.pt)."),
    data_window: str = typer.Option(..., "--data-window", help="The training data's window, START/END in ISO 8601."),
    train_command: str = typer.Option(..., "--train-command", help="The command that trained it, as run."),
    parent: str | None = typer.Option(None, "--parent", help="The version it was trained from."),
    data_digest: str = typer.Option("", "--data-digest", help="sha256 (hex) of the training data."),
    metrics_json: str = typer.Option("", "--metrics-json", help="Validation metrics: a JSON object of numbers."),
    who: str = typer.Option(getpass.getuser, "--who", help="Who registers it (the audit's 'who')."),
    why: str = typer.Option("registered", "--why", help="Why (the audit's 'why')."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Register a checkpoint as a candidate: stored by digest, validated by its tier, lineage recorded."""
    from meridian.model_registry.versions import DataWindow

    metrics = _json_object(metrics_json, "--metrics-json")
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in metrics.values()):
        raise typer.BadParameter("every metric must be a number", param_hint="--metrics-json")
    try:
        window = DataWindow.parse(data_window, data_digest)
    except ValueError as exc:
        raise typer.BadParameter(" ".join(str(exc).split()), param_hint="--data-window/--data-digest") from None
    with _registry(ctx) as registry:
        version = registry.register(model, checkpoint, data_window=window, train_command=train_command,
                                    metrics=metrics, parent=parent, who=who, why=why)
    if as_json:
        _echo_json(_version_json(version))
    else:
        _console().print(_versions_table([version], f"Registered {version.version_id}"))


def models_promote(
    ctx: typer.Context,
    version_id: str = typer.Argument(..., metavar="VERSION"),
    to_state: str = typer.Option(..., "--to", help="shadow, canary or active (retired: drop a version that is not "
                                 "active)."),
    why: str = typer.Option(..., "--why", help="Why (recorded in the audit)."),
    who: str = typer.Option(getpass.getuser, "--who", help="Who promotes it."),
    evidence_json: str = typer.Option("", "--evidence-json", help="Evidence for the audit: a JSON object."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Move a version one step along candidate → shadow → canary → active; activating retires the old active."""
    from meridian.model_registry.versions import ModelState

    if to_state not in {s.value for s in ModelState}:
        raise typer.BadParameter(f"{to_state!r} is not a state ({', '.join(s.value for s in ModelState)})",
                                 param_hint="--to")
    evidence = _json_object(evidence_json, "--evidence-json")
    with _registry(ctx) as registry:
        result = registry.promote(version_id, to_state, who=who, why=why, evidence=evidence)
    _print_result(result, as_json)


def models_rollback(
    ctx: typer.Context,
    model: str = typer.Argument(..., metavar="MODEL"),
    why: str = typer.Option(..., "--why", help="Why (recorded in the audit)."),
    who: str = typer.Option(getpass.getuser, "--who", help="Who rolls back."),
    evidence_json: str = typer.Option("", "--evidence-json", help="Evidence for the audit: a JSON object."),
    as_json: bool = typer.Option(False, "--json", help=JSON_HELP),
) -> None:
    """Retire the active version of MODEL and re-activate the one that was active before it."""
    evidence = _json_object(evidence_json, "--evidence-json")
    with _registry(ctx) as registry:
        result = registry.rollback(model, who=who, why=why, evidence=evidence)
    _print_result(result, as_json)


def models_audit(ctx: typer.Context, model: str = typer.Argument(..., metavar="MODEL"),
                 count: int = typer.Option(50, "--count", min=1, help="The most recent records to show."),
                 as_json: bool = typer.Option(False, "--json", help=JSON_HELP)) -> None:
    """The audit trail of MODEL: every registration and transition, oldest first."""
    with _registry(ctx) as registry:
        records = registry.audit(model, count=count)
    if as_json:
        _echo_json([_record_json(r) for r in records])
    else:
        _console().print(_transitions_table(records, f"Audit of {model}"))


COMMANDS: dict[str, Callable[..., None]] = {
    "ls": models_ls, "show": models_show, "diff": models_diff, "register": models_register,
    "promote": models_promote, "rollback": models_rollback, "audit": models_audit,
}


def register(cli: CliRoot) -> None:
    """Add ``meridian models`` to the root command."""
    models = typer.Typer(help="The model registry: versions, lineage and lifecycle of the learned models "
                              "(docs/model-lifecycle.md).", no_args_is_help=True)

    @models.callback()
    def _options(
        ctx: typer.Context,
        redis_url: str = typer.Option(DEFAULT_REDIS_URL, "--redis", envvar="MERIDIAN_MODELS_REDIS_URL",
                                      help="The bus's Redis, which holds the registry."),
        artifacts: Path = typer.Option(DEFAULT_ARTIFACTS, "--artifacts", envvar="MERIDIAN_MODELS_ARTIFACTS",
                                       help="The checkpoint store's folder (content-addressed files)."),
        key_prefix: str = typer.Option("", "--key-prefix", envvar="MERIDIAN_MODELS_KEY_PREFIX", hidden=True,
                                       help="A prefix for every Redis key (tests)."),
    ) -> None:
        ctx.obj = RegistryOptions(redis_url, Path(os.path.expanduser(artifacts)), key_prefix)

    for name, command in COMMANDS.items():
        models.command(name)(command)
    cli.app.add_typer(models, name="models")
