"""The learned policy's CLI commands: ``meridian train placement`` and ``meridian explain``
(registered by :func:`regional_scheduler.cli.register`).

Registering them runs on every ``meridian`` start: this module imports only typer, rich and
:mod:`.defaults` at the top; torch, numpy and the traces are imported by the commands that use them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT, TRAINING_LISTS

if TYPE_CHECKING:
    from regional_scheduler.learned.algorithm import MeanFragmentationCap, ProfileResult
    from regional_scheduler.learned.policy import PlacementNet
    from regional_scheduler.learned.reward import RewardConfig
    from regional_scheduler.learned.train_settings import PlacementTrainSettings

console = Console(width=None if Console().is_terminal else 160)

DEFAULT_TRAIN_LISTS = ",".join(TRAINING_LISTS)


def _init_profile(init: Path | None, profile: str) -> PlacementNet | None:
    """One profile's network from an ``--init`` checkpoint (an older layout is upgraded), or None."""
    if init is None:
        return None
    from regional_scheduler.learned.checkpoint import CheckpointError, load_checkpoint, upgrade_profiles

    try:
        return load_checkpoint(init)[0][profile]
    except CheckpointError:
        return upgrade_profiles(init)[0][profile]


def _pod_list_path(name: str) -> Path:
    path = Path(name)
    if path.suffix == ".csv":
        return path
    from meridian.traces import openb

    return openb.openb_dir() / f"openb_pod_list_{name}.csv"


def _pod_mix(name: str) -> dict[str, int] | None:
    from regional_scheduler.learned.augment import DEFAULT_MIX

    if name in ("", "none"):
        return None
    if name == "default":
        return DEFAULT_MIX
    raise typer.BadParameter(f"unknown pod mix {name!r}; choose 'default' or ''", param_hint="--pod-mix")


def cpu_reward_config(unplaced_penalty: float, gini_weight: float, gini_cap: float | None,
                      gini_over_cap: float) -> RewardConfig:
    """The CPU profile's training reward: ``CPU_REWARD`` with the ``--cpu-*`` options (Gini in points,
    0–100, as the benchmark prints it; the reward's fragmentation is that score / 100)."""
    from regional_scheduler.learned.reward import CPU_REWARD, RewardConfig

    update: dict[str, float] = {"unplaced_penalty": unplaced_penalty, "terminal_fragmentation": gini_weight}
    if gini_cap is not None:
        # Per Gini point above the cap → per unit of the reward's fragmentation (0–1): × 100.
        update |= {"fragmentation_cap": gini_cap / 100.0, "fragmentation_over_cap": 100.0 * gini_over_cap}
    return RewardConfig.model_validate(CPU_REWARD.model_dump() | update)


def cpu_mean_cap(gini_mean_cap: float | None, gini_over_cap: float) -> MeanFragmentationCap | None:
    """``--cpu-gini-mean-cap`` (Gini points) as the search's batch constraint (reward units: × 100)."""
    from regional_scheduler.learned.algorithm import MeanFragmentationCap

    if gini_mean_cap is None:
        return None
    return MeanFragmentationCap(cap=gini_mean_cap / 100.0, over_cap=100.0 * gini_over_cap)


def _cpu_line(coordinate: str, deltas: Sequence[float], episodes: int) -> tuple[str, list[float], int] | None:
    if not coordinate:
        return None
    from regional_scheduler.learned.algorithm import coordinate_index

    try:
        coordinate_index(coordinate)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cpu-line-search") from exc
    return coordinate, [float(d) for d in deltas], episodes


def _search_features(spec: str) -> Sequence[str] | None:
    """``--search-features`` / ``--cpu-search-features``: a named set ('all' = every head weight and
    mlp_scale, 'correction', 'cpu') or a comma-separated list of node features."""
    from regional_scheduler.learned import algorithm

    named: dict[str, Sequence[str] | None] = {"all": None, "correction": algorithm.CORRECTION_FEATURES,
                                              "cpu": algorithm.CPU_SEARCH_FEATURES}
    if spec in named:
        return named[spec]
    return [f.strip() for f in spec.split(",") if f.strip()]


# What ``train_placement``'s context must allow: every setting without an option of its own arrives
# as an extra argument (``--cpu-sigma 0.3``) that :func:`.train_settings.parse_options` reads.
TRAIN_PLACEMENT_CONTEXT = {"allow_extra_args": True, "ignore_unknown_options": True}

# The options ``train_placement`` declares → their place in the settings (the rest come as extra arguments).
_DECLARED: dict[str, tuple[str, ...]] = {
    "pods": ("gpu", "pods"), "steps": ("gpu", "steps"), "cpu_steps": ("cpu", "steps"), "profiles": ("profiles",),
    "seed": ("seed",), "out": ("out",), "init": ("init",), "merge": ("merge",), "max_minutes": ("max_minutes",)}


def train_placement(
    ctx: typer.Context,
    config: Path | None = typer.Option(None, "--config", help="YAML or JSON settings file (see --print-config); "
                                                              "options given on the command line override it"),
    print_config: bool = typer.Option(False, "--print-config", help="print the effective settings as YAML, every "
                                                                    "one with its description, and exit"),
    pods: str = typer.Option(DEFAULT_TRAIN_LISTS, "--pods",
                             help="comma-separated openb pod lists to train the GPU profile on (names like "
                                  "cpu050 or CSV paths); the CPU profile trains on seed-50x200 seeds 1000+"),
    steps: int = typer.Option(300_000, help="policy-search budget per GPU profile, in environment steps"),
    cpu_steps: int = typer.Option(150_000, help="policy-search budget of the CPU profile, in environment steps"),
    profiles: str = typer.Option("gpu,cpu", help="which profiles to train: gpu (openb), cpu (seed-50x200)"),
    seed: int = typer.Option(0, help="random seed (training is deterministic for a seed)"),
    out: Path = typer.Option(DEFAULT_CHECKPOINT, help="checkpoint to write (the log goes beside it as .json)"),
    init: Path | None = typer.Option(None, help="start each trained profile's policy search from this checkpoint's "
                                                "profile of the same name instead of imitation"),
    merge: bool = typer.Option(False, help="keep the profiles of an existing --out that this run does not train"),
    max_minutes: float = typer.Option(14.0, help="wall-time cap for the whole run; a safety net — the "
                                                 "step budgets normally end the search"),
) -> None:
    """Imitate the best heuristic, improve it with evolution-strategies policy search, write a checkpoint.

    The hyper-parameters form one documented settings object
    (regional_scheduler/learned/train_settings.py): --print-config prints the effective settings as YAML
    with every description, --config FILE reads such a file, and the command line overrides the file.
    Every other setting is an option too: --NAME VALUE for the run's and the gpu profile's (e.g.
    --node-fraction 0.3, --sigma 0.2, --residual-bound 0.45, --no-gate-unused, --keep-head),
    --cpu-NAME VALUE for the cpu profile's (e.g. --cpu-pairs 12, --cpu-gini-mean-cap 29).
    """
    from regional_scheduler.learned.train_settings import SettingsError, dump_yaml, resolve_settings

    overrides: dict[str, Any] = {}
    for name, path in _DECLARED.items():
        source = ctx.get_parameter_source(name)
        if source is not None and source.name == "COMMANDLINE":  # given, not a default
            section = overrides.setdefault(path[0], {}) if len(path) > 1 else overrides
            section[path[-1]] = ctx.params[name]
    try:
        settings = resolve_settings(config, overrides, ctx.args)
    except SettingsError as exc:
        ctx.fail(str(exc))
    if print_config:
        typer.echo(dump_yaml(settings), nl=False)
        return
    _train(settings)


def _train(s: PlacementTrainSettings) -> None:
    """Train ``s.profiles`` in order (the GPU profile gets 80 % of the time cap left when the CPU
    profile follows), then write the checkpoint and its log."""
    t0 = time.perf_counter()
    deadline = t0 + s.max_minutes * 60
    nets, logs = {}, {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        for profile in s.profiles:
            budget = s.gpu.steps if profile == "gpu" else s.cpu.steps
            task = progress.add_task(f"{profile}: imitation", total=budget)

            def report(phase: str, done: int, total: int, task=task, profile=profile) -> None:
                progress.update(task, description=f"{profile}: policy search", completed=done)

            remaining = max(0.0, deadline - time.perf_counter())
            share = remaining * (0.8 if profile == "gpu" and "cpu" in s.profiles else 1.0)
            result = (_train_gpu if profile == "gpu" else _train_cpu)(s, share, report)
            nets[profile], logs[profile] = result.net, result.log
            progress.update(task, completed=budget)
    _write_checkpoint(s, nets, logs, t0)


def _train_gpu(s: PlacementTrainSettings, max_seconds: float, report: Callable[[str, int, int], None]) -> ProfileResult:
    """The ``gpu`` profile: a bounded correction of FGD, searched on openb episodes."""
    from meridian.traces import openb
    from regional_scheduler.learned import algorithm
    from regional_scheduler.learned.reward import GPU_REWARD

    g = s.gpu
    try:
        lists = [openb.load_pods(_pod_list_path(n)) for n in g.pods]
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--pods") from exc
    init_net = _init_profile(s.init, "gpu")
    if init_net is not None:
        init_net.residual_bound = g.residual_bound
    episodes = algorithm.openb_episodes(lists, openb.load_nodes(), node_fraction=g.node_fraction,
                                       augment_p=g.augment, mix=_pod_mix(g.pod_mix))
    result = algorithm.train_profile(
        episodes=episodes, teacher="fgd", reward=GPU_REWARD, bc_episodes=g.bc_episodes, bc_every=g.bc_every,
        bc_epochs=g.bc_epochs, bc_parts=tuple(g.bc_parts), bc_learning_rates=tuple(g.bc_learning_rates),
        es_steps=g.steps, es_max_seconds=max_seconds, pairs=g.pairs, sigma=g.sigma, learning_rate=g.learning_rate,
        validation_episodes=g.validation_episodes, seed=s.seed, on_progress=report, init=init_net,
        residual_bound=g.residual_bound, zero_correction=g.from_fgd, search_features=_search_features(g.search_features),
        gate_unused=g.gate_unused, gate_gpu_pods=g.gate_gpu_pods)
    result.log["pod_lists"] = list(g.pods)
    result.log["node_fraction"] = g.node_fraction
    result.log["init"] = str(s.init) if s.init is not None else None
    result.log["augment"] = {"p": g.augment, "share_of_gpu_pods": [0.05, 0.35]}
    result.log["pod_mix"] = g.pod_mix or None
    result.log["residual"] = {"bound": g.residual_bound, "start": "fgd" if g.from_fgd else "init head",
                              "gate_unused": g.gate_unused, "gate_gpu_pods": result.net.gate_gpu_pods}
    return result


def _train_cpu(s: PlacementTrainSettings, max_seconds: float, report: Callable[[str, int, int], None]) -> ProfileResult:
    """The ``cpu`` profile: the residual policy ranks by ``g`` alone, searched on seed-50x200 episodes."""
    from regional_scheduler.learned import algorithm

    c = s.cpu
    cpu_reward = cpu_reward_config(c.unplaced_penalty, c.gini_weight, c.gini_cap, c.gini_over_cap)
    result = algorithm.train_profile(
        episodes=algorithm.seed_episodes(), teacher="best-fit", reward=cpu_reward, bc_episodes=c.bc_episodes,
        bc_every=c.bc_every, bc_epochs=c.bc_epochs, es_steps=c.steps, es_max_seconds=max_seconds, pairs=c.pairs,
        sigma=c.sigma, learning_rate=c.learning_rate, episodes_per_eval=c.episodes_per_eval,
        validation_episodes=c.validation_episodes, seed=s.seed, on_progress=report, init=_init_profile(s.init, "cpu"),
        search_features=_search_features(c.search_features), search_layers=list(c.search_layers),
        mean_cap=cpu_mean_cap(c.gini_mean_cap, c.gini_over_cap),
        line=_cpu_line(c.line_search, c.line_deltas, c.line_episodes))
    result.log["scenario"] = "seed-50x200, seeds 1000+ (the benchmark uses 0-9)"
    result.log["unplaced_penalty"] = c.unplaced_penalty
    result.log["reward"] = cpu_reward.model_dump()
    result.log["init"] = str(s.init) if s.init is not None else None
    return result


def _write_checkpoint(s: PlacementTrainSettings, nets: dict[str, PlacementNet], logs: dict[str, Any],
                      t0: float) -> None:
    """Write ``s.out`` and its log; with ``s.merge``, carry over the profiles of an existing file not trained now."""
    from regional_scheduler.learned.checkpoint import save_checkpoint

    trained_on = {"gpu": list(s.gpu.pods), "cpu": "seed-50x200 seeds 1000+"}
    extra = {"seed": s.seed, "trained_on": {p: trained_on[p] for p in s.profiles}}
    log = {"seed": s.seed, "wall_s": time.perf_counter() - t0, "profiles": logs, "steps": s.gpu.steps,
           "cpu_steps": s.cpu.steps}
    out = s.out
    log_path = out.with_suffix(".json")
    if s.merge and out.is_file():
        from regional_scheduler.learned.checkpoint import CheckpointError, load_checkpoint, upgrade_profiles

        try:
            old_nets, old_extra = load_checkpoint(out)
        except CheckpointError:
            # An older feature layout: carry its profiles over with zero weight on the new features.
            old_nets, old_extra, old_version = upgrade_profiles(out)
            log["upgraded_from_feature_layout"] = old_version
        old_log = json.loads(log_path.read_text()) if log_path.is_file() else {"profiles": {}}
        # Keep the old file's other metadata (e.g. ``gate_unused`` of a profile carried over).
        extra = {**{k: v for k, v in old_extra.items() if k not in extra}, **extra}
        for name, net in old_nets.items():
            if name not in nets:
                nets[name] = net
                extra["trained_on"][name] = old_extra.get("trained_on", {}).get(name)
                if name in old_log.get("profiles", {}):
                    logs[name] = old_log["profiles"][name]
        log["merged_from_previous"] = sorted(set(old_nets) - set(s.profiles))
    save_checkpoint(out, nets, extra=extra)
    log_path.write_text(json.dumps(log, indent=1))
    console.print(f"wrote {out} ({out.stat().st_size / 1024:.0f} KiB) and {log_path} in "
                  f"{time.perf_counter() - t0:.0f} s")


def explain_command(
    scenario: str = typer.Option("openb", help="openb | seed-50x200"),
    pods: str = typer.Option("default", "--pods", help="openb pod list (name or CSV path)"),
    seed: int = typer.Option(42, help="the protocol's seed (openb: 42…; seed-50x200: 0…)"),
    pod_index: int = typer.Option(0, "--pod-index", min=0,
                                  help="explain the placement of this arriving pod (earlier ones are placed "
                                       "by the learned policy first)"),
    top: int = typer.Option(5, min=1, help="how many nodes to show"),
    checkpoint: Path = typer.Option(DEFAULT_CHECKPOINT, help="checkpoint to explain"),
    paper: bool = typer.Option(False, "--paper", help="prepare the policy with the workload's distribution, as `bench placement --paper` does; by default it sees only the pods placed so far, as in a live scheduler"),
    json_out: Path | None = typer.Option(None, "--json", help="also write the explanation here"),
) -> None:
    """Show, for one placement, the top nodes with their scores and the features that drove them."""
    from meridian.cluster_state import ClusterState
    from meridian.simulator import seed_cluster, seed_pods
    from meridian.traces import openb
    from regional_scheduler.framework import Scheduler
    from regional_scheduler.learned.checkpoint import CheckpointError, load_checkpoint
    from regional_scheduler.learned.explain import explain
    from regional_scheduler.learned.serving import LearnedScorer, ServingSettings
    from regional_scheduler.policies.learned import LearnedPolicy

    try:
        nets, _ = load_checkpoint(checkpoint)
    except CheckpointError as exc:
        raise typer.BadParameter(str(exc), param_hint="--checkpoint") from exc
    if scenario == "seed-50x200":
        nodes, arrivals = seed_cluster(), seed_pods(seed)
        workload = arrivals
    elif scenario == "openb":
        nodes = openb.load_nodes()
        workload = openb.load_pods(_pod_list_path(pods))
        arrivals = openb.inflate_pods(workload, sum(n.allocatable_resources.gpu for n in nodes) * 1000, seed=seed)
    else:
        raise typer.BadParameter("choose openb or seed-50x200", param_hint="--scenario")
    if pod_index >= len(arrivals):
        raise typer.BadParameter(f"only {len(arrivals)} pods arrive", param_hint="--pod-index")
    scorer = LearnedScorer(nets)
    # The run must reach the state the benchmark's run of this seed reaches, whatever the machine's
    # load: the model decides every earlier pod (the budget is counted, not enforced, as in the bench).
    scheduler = Scheduler(LearnedPolicy(ServingSettings(enforce_budget=False), scorer=scorer))
    state = ClusterState.from_nodes(nodes)
    if paper:
        with console.status("preparing"):
            scheduler.prepare(state, workload)
    for pod in arrivals[:pod_index]:
        placement = scheduler.place(state, pod)
        if placement is not None:
            state.allocate(pod, placement)
    pod = arrivals[pod_index]
    result = explain(scorer, state, pod, top=top)
    r = pod.requests
    console.print(f"pod {pod.name}: {r.milli_cpu} mCPU, {r.memory_bytes // 2**20} MiB, "
                  f"{r.gpu} GPU(s), {r.gpu_milli} milli-GPU share; profile {result.profile}; "
                  f"{result.n_feasible}/{result.n_nodes} nodes feasible")
    if result.gate is not None:
        console.print(f"gate: {result.gate}")
    if result.chosen is None:
        console.print("no node fits: " + ", ".join(f"{n} {k}" for k, n in result.rejected_by.items() if n))
    table = Table(title=f"why {result.chosen}")
    for col in ("rank", "node", "score", "fgd score", "features that drove the correction (value → attribution)"):
        table.add_column(col)
    for n in result.nodes:
        table.add_row(str(n.rank), n.node, f"{n.score:.3f}", f"{n.fgd_score:.0f}",
                      "; ".join(f"{f}={v:.3g} → {a:+.3f}" for f, v, a in n.top_features))
    console.print(table)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(result.as_dict(), indent=2))
        console.print(f"wrote {json_out}")
