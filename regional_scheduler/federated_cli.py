"""``meridian train federated`` and ``meridian bench federated``: a model trained across regions on Flower,
each region on its own data, only model updates crossing a region's boundary.

Two models: ``autoscaling``, the quantile forecaster of :mod:`.autoscaling.federated` (a region is a request
series, or a share of one), and ``placement``, the placement correction of :mod:`.learned.federated` (a region
is an openb training pod list on its own node mix). Both compare, on every region's held-out data, the
region's local model, the federated one (and it fine-tuned in the region) and one trained centrally on every
region's data. ``--dp-noise-multiplier`` trains the federated model under differential privacy
(:mod:`meridian.federated.privacy`) and reports the budget spent.
"""

from __future__ import annotations

import json
import shlex
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meridian.cli import CliRoot

console = Console()

MODELS = ("autoscaling", "placement")
REGIONS_HELP = ("Regions: 'all', a count, or (autoscaling) comma-separated series names (lora, nasa, twitter, "
                "wikipedia). Autoscaling: a count up to 4 takes the first N series, a larger one (up to 16) "
                "shares each series' requests among several regions (8 = 2 per series). Placement: a count "
                "of openb training pod lists, each on its own node mix.")
MAX_REGIONS = 16


def _autoscaling_regions(spec: str, traces: Path | None, *, seed: int) -> list[Any]:
    from meridian.traces import locate_traces
    from regional_scheduler.autoscaling.federated import region_data, split_regions
    from regional_scheduler.autoscaling.request_series import shared_series_paths

    paths = {p.name.split("_")[0]: p for p in shared_series_paths(traces or locate_traces().path)}
    if spec == "all":
        names = sorted(paths)
    elif spec.isdigit():
        limit = min(MAX_REGIONS, 4 * len(paths))
        if not 2 <= int(spec) <= limit:
            raise typer.BadParameter(f"between 2 and {limit} regions", param_hint="--regions")
        return split_regions([paths[n] for n in sorted(paths)], int(spec), seed=seed)
    else:
        names = [n.strip() for n in spec.split(",") if n.strip()]
        unknown = sorted(set(names) - set(paths))
        if unknown or len(names) < 2:
            raise typer.BadParameter(f"unknown {unknown}; known: {', '.join(sorted(paths))} (at least 2)",
                                     param_hint="--regions")
    return [region_data(paths[n], n) for n in names]


def _placement_regions(spec: str, *, seed: int) -> list[Any]:
    from regional_scheduler.learned.federated import MAX_PLACEMENT_REGIONS, placement_regions

    count = MAX_PLACEMENT_REGIONS if spec == "all" else int(spec) if spec.isdigit() else -1
    if not 2 <= count <= MAX_PLACEMENT_REGIONS:
        raise typer.BadParameter(f"placement regions: 'all' or a count from 2 to {MAX_PLACEMENT_REGIONS}",
                                 param_hint="--regions")
    return placement_regions(count, seed=seed)


def _privacy(noise: float | None, clip: float, delta: float, noise_seed: int | None) -> Any:
    if noise is None:
        return None
    from pydantic import ValidationError

    from meridian.federated.privacy import PrivacySettings

    try:
        return PrivacySettings(noise_multiplier=noise, clipping_norm=clip, delta=delta, noise_seed=noise_seed)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise typer.BadParameter(f"{first['loc'][0]}: {first['msg']}", param_hint="--dp-*") from None


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("round {task.completed}/{task.total}"),
                    TextColumn("{task.fields[loss]}"), TimeElapsedColumn(), console=console, transient=True)


def _compare(model: str, regions: list[Any], *, rounds: int, steps: int | None, strategy: str, mu: float, seed: int,
             privacy: Any, secagg: bool) -> tuple[Any, Any]:
    with _progress() as progress:
        task = progress.add_task(f"{model}, {strategy}: {len(regions)} regions", total=rounds, loss="")

        def on_round(s: Any) -> None:
            progress.update(task, completed=s.round, loss="" if s.loss is None else f"validation {s.loss:.4f}")

        kwargs: dict[str, Any] = dict(rounds=rounds, strategy=strategy, proximal_mu=mu, seed=seed, on_round=on_round,
                                      privacy=privacy, secure_aggregation=secagg)
        if model == "autoscaling":
            from regional_scheduler.autoscaling.federated import compare

            return compare(regions, steps_per_round=steps or 25, **kwargs)
        from regional_scheduler.learned.federated import compare_placement

        if steps is not None:
            kwargs["generations_per_round"] = steps
        return compare_placement(regions, **kwargs)  # type: ignore[no-any-return]


COLUMNS = ("untrained", "local", "federated", "federated_finetuned", "central")
HEADERS = ("untrained", "local", "federated", "federated + fine-tune", "central")


def _table(title: str, comparison: Any, model: str) -> Table:
    fmt = "{:.4f}" if model == "autoscaling" else "{:.2f}"
    table = Table(title=title)
    for col in ("region", *(HEADERS if model == "autoscaling" else ("FGD", *HEADERS[1:]))):
        table.add_column(col, justify="right")
    for name, v in comparison.regions.items():
        table.add_row(name, *(fmt.format(v[k]) for k in COLUMNS))
    table.add_row("mean", *(fmt.format(comparison.totals[k]) for k in COLUMNS), style="bold")
    return table


def _summary(comparison: Any, model: str) -> str:
    t, rounds = comparison.totals, comparison.rounds
    gap = f"{t['federated_vs_central']:+.1%}" if model == "autoscaling" else f"{t['federated_vs_central']:+.2f} points"
    line = (f"federated ≥ local in {t['federated_beats_local_regions']} of {len(comparison.regions)} regions "
            f"(fine-tuned: {t['finetuned_beats_local_regions']}); federated vs central {gap}; "
            f"per round {sum(r.wall_s for r in rounds) / max(len(rounds), 1):.2f} s, "
            f"{rounds[0].bytes_to_server if rounds else 0:,} bytes to the server and as many back")
    if comparison.privacy:
        p = comparison.privacy
        line += (f"; differential privacy: ε = {p['epsilon']:.3g} at δ = {p['delta']:g} "
                 f"(noise multiplier {p['noise_multiplier']:g}, clipping norm {p['clipping_norm']:g})")
    return line


METRIC_HELP = {"autoscaling": "held-back mean pinball loss, lower is better",
               "placement": "held-out GPU allocation (%) at 100 % arrived, higher is better"}

# Options shared by both commands.
MODEL_OPT = typer.Option("autoscaling", "--model", help="autoscaling (the quantile forecaster) or placement "
                         "(the learned placement correction).")
ROUNDS_OPT = typer.Option(None, "--rounds", min=1, help="Federated rounds (default: 20 autoscaling, 4 placement).")
DEFAULT_ROUNDS = {"autoscaling": 20, "placement": 4}
STEPS_OPT = typer.Option(None, "--steps-per-round", min=1, help="Local work per region per round: optimiser "
                         "steps (autoscaling, default 25) or ES generations (placement, its default).")
STRATEGY_OPT = typer.Option("fedavg", "--strategy", help="fedavg or fedprox.")
MU_OPT = typer.Option(0.1, "--proximal-mu", min=0.0, help="FedProx's proximal weight.")
SEED_OPT = typer.Option(0, "--seed", help="Seeds training and the regions' data; the privacy noise has its own "
                        "--dp-noise-seed.")
DP_NOISE_OPT = typer.Option(None, "--dp-noise-multiplier", min=0.0, help="Train under differential privacy: "
                            "the noise's standard deviation over the sensitivity (clipping norm / regions).")
DP_CLIP_OPT = typer.Option(1.0, "--dp-clipping-norm", help="L2 norm each region's update is clipped to.")
DP_DELTA_OPT = typer.Option(1e-5, "--dp-delta", help="δ of the reported (ε, δ) budget.")
DP_SEED_OPT = typer.Option(None, "--dp-noise-seed", min=0, help="Seed the privacy noise, to repeat a run "
                           "exactly; whoever knows it can remove the noise (default: the OS's entropy).")
TRACES_OPT = typer.Option(None, "--traces", help="Shared traces (default: ../shared/traces).")
SECAGG_OPT = typer.Option(False, "--secure-aggregation", help="Sum the regions' updates with Flower's SecAgg+: "
                          "the server sees only the sum (FedAvg, at least 3 regions, no --dp-*).")
HISTORY_OPT = typer.Option(None, "--history-days", min=0.01, help="Autoscaling: each region trains on only "
                           "the last N days of its training days (a new region, or a short retention); its "
                           "held-back days are unchanged.")


def _check(model: str, strategy: str, *, secagg: bool = False, privacy: Any = None) -> None:
    if model not in MODELS:
        raise typer.BadParameter(f"one of {', '.join(MODELS)}", param_hint="--model")
    if strategy not in ("fedavg", "fedprox"):
        raise typer.BadParameter("fedavg or fedprox", param_hint="--strategy")
    if secagg and (strategy != "fedavg" or privacy is not None):
        raise typer.BadParameter("SecAgg+ runs FedAvg without --dp-*: the server's clipping and noise need each "
                                 "region's update, which secure aggregation hides", param_hint="--secure-aggregation")


def _regions(model: str, spec: str, traces: Path | None, seed: int, history_days: float | None) -> list[Any]:
    if model == "placement":
        if history_days is not None:
            raise typer.BadParameter("autoscaling only", param_hint="--history-days")
        return _placement_regions(spec, seed=seed)
    regions = _autoscaling_regions(spec, traces, seed=seed)
    return regions if history_days is None else [r.recent(history_days) for r in regions]


def lineage(model: str, regions: list[Any], comparison: Any, *, settings: dict[str, Any], out: Path) -> dict[str, Any]:
    """The record written beside a federated checkpoint: what trained it, on which regions, how it compared."""
    return {"model": model, "kind": "federated", "checkpoint": out.name,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "train_command": shlex.join(["meridian", *sys.argv[1:]]) if sys.argv else "",
            "regions": [r.name for r in regions], "settings": settings,
            "metric": METRIC_HELP[model], "results": comparison.as_dict()}


def train_federated(
    model: str = MODEL_OPT,
    regions: str = typer.Option("all", "--regions", help=REGIONS_HELP),
    rounds: int | None = ROUNDS_OPT,
    steps: int | None = STEPS_OPT,
    strategy: str = STRATEGY_OPT,
    mu: float = MU_OPT,
    seed: int = SEED_OPT,
    dp_noise: float | None = DP_NOISE_OPT,
    dp_clip: float = DP_CLIP_OPT,
    dp_delta: float = DP_DELTA_OPT,
    dp_noise_seed: int | None = DP_SEED_OPT,
    secagg: bool = SECAGG_OPT,
    traces: Path | None = TRACES_OPT,
    history_days: float | None = HISTORY_OPT,
    out: Path | None = typer.Option(None, "--out", help="Where the federated model goes: autoscaling a numpy .npz "
                                    "of the weights, placement a placement checkpoint (.pt). A JSON lineage "
                                    "record is written beside it. Default: bench-out/federated-<model>.*"),
    register_it: bool = typer.Option(False, "--register", help="Also register the placement checkpoint in the "
                                     "model registry as a candidate (parent: the active version)."),
    registry_redis: str = typer.Option("redis://127.0.0.1:6379/0", "--registry-redis",
                                       envvar="MERIDIAN_MODELS_REDIS_URL", help="The registry's Redis."),
    registry_artifacts: Path = typer.Option(Path("~/.local/share/meridian/models"), "--registry-artifacts",
                                            envvar="MERIDIAN_MODELS_ARTIFACTS",
                                            help="The registry's checkpoint store (a folder)."),
    registry_key_prefix: str = typer.Option("", "--registry-key-prefix", envvar="MERIDIAN_MODELS_KEY_PREFIX",
                                            hidden=True, help="A prefix for every registry key (tests)."),
) -> None:
    """Train a model across regions on Flower: only model updates leave a region (a progress bar per round)."""
    privacy = _privacy(dp_noise, dp_clip, dp_delta, dp_noise_seed)
    _check(model, strategy, secagg=secagg, privacy=privacy)
    rounds = rounds or DEFAULT_ROUNDS[model]
    if register_it and model != "placement":
        raise typer.BadParameter("only a placement checkpoint can be registered: the registry's autoscaling "
                                 "model is the DQN policy, not this forecaster", param_hint="--register")
    out = out or Path(f"bench-out/federated-{model}.{'npz' if model == 'autoscaling' else 'pt'}")
    data = _regions(model, regions, traces, seed, history_days)
    comparison, result = _compare(model, data, rounds=rounds, steps=steps, strategy=strategy, mu=mu, seed=seed,
                                  privacy=privacy, secagg=secagg)
    out.parent.mkdir(parents=True, exist_ok=True)
    settings = {"rounds": rounds, "steps_per_round": steps, "strategy": strategy, "proximal_mu": mu, "seed": seed,
                "history_days": history_days, "secure_aggregation": secagg,
                "privacy": comparison.privacy}
    if model == "autoscaling":
        import numpy as np

        np.savez(out, weights=result.parameters[0], regions=np.array([r.name for r in data]), rounds=rounds,
                 strategy=strategy, proximal_mu=mu, seed=seed)
    else:
        from regional_scheduler.learned.federated import save_federated_checkpoint

        save_federated_checkpoint(out, result.parameters)
    record = lineage(model, data, comparison, settings=settings, out=out)
    out.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    console.print(_table(f"{model}: {METRIC_HELP[model]} ({strategy}, {rounds} rounds)", comparison, model))
    console.print(_summary(comparison, model))
    console.print(f"model: {out}; lineage: {out.with_suffix('.json')}; refused updates: {comparison.refused_updates}")
    if register_it:
        _register(out, record, registry_redis, registry_artifacts.expanduser(), registry_key_prefix)


def _register(checkpoint: Path, record: dict[str, Any], url: str, artifacts: Path, key_prefix: str) -> None:
    from meridian.errors import UserError
    from meridian.model_registry.registry import open_registry
    from meridian.model_registry.versions import DataWindow, ModelRegistryError

    now = datetime.now(UTC).isoformat(timespec="seconds")
    totals = record["results"]["totals"]
    metrics = {k: float(v) for k, v in totals.items() if isinstance(v, int | float)}
    registry = open_registry(url, artifacts_dir=artifacts, key_prefix=key_prefix)
    try:
        active = registry.active("placement")
        version = registry.register(
            "placement", checkpoint, data_window=DataWindow.parse(f"{now}/{now}", ""),
            train_command=record["train_command"], metrics=metrics,
            parent=None if active is None else active.version_id, who="meridian train federated",
            why=f"federated over {len(record['regions'])} regions ({', '.join(record['regions'])})",
            evidence={"federated": record["settings"]})
    except ModelRegistryError as exc:
        raise UserError(f"the federated checkpoint was written to {checkpoint} but not registered: {exc}") from exc
    finally:
        registry.close()
    console.print(f"registered {version.version_id} as a candidate (parent {version.parent or '-'})")


def bench_federated(
    model: str = MODEL_OPT,
    counts: str = typer.Option("2,4,8", "--region-counts", help="Comma-separated region counts to run, each a "
                               "--regions count of `meridian train federated`."),
    rounds: int | None = ROUNDS_OPT,
    steps: int | None = STEPS_OPT,
    strategy: str = STRATEGY_OPT,
    mu: float = MU_OPT,
    seed: int = SEED_OPT,
    dp_noise: float | None = DP_NOISE_OPT,
    dp_clip: float = DP_CLIP_OPT,
    dp_delta: float = DP_DELTA_OPT,
    dp_noise_seed: int | None = DP_SEED_OPT,
    secagg: bool = SECAGG_OPT,
    traces: Path | None = TRACES_OPT,
    history_days: float | None = HISTORY_OPT,
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON here."),
) -> None:
    """Local vs federated vs central models on every region's held-out data, for each region count."""
    privacy = _privacy(dp_noise, dp_clip, dp_delta, dp_noise_seed)
    _check(model, strategy, secagg=secagg, privacy=privacy)
    rounds = rounds or DEFAULT_ROUNDS[model]
    results: dict[str, Any] = {}
    for count in [c.strip() for c in counts.split(",") if c.strip()]:
        data = _regions(model, count, traces, seed, history_days)
        comparison, _ = _compare(model, data, rounds=rounds, steps=steps, strategy=strategy, mu=mu, seed=seed,
                                 privacy=privacy, secagg=secagg)
        console.print(_table(f"{count} regions, {model}, {strategy}, {rounds} rounds: {METRIC_HELP[model]}",
                             comparison, model))
        console.print(_summary(comparison, model))
        results[count] = comparison.as_dict()
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"model": model, "metric": METRIC_HELP[model], "strategy": strategy,
                                        "rounds": rounds, "steps_per_round": steps, "seed": seed,
                                        "history_days": history_days, "dp_noise_multiplier": dp_noise,
                                        "secure_aggregation": secagg,
                                        "runs": results}, indent=2) + "\n")


def register(cli: CliRoot) -> None:
    cli.train.command("federated")(train_federated)
    cli.bench.command("federated")(bench_federated)

