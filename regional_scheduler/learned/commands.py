"""The learned policy's CLI commands: ``meridian train placement`` and ``meridian explain``
(registered by :func:`regional_scheduler.cli.register`).

Registering them runs on every ``meridian`` start: this module imports only typer, rich and
:mod:`.defaults` at the top; torch, numpy and the traces are imported by the commands that use them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from regional_scheduler.learned.defaults import DEFAULT_CHECKPOINT, TRAINING_LISTS

if TYPE_CHECKING:
    from regional_scheduler.learned.algorithm import MeanFragmentationCap
    from regional_scheduler.learned.policy import PlacementNet
    from regional_scheduler.learned.reward import RewardConfig

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


def _cpu_line(coordinate: str, deltas: str, episodes: int) -> tuple[str, list[float], int] | None:
    if not coordinate:
        return None
    from regional_scheduler.learned.algorithm import coordinate_index

    try:
        coordinate_index(coordinate)
        shifts = [float(d) for d in deltas.split(",") if d.strip()]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--cpu-line-search/--cpu-line-deltas") from exc
    if not shifts:
        raise typer.BadParameter("give the shifts to try", param_hint="--cpu-line-deltas")
    return coordinate, shifts, episodes


def _search_features(spec: str) -> Sequence[str] | None:
    """``--search-features`` / ``--cpu-search-features``: a named set ('all' = every head weight and
    mlp_scale, 'correction', 'cpu') or a comma-separated list of node features."""
    from regional_scheduler.learned import algorithm

    named: dict[str, Sequence[str] | None] = {"all": None, "correction": algorithm.CORRECTION_FEATURES,
                                              "cpu": algorithm.CPU_SEARCH_FEATURES}
    if spec in named:
        return named[spec]
    return [f.strip() for f in spec.split(",") if f.strip()]


def train_placement(
    pods: str = typer.Option(DEFAULT_TRAIN_LISTS, "--pods",
                             help="comma-separated openb pod lists to train the GPU profile on (names like "
                                  "cpu050 or CSV paths); the CPU profile trains on seed-50x200 seeds 1000+"),
    steps: int = typer.Option(300_000, help="policy-search budget per GPU profile, in environment steps"),
    cpu_steps: int = typer.Option(150_000, help="policy-search budget of the CPU profile, in environment steps"),
    seed: int = typer.Option(0, help="random seed (training is deterministic for a seed)"),
    out: Path = typer.Option(DEFAULT_CHECKPOINT, help="checkpoint to write (the log goes beside it as .json)"),
    profiles: str = typer.Option("gpu,cpu", help="which profiles to train: gpu (openb), cpu (seed-50x200)"),
    node_fraction: float = typer.Option(0.15, min=0.01, max=1.0,
                                        help="share of the openb nodes per training episode (cheaper episodes)"),
    max_minutes: float = typer.Option(14.0, help="wall-time cap for the whole run; a safety net — the "
                                                 "step budgets normally end the search"),
    merge: bool = typer.Option(False, help="keep the profiles of an existing --out that this run does not train"),
    init: Path | None = typer.Option(None, help="start each trained profile's policy search from this checkpoint's "
                                                "profile of the same name (an older feature layout or version is "
                                                "carried over with zero weight on the new features) instead of "
                                                "imitation"),
    augment: float = typer.Option(0.8, min=0.0, max=1.0,
                                  help="share of GPU-profile training episodes whose pod list gets random "
                                       "GPU-model constraints (regional_scheduler/learned/augment.py); 0 = off"),
    residual_bound: float = typer.Option(0.45, min=0.01, max=5.0,
                                         help="bound b of the learned correction to FGD's integer node score: "
                                              "< 0.5 re-ranks only FGD's tied best nodes, < 1 also the next bin"),
    from_fgd: bool = typer.Option(True, "--from-fgd/--keep-head",
                                  help="start the GPU search from a zero correction, i.e. from FGD itself "
                                       "(the network's normalisation and MLP come from --init or imitation)"),
    sigma: float = typer.Option(0.2, min=1e-4, help="ES perturbation scale (GPU profile)"),
    gate_unused: bool = typer.Option(True, "--gate-unused/--no-gate-unused",
                                     help="GPU profile: the correction never chooses between empty nodes (they "
                                          "keep FGD's first-in-order rule); see policy.py"),
    pod_mix: str = typer.Option("", help="GPU profile: 'default' = every training episode's pod list is drawn "
                                         "from the --pods lists pooled, to the CPU-only / shared-GPU / one-GPU / "
                                         "multi-GPU pod counts of openb's default list (augment.DEFAULT_MIX); "
                                         "'' = the lists as they are"),
    gate_gpu_pods: bool | None = typer.Option(None, "--gate-gpu-pods/--no-gate-gpu-pods",
                                              help="GPU profile: pods that ask for a GPU keep FGD's node (g = 0) "
                                                   "during the search and in the checkpoint, so only CPU-only "
                                                   "pods are corrected; default: as in --init (off without it)"),
    cpu_unplaced_penalty: float = typer.Option(1.5, min=0.0, help="CPU profile: return lost per pod that fits "
                                               "nowhere (reward.CPU_REWARD's default 1.5)"),
    cpu_episodes_per_eval: int = typer.Option(2, min=1, help="CPU profile: episodes per ES candidate (all "
                                              "candidates of a generation share them: common random numbers)"),
    cpu_pairs: int = typer.Option(6, min=1, help="CPU profile: ± perturbation pairs per ES generation"),
    cpu_sigma: float = typer.Option(1.0, min=1e-4, help="CPU profile: ES perturbation scale"),
    cpu_learning_rate: float = typer.Option(0.3, min=1e-6, help="CPU profile: ES (Adam) step"),
    cpu_validation_episodes: int = typer.Option(10, min=0, help="CPU profile: in-training validation episodes "
                                                "(seeds 2,001,000+) that decide between the search's result "
                                                "and its start"),
    cpu_gini_weight: float = typer.Option(100.0, min=0.0, help="CPU profile: return lost per unit of final "
                                          "Gini score / 100 (reward.CPU_REWARD's terminal_fragmentation 100: "
                                          "one Gini point = 1)"),
    cpu_gini_cap: float | None = typer.Option(None, min=0.0, max=100.0, help="CPU profile: Gini score above "
                                              "which --cpu-gini-over-cap applies (a constraint; off by default)"),
    cpu_gini_over_cap: float = typer.Option(10.0, min=0.0, help="CPU profile: return lost per Gini point "
                                            "above --cpu-gini-cap (each episode) or --cpu-gini-mean-cap "
                                            "(a batch's mean)"),
    cpu_gini_mean_cap: float | None = typer.Option(None, min=0.0, max=100.0, help="CPU profile: mean Gini score "
                                                   "of each ES candidate's batch of episodes above which "
                                                   "--cpu-gini-over-cap applies (a constraint on the batch "
                                                   "mean, as the benchmark's target is a mean over seeds; "
                                                   "off by default; may be combined with --cpu-gini-cap)"),
    cpu_line_search: str = typer.Option("", help="CPU profile: before the policy search, shift this head feature "
                                        "(or mlp_scale) of the start by each of --cpu-line-deltas and keep the "
                                        "best shift on --cpu-line-episodes training episodes (algorithm.line_search); "
                                        "'' = no line search"),
    cpu_line_deltas: str = typer.Option("", help="CPU profile: comma-separated shifts for --cpu-line-search (0 is "
                                        "always tried)"),
    cpu_line_episodes: int = typer.Option(200, min=1, help="CPU profile: episodes per shift of --cpu-line-search "
                                          "(seeds 3,001,000+)"),
    cpu_search_features: str = typer.Option("all", help="CPU profile: what the search moves — 'all' (head and "
                                            "MLP scale), 'cpu' (algorithm.CPU_SEARCH_FEATURES: the columns that "
                                            "vary on a CPU-only cluster, and mlp_scale) or a comma-separated list"),
    cpu_search_layers: str = typer.Option("", help="CPU profile: MLP layers whose weights the search moves "
                                          "as well, comma-separated (policy.SEARCHABLE_LAYERS: mlp.2, mlp.4); "
                                          "'' = none"),
    search_features: str = typer.Option("correction", help="GPU profile: node features whose head weights the "
                                        "search moves — 'correction' (algorithm.CORRECTION_FEATURES: a linear, "
                                        "cheap correction), 'all' (head and MLP scale) or a comma-separated list"),
) -> None:
    """Imitate the best heuristic, improve it with evolution-strategies policy search, write a checkpoint."""
    from meridian.traces import openb
    from regional_scheduler.learned import algorithm
    from regional_scheduler.learned.checkpoint import save_checkpoint
    from regional_scheduler.learned.reward import GPU_REWARD

    wanted = [p.strip() for p in profiles.split(",") if p.strip()]
    unknown = set(wanted) - {"gpu", "cpu"}
    if unknown or not wanted:
        raise typer.BadParameter(f"unknown profile(s) {sorted(unknown)}; choose gpu and/or cpu", param_hint="--profiles")
    names = [n.strip() for n in pods.split(",") if n.strip()]
    t0 = time.perf_counter()
    deadline = t0 + max_minutes * 60
    nets, logs = {}, {}
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        for profile in wanted:
            budget = steps if profile == "gpu" else cpu_steps
            task = progress.add_task(f"{profile}: imitation", total=budget)

            def report(phase: str, done: int, total: int, task=task, profile=profile) -> None:
                progress.update(task, description=f"{profile}: policy search", completed=done)

            remaining = max(0.0, deadline - time.perf_counter())
            share = remaining * (0.8 if profile == "gpu" and "cpu" in wanted else 1.0)
            if profile == "gpu":
                try:
                    lists = [openb.load_pods(_pod_list_path(n)) for n in names]
                except (OSError, ValueError) as exc:
                    raise typer.BadParameter(str(exc), param_hint="--pods") from exc
                init_net = _init_profile(init, "gpu")
                if init_net is not None:
                    init_net.residual_bound = residual_bound
                episodes = algorithm.openb_episodes(lists, openb.load_nodes(), node_fraction=node_fraction,
                                                   augment_p=augment, mix=_pod_mix(pod_mix))
                result = algorithm.train_profile(
                    episodes=episodes, teacher="fgd", reward=GPU_REWARD, bc_episodes=6, bc_every=2, bc_epochs=6,
                    bc_parts=("head", "mlp"), bc_learning_rates=(1e-2, 3e-3), es_steps=budget,
                    es_max_seconds=share, pairs=8, sigma=sigma, learning_rate=0.05, validation_episodes=4, seed=seed,
                    on_progress=report, init=init_net, residual_bound=residual_bound, zero_correction=from_fgd,
                    search_features=_search_features(search_features), gate_unused=gate_unused,
                    gate_gpu_pods=gate_gpu_pods)
                result.log["pod_lists"] = names
                result.log["node_fraction"] = node_fraction
                result.log["init"] = str(init) if init is not None else None
                result.log["augment"] = {"p": augment, "share_of_gpu_pods": [0.05, 0.35]}
                result.log["pod_mix"] = pod_mix or None
                result.log["residual"] = {"bound": residual_bound, "start": "fgd" if from_fgd else "init head",
                                          "gate_unused": gate_unused,
                                          "gate_gpu_pods": result.net.gate_gpu_pods}
            else:
                cpu_init = _init_profile(init, "cpu")
                cpu_reward = cpu_reward_config(cpu_unplaced_penalty, cpu_gini_weight, cpu_gini_cap,
                                               cpu_gini_over_cap)
                result = algorithm.train_profile(
                    episodes=algorithm.seed_episodes(), teacher="best-fit", reward=cpu_reward, bc_episodes=10,
                    bc_every=1, bc_epochs=6, es_steps=budget, es_max_seconds=share, pairs=cpu_pairs,
                    sigma=cpu_sigma, learning_rate=cpu_learning_rate, episodes_per_eval=cpu_episodes_per_eval,
                    validation_episodes=cpu_validation_episodes, seed=seed, on_progress=report, init=cpu_init,
                    search_features=_search_features(cpu_search_features),
                    search_layers=[x.strip() for x in cpu_search_layers.split(",") if x.strip()],
                    mean_cap=cpu_mean_cap(cpu_gini_mean_cap, cpu_gini_over_cap),
                    line=_cpu_line(cpu_line_search, cpu_line_deltas, cpu_line_episodes))
                result.log["scenario"] = "seed-50x200, seeds 1000+ (the benchmark uses 0-9)"
                result.log["unplaced_penalty"] = cpu_unplaced_penalty
                result.log["reward"] = cpu_reward.model_dump()
                result.log["init"] = str(init) if init is not None else None
            nets[profile], logs[profile] = result.net, result.log
            progress.update(task, completed=budget)
    trained_on = {"gpu": names, "cpu": "seed-50x200 seeds 1000+"}
    extra = {"seed": seed, "trained_on": {p: trained_on[p] for p in wanted}}
    log = {"seed": seed, "wall_s": time.perf_counter() - t0, "profiles": logs, "steps": steps,
           "cpu_steps": cpu_steps}
    log_path = out.with_suffix(".json")
    if merge and out.is_file():
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
        log["merged_from_previous"] = sorted(set(old_nets) - set(wanted))
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
    json_out: Path | None = typer.Option(None, "--json", help="also write the explanation here"),
) -> None:
    """Show, for one placement, the top nodes with their scores and the features that drove them."""
    from meridian.cluster_state import ClusterState
    from meridian.simulator import seed_cluster, seed_pods
    from meridian.traces import openb
    from regional_scheduler.framework import Scheduler
    from regional_scheduler.learned.checkpoint import CheckpointError, load_checkpoint
    from regional_scheduler.learned.explain import explain
    from regional_scheduler.learned.serving import (
        LearnedPolicy,
        LearnedScorer,
        ServingSettings,
        cluster_profile,
    )

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
    # The replay must reach the state the benchmark's run of this seed reaches, whatever the machine's
    # load: the model decides every earlier pod (the budget is counted, not enforced, as in the bench).
    scheduler = Scheduler(LearnedPolicy(ServingSettings(enforce_budget=False), scorer=scorer))
    state = ClusterState.from_nodes(nodes)
    replays = nets[cluster_profile(state)].replays if cluster_profile(state) in nets else 0
    with console.status(f"replaying the workload {replays}× to check the correction against FGD" if replays
                        else "preparing"):
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
