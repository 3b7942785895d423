"""The global scheduler's benchmarks: ``bench routing`` (policies on the held-back federation window) and
``bench api`` (sustained SubmitWorkload load, alone, beside a hostile mix, or across a leader's failover)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from global_scheduler.cli_common import (
    CARBON_OPT,
    CLUSTERS_OPT,
    DAYS_OPT,
    PRICES_OPT,
    SEED_OPT,
    START_OPT,
    TRACES_OPT,
    config_json,
    console,
    series_error,
    window,
)
from meridian.cli import CliRoot


def bench_routing(
    policies: str | None = typer.Option(None, help="Comma-separated routing policies (default: gnn and every "
                                        "baseline, bench_routing.DEFAULT_POLICIES)."),
    carbon: Path | None = CARBON_OPT,
    prices: Path | None = PRICES_OPT,
    start: str = START_OPT,
    days: int = DAYS_OPT,
    clusters: int = CLUSTERS_OPT,
    seed: int = SEED_OPT,
    checkpoint: Path | None = typer.Option(None, "--checkpoint", help="GNN checkpoint (default: committed)."),
    traces: Path | None = TRACES_OPT,
    json_out: Path | None = typer.Option(None, "--json", help="Write the results as JSON here."),
    save_run: Path | None = typer.Option(None, "--save-run", help="Save per-interval accounting for `report energy`."),
    latency_clusters: int = typer.Option(100, "--latency-clusters", help="Also time each policy's decisions "
                                         "over a federation of this many clusters (0 = skip)."),
    same_work_as: str | None = typer.Option(None, "--same-work-as", help="Run every policy on only the workloads "
                                            "this policy starts (carbon on the same work, when it fails some)."),
) -> None:
    """Compare routing policies on the held-back federation window (real carbon, prices, DLRM workloads)."""
    from global_scheduler.bench_routing import DEFAULT_POLICIES, comparison, run_routing_bench
    from global_scheduler.routing.registry import names
    from meridian.grid_data import GridDataError

    names_list = [p.strip() for p in policies.split(",") if p.strip()] if policies else list(DEFAULT_POLICIES)
    unknown = [p for p in names_list if p not in names()]
    if unknown:
        raise typer.BadParameter(f"unknown {unknown}; known: {', '.join(names())}", param_hint="--policies")
    if same_work_as is not None and same_work_as not in names():
        raise typer.BadParameter(f"unknown {same_work_as!r}; known: {', '.join(names())}",
                                 param_hint="--same-work-as")
    cfg, traces_dir = window(start=start, days=days, clusters=clusters, seed=seed, traces=traces,
                              carbon=carbon, prices=prices)
    hooks: dict[str, Any] = {}
    on_interval = None
    if save_run is not None:
        from global_scheduler.accounting.run_store import FederationRunHook

        def on_interval(name: str) -> Any:
            hooks[name] = FederationRunHook(name)
            return hooks[name]
    memory: dict[str, float] = {}
    try:
        with console.status("routing…") as status:
            results = run_routing_bench(cfg, traces_dir=traces_dir, policies=names_list, carbon_dir=carbon,
                                        prices_file=prices, checkpoint=checkpoint, on_interval=on_interval,
                                        progress=lambda name: status.update(f"routing with {name}…"),
                                        same_work_as=same_work_as, memory=memory)
    except KeyError as exc:
        raise series_error(exc) from None
    except GridDataError as exc:  # a --carbon/--prices file or folder that cannot be read
        raise typer.BadParameter(str(exc), param_hint="--carbon/--prices") from None
    _print_results(cfg, results, same_work_as)
    console.print(f"memory: peak RSS {memory['peak_rss_mib']:,.0f} MiB (the process, after the last policy); "
                  f"the simulated federation holds {memory['federation_state_mib']:,.1f} MiB once built "
                  f"(peak {memory['federation_build_peak_mib']:,.1f} MiB while building, tracemalloc)")
    if latency_clusters:
        _time_decisions(names_list, results, latency_clusters=latency_clusters, traces_dir=traces_dir,
                        checkpoint=checkpoint)
        from global_scheduler.bench_routing import peak_rss_mib

        memory["peak_rss_mib"] = peak_rss_mib()  # the timing federation may be the larger one
    summary = comparison(results)
    if summary:
        console.print(summary)
    if save_run is not None and hooks:
        from global_scheduler.accounting.run_store import save_federation_run
        from global_scheduler.accounting.work import WorkDone

        path = save_federation_run(save_run, hooks, provenance={"command": "meridian bench routing",
                                                                "config": {k: str(v) for k, v in cfg.__dict__.items()}},
                                   work={n: WorkDone.from_result(r) for n, r in results.items()})
        console.print(f"run saved to {path}")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps({"config": config_json(cfg), "same_work_as": same_work_as,
                                        "policies": results, "comparison": summary, "memory": memory},
                                       indent=2, default=str))



def _print_results(cfg: Any, results: dict[str, Any], same_work_as: str | None) -> None:
    """One row per policy: energy, carbon, cost, SLO, failures, fairness, decision time (p50/p99 of the
    run's own decisions, the run's wall time per decision) and the process's peak RSS once it has run."""
    work = f", only the work {same_work_as} starts" if same_work_as else ""
    table = Table(title=f"routing: {cfg.clusters} clusters in {len(cfg.regions)} regions, {cfg.days} days from "
                  f"{cfg.start}, {next(iter(results.values()))['workloads']} workloads{work}")
    for col in ("policy", "energy kWh", "carbon kg", "cost EUR", "SLO viol.", "failures", "deadline miss",
                "Jain", "decisions", "p50 ms", "p99 ms", "wall ms/dec.", "peak RSS MiB"):
        table.add_column(col, justify="right")
    table.columns[0].no_wrap = True  # policy names whole, however many columns
    table.columns[0].min_width = max(len(name) for name in results)
    for name, r in results.items():
        table.add_row(name, f"{r['energy_kwh']:,.0f}", f"{r['carbon_kg']:,.0f}", f"{r['cost']:,.0f}",
                      str(r["slo_violations"]), str(r["failures"]), str(r["deadline_misses"]),
                      f"{r['jain_fairness']:.3f}", f"{r['decisions']:,}", f"{r['decision_ms_p50']:.3f}",
                      f"{r['decision_ms_p99']:.3f}", f"{r['wall_ms_per_decision']:.2f}", f"{r['peak_rss_mib']:,.0f}")
    console.print(table)


def _time_decisions(names_list: list[str], results: dict[str, Any], *, latency_clusters: int, traces_dir: Path,
                    checkpoint: Path | None) -> None:
    """Each policy's decision latency over a federation of ``latency_clusters`` clusters, printed and added
    to its results."""
    from global_scheduler.bench_routing import decision_latency

    lat_table = Table(title=f"decision latency over {latency_clusters} clusters (one thread)")
    for col in ("policy", "wall p50 ms", "wall p99 ms", "CPU p50 ms", "CPU p99 ms"):
        lat_table.add_column(col, justify="right")
    with console.status("timing decisions…"):
        for name in names_list:
            lat = decision_latency(name, clusters=latency_clusters, traces_dir=traces_dir, checkpoint=checkpoint)
            results[name][f"decision_latency_{latency_clusters}_clusters"] = lat
            lat_table.add_row(name, f"{lat['wall_ms_p50']:.3f}", f"{lat['wall_ms_p99']:.3f}",
                              f"{lat['cpu_ms_p50']:.3f}", f"{lat['cpu_ms_p99']:.3f}")
    console.print(lat_table)

def bench_api(
    duration: float = typer.Option(10.0, "--duration", help="Seconds of sustained load (60 for the target)."),
    rate: float = typer.Option(1000.0, "--rate", help="Offered SubmitWorkload calls per second (all clients)."),
    clients: int = typer.Option(2, "--clients", min=1, help="Client processes."),
    clusters: int = typer.Option(10, "--clusters", min=1),
    policy: str = typer.Option("gnn", "--policy", help="Routing policy the server uses."),
    redis_url: str = typer.Option("redis://127.0.0.1:6379/0", "--redis", help="Redis for the dispatch streams."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the result as JSON here."),
    gil_switch_ms: float = typer.Option(0.5, "--gil-switch-ms", min=0.0,
                                        help="The server's thread switch interval (api.gil_switch_interval_ms); "
                                             "0 keeps Python's default 5 ms, for comparison."),
    routing_process: bool = typer.Option(True, "--routing-process/--routing-in-api",
                                         help="Route in a child process (routing.worker_process) or in a "
                                              "thread of the API's process."),
    hostile: bool = typer.Option(False, "--hostile", help="Measure the load alone, then beside a hostile mix "
                                 "(idle watches, oversized requests, garbage bytes), with a health check every "
                                 "100 ms; reports the throughput ratio (target ≥ 0.90)."),
    watches: int = typer.Option(100, "--watches", min=0, help="With --hostile: idle watches kept open."),
    watch_tokens: int = typer.Option(10, "--watch-tokens", min=1, help="With --hostile: tokens they use."),
    oversized_rate: float = typer.Option(20.0, "--oversized-rate", min=0.0,
                                         help="With --hostile: requests over the receive limit per second."),
    garbage_rate: float = typer.Option(100.0, "--garbage-rate", min=0.0,
                                       help="With --hostile: garbage-byte calls per second."),
    kill_leader_at: float | None = typer.Option(None, "--kill-leader-at", min=0.0, max=1.0,
                                                help="High availability: run two replicas (ha.enabled), clients on "
                                                     "both, and kill -9 the leader at this fraction of the run; "
                                                     "reports accepted, lost, dispatched_twice and failover_s."),
    lease_s: float = typer.Option(5.0, "--lease-s", min=0.1, help="With --kill-leader-at: the leader lease "
                                  "(ha.lease_duration_s; renew deadline 0.7x, retry period 0.1x)."),
    cluster_primaries: str = typer.Option("", "--cluster-primaries", help="Also run the same load against local "
                                          "Redis Clusters of these many primaries (e.g. 1,2,3; no replicas), one "
                                          "after the other, beside the single Redis (docs/capacity.md)."),
) -> None:
    """Sustained SubmitWorkload load over loopback; checks every accepted workload is dispatched once."""
    from global_scheduler.bench_api import run_api_bench

    if cluster_primaries:
        _bench_api_primaries(_primary_counts(cluster_primaries), duration=duration, rate=rate, clients=clients, clusters=clusters, policy=policy,
                             redis_url=redis_url, json_out=json_out, gil_switch_ms=gil_switch_ms,
                             routing_process=routing_process)
        return

    if kill_leader_at is not None:
        _bench_api_ha(duration=duration, rate=rate, clients=clients, clusters=clusters, policy=policy,
                      redis_url=redis_url, json_out=json_out, gil_switch_ms=gil_switch_ms,
                      routing_process=routing_process, kill_leader_at=kill_leader_at, lease_s=lease_s)
        return

    if hostile:
        _bench_api_hostile(duration=duration, rate=rate, clients=clients, clusters=clusters, policy=policy,
                           redis_url=redis_url, json_out=json_out, gil_switch_ms=gil_switch_ms,
                           routing_process=routing_process, watches=watches, watch_tokens=watch_tokens,
                           oversized_rate=oversized_rate, garbage_rate=garbage_rate)
        return
    with console.status(f"{rate:.0f} calls/s for {duration:.0f} s…"):
        r = run_api_bench(redis_url=redis_url, rate=rate, duration_s=duration, clients=clients, clusters=clusters,
                          policy=policy, gil_switch_interval_ms=gil_switch_ms or None,
                          routing_process=routing_process)
    where = "a routing process" if routing_process else "routing in the API's process"
    table = Table(title=f"SubmitWorkload over loopback ({clients} client processes, policy {policy}, {where})")
    for col in ("offered/s", "accepted", "errors", "throughput/s", "p50 ms", "p99 ms", "max ms", "dispatched",
                "duplicates", "missing"):
        table.add_column(col, justify="right")
    table.add_row(f"{r.offered_per_s:.0f}", str(r.accepted), str(r.errors), f"{r.throughput_per_s:.0f}",
                  f"{r.latency_ms_p50:.1f}", f"{r.latency_ms_p99:.1f}", f"{r.latency_ms_max:.1f}",
                  str(r.dispatched_unique), str(r.duplicates), str(r.missing))
    console.print(table)
    d = r.as_dict()
    console.print(f"server: GIL switch interval {d['server_switch_interval_ms']:.2f} ms; "
                  f"{d['server_gc_collections']} GC collections, longest {d['server_gc_pause_ms_max']:.1f} ms; "
                  f"routing p99 {d['server_decision_ms_p99']:.2f} ms per workload; accepted → dispatched "
                  f"p50 {d['server_dispatch_lag_ms_p50']:.0f} / p99 {d['server_dispatch_lag_ms_p99']:.0f} / "
                  f"max {d['server_dispatch_lag_ms_max']:.0f} ms")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(d, indent=2))


def _primary_counts(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise typer.BadParameter("comma-separated primary counts, e.g. 1,2,3", param_hint="--cluster-primaries") from None
    if not sizes or min(sizes) < 1:
        raise typer.BadParameter("at least one count, each >= 1", param_hint="--cluster-primaries")
    return sizes


def _bench_api_primaries(sizes: list[int], *, duration: float, rate: float, clients: int, clusters: int, policy: str,
                         redis_url: str, json_out: Path | None, gil_switch_ms: float, routing_process: bool) -> None:
    from global_scheduler.bench_api import run_api_bench_on_primaries

    runs = run_api_bench_on_primaries(sizes, redis_url=redis_url, rate=rate, duration_s=duration, clients=clients,
                                      clusters=clusters, policy=policy, gil_switch_interval_ms=gil_switch_ms or None,
                                      routing_process=routing_process, progress=console.print)
    table = Table(title=f"SubmitWorkload over loopback, {rate:.0f}/s offered for {duration:.0f} s: one Redis and "
                        "Redis Clusters of 1, 2, … primaries, in one run")
    for col in ("bus", "throughput/s", "p50 ms", "p99 ms", "dispatched", "duplicates", "missing",
                "redis CPU % per primary"):
        table.add_column(col, justify="right")
    for name, d in runs.items():
        table.add_row(name, f"{d['throughput_per_s']:.0f}", f"{d['latency_ms_p50']:.1f}", f"{d['latency_ms_p99']:.1f}",
                      str(d["dispatched_unique"]), str(d["duplicates"]), str(d["missing"]),
                      ", ".join(f"{c:.0f}" for c in d.get("redis_cpu_pct", [])) or "-")
    console.print(table)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(runs, indent=2))


def _bench_api_ha(*, duration: float, rate: float, clients: int, clusters: int, policy: str, redis_url: str,
                  json_out: Path | None, gil_switch_ms: float, routing_process: bool, kill_leader_at: float,
                  lease_s: float) -> None:
    from global_scheduler.bench_api import run_ha_api_bench

    with console.status(f"{rate:.0f} calls/s for {duration:.0f} s on two replicas, the leader killed at "
                        f"{kill_leader_at:.0%}…"):
        r = run_ha_api_bench(redis_url=redis_url, rate=rate, duration_s=duration, clients=clients,
                             clusters=clusters, policy=policy, kill_leader_at=kill_leader_at,
                             lease_duration_s=lease_s, gil_switch_interval_ms=gil_switch_ms or None,
                             routing_process=routing_process)
    table = Table(title=f"SubmitWorkload on two replicas, leader killed at {kill_leader_at:.0%} of the run "
                        f"(lease {lease_s:g} s, policy {policy})")
    for col in ("offered/s", "accepted", "errors", "lost", "dispatched", "dispatched_twice", "missing",
                "failover_s", "lock_takeover_s", "p99 ms"):
        table.add_column(col, justify="right")

    def secs(v: float | None) -> str:
        return "-" if v is None else f"{v:.2f}"

    table.add_row(f"{r['offered_per_s']:.0f}", str(r["accepted"]), str(r["errors"]), str(r["lost"]),
                  str(r["dispatched_unique"]), str(r["dispatched_twice"]), str(r["missing"]),
                  secs(r["failover_s"]), secs(r["lock_takeover_s"]), f"{r['latency_ms_p99']:.1f}")
    console.print(table)
    if r["missing"]:
        console.print(f"{r['unpublished_at_kill']} of the {r['missing']} missing were made durable by the killed "
                      "leader but not yet published (DISPATCHED: reconciliation publishes them)")
    if r["error_codes"]:
        console.print(f"failed submissions by code: {r['error_codes']} ({r['errors_after_kill']} completed after "
                      "the kill)")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(r, indent=2, default=str))


def _bench_api_hostile(*, duration: float, rate: float, clients: int, clusters: int, policy: str,
                       redis_url: str, json_out: Path | None, gil_switch_ms: float, routing_process: bool,
                       watches: int, watch_tokens: int, oversized_rate: float, garbage_rate: float) -> None:
    from global_scheduler.bench_api import run_hostile_api_bench

    with console.status(f"{rate:.0f} calls/s for {duration:.0f} s, clean then hostile…"):
        r = run_hostile_api_bench(redis_url=redis_url, rate=rate, duration_s=duration, clients=clients,
                                  clusters=clusters, policy=policy, watches=watches, watch_tokens=watch_tokens,
                                  oversized_per_s=oversized_rate, garbage_per_s=garbage_rate,
                                  gil_switch_interval_ms=gil_switch_ms or None, routing_process=routing_process)
    mix = r["hostile_mix"]
    table = Table(title=f"SubmitWorkload at {rate:.0f}/s offered, alone and beside {watches} idle watches "
                  f"({watch_tokens} tokens), {oversized_rate:g} oversized/s, {garbage_rate:g} garbage/s")
    for col in ("phase", "throughput/s", "errors", "p50 ms", "p99 ms", "health probes", "missed",
                "health p99 ms", "health max ms"):
        table.add_column(col, justify="right")
    for phase in ("clean", "hostile"):
        load, health = r[phase], r["health"][phase]
        table.add_row(phase, f"{load['throughput_per_s']:.0f}", str(load["errors"]),
                      f"{load['latency_ms_p50']:.1f}", f"{load['latency_ms_p99']:.1f}", str(health["probes"]),
                      str(health["missed"]), f"{health['latency_ms_p99']:.1f}", f"{health['latency_ms_max']:.1f}")
    console.print(table)
    met = "[green]met[/green]" if r["ratio_met"] else "[red]missed[/red]"
    console.print(f"hostile / clean throughput {r['ratio']:.3f} (target ≥ {r['target_ratio']:.2f}: {met}); "
                  f"watches open at most {mix['watches_open_max']} of {watches} (server limit "
                  f"{r['server']['watch_limit']}, {r['server']['max_watches_per_token']} per token), "
                  f"{mix['watch_refusals']} refusals; oversized {mix['oversized_codes']}; "
                  f"garbage {mix['garbage_codes']}; dispatched {r['dispatch']['dispatched_unique']} of "
                  f"{r['dispatch']['accepted']} accepted, {r['dispatch']['duplicates']} duplicates")
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(r, indent=2))


def register(cli: CliRoot) -> None:
    """Add ``bench routing`` and ``bench api`` to the ``meridian`` CLI."""
    cli.bench.command("routing")(bench_routing)
    cli.bench.command("api")(bench_api)
