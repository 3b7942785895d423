"""``meridian demo``: run the whole control plane on this machine and show what it decided.

Two parts:
1. **Live**: regional schedulers on simulated clusters (real openb nodes), the global scheduler's
   gRPC API on loopback and energy accounting, over Redis streams (``--bus``; a private
   ``redis-server`` is started when none answers, and the in-process bus is the last resort).
   Workloads from the DLRM trace are submitted through the API and followed until they run. Its Redis
   keys live under a private prefix (``demo-<id>:``), all removed when the part ends (``embedded``).
2. **Replay**: the same routing policies over days of the held-back window of the federation
   simulator (real carbon and prices), compared with Karmada's and greedy lowest-carbon routing,
   saved with ``--save-run`` for ``meridian report energy --run DIR``.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from meridian.cli import CliRoot
from meridian.traces import TracesNotFoundError, locate_traces

if TYPE_CHECKING:
    from collections.abc import Iterable

    from protos import global_api_pb2 as api
    from protos.global_api_pb2_grpc import GlobalSchedulerStub

console = Console(width=None if Console().is_terminal else 140)
log = logging.getLogger(__name__)


def _state_name(state: int) -> str:
    from protos import global_api_pb2 as api

    return api.WorkloadState.Name(state).removeprefix("WORKLOAD_STATE_").lower()


def _choose_bus(bus: str | None) -> tuple[str, Any]:
    from meridian_demo.embedded import PrivateRedis, redis_answers

    if bus:
        return bus, None
    import os

    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(url):
        return url, None
    private = PrivateRedis.start()
    if private is not None:
        return private.url, private
    console.print("[yellow]no Redis reachable and no redis-server binary: using the in-process bus "
                  "(energy accounting needs Redis and is skipped)[/yellow]")
    return "memory://", None


def live_part(cfg: Any, bus_url: str, traces_dir: Path) -> dict[str, Any]:
    import grpc

    from meridian_demo import embedded
    from protos import global_api_pb2 as api
    from protos import global_api_pb2_grpc as api_grpc

    t0 = time.perf_counter()
    fed = embedded.start_federation(cfg, bus_url=bus_url, traces_dir=traces_dir)
    try:
        console.print(f"[bold]live[/bold]: {len(fed.workers)} clusters in {len(cfg.regions)} regions, global API on "
                      f"{fed.target}, bus {bus_url.split('@')[-1]}, routing {cfg.routing}, placement {cfg.placement}")
        stub = api_grpc.GlobalSchedulerStub(grpc.insecure_channel(fed.target))
        current = _submit_and_follow(stub, embedded.trace_workloads(cfg, traces_dir), timeout_s=cfg.timeout_s)
        # Let a few more summaries land so the energy ledger has intervals to report.
        time.sleep(max(2.0, 4 * cfg.summary_interval_s))
        _print_live_clusters(stub.ListClusters(api.ListClustersRequest(), timeout=10).clusters, current)
        states = Counter(_state_name(w.state) for w in current)
        console.print("workload states: " + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))

        energy: dict[str, Any] = {}
        energy_by_tenant: dict[str, Any] = {}
        if not bus_url.startswith("memory:"):
            energy, energy_by_tenant = _print_live_energy(fed.target)
        by_region: dict[str, int] = defaultdict(int)
        for w in current:
            if w.state == api.WORKLOAD_STATE_RUNNING:
                by_region[w.region] += w.spec.replicas
        return {"workloads": len(current), "states": dict(states), "replicas_running_by_region": dict(by_region),
                "carbon_g_per_kwh": fed.carbon, "energy": energy,
                "energy_by_tenant": energy_by_tenant, "wall_s": time.perf_counter() - t0,
                "redis_key_prefix": fed.key_prefix}  # every key under it is removed when the live part ends
    finally:
        fed.close()


def _submit_and_follow(stub: GlobalSchedulerStub, requests: list[api.SubmitWorkloadRequest], *,
                       timeout_s: float) -> list[api.Workload]:
    """Submit every request through the API, then poll until each workload is settled (or ``timeout_s``),
    with progress bars; returns the workloads as last read."""
    from meridian_demo import embedded
    from protos import global_api_pb2 as api

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("submitting DLRM workloads", total=len(requests))
        submitted = []
        for req in requests:
            submitted.append(stub.SubmitWorkload(req, timeout=10))
            progress.advance(task)
        ids = [w.id for w in submitted]
        task2 = progress.add_task("waiting for placements", total=len(ids))
        deadline = time.monotonic() + timeout_s
        while True:
            current = [stub.GetWorkload(api.GetWorkloadRequest(id=i), timeout=10) for i in ids]
            settled = sum(w.state in embedded.TERMINAL for w in current)
            progress.update(task2, completed=settled)
            if settled == len(ids) or time.monotonic() > deadline:
                return current
            time.sleep(0.2)


def _print_live_clusters(clusters: Iterable[api.Cluster], current: list[api.Workload]) -> None:
    from protos import global_api_pb2 as api

    table = Table(title="clusters (live)")
    for col in ("cluster", "region", "ready", "nodes", "gCO2/kWh", "free CPU", "free GPUs", "running"):
        table.add_column(col, justify="left" if col in ("cluster", "region") else "right")
    running = Counter(w.cluster for w in current if w.state == api.WORKLOAD_STATE_RUNNING)
    for c in sorted(clusters, key=lambda c: (c.carbon_unknown, c.carbon_g_per_kwh)):
        table.add_row(c.name, c.region, "yes" if c.ready else "no", str(c.nodes),
                      "unknown" if c.carbon_unknown else f"{c.carbon_g_per_kwh:.0f}",
                      f"{c.free_milli_cpu / 1000:.0f}", str(c.free_gpus), str(running.get(c.name, 0)))
    console.print(table)


def _print_live_energy(target: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Print the last ten minutes' energy by region and by tenant from the accounting ledger; returns both
    as JSON (empty when the report is unavailable)."""
    import grpc

    from global_scheduler.accounting.report import UNATTRIBUTED_NOTE, ReportQuery
    from global_scheduler.accounting.service import fetch_report

    try:
        # One report, grouped by tenant, also carries the per-region totals of the same ledger
        # snapshot: two fetches from the live ledger would disagree by what landed in between.
        report = fetch_report(target, ReportQuery(
            since=datetime.now(UTC) - timedelta(minutes=10), until=datetime.now(UTC) + timedelta(seconds=1),
            group_by="tenant"))
    except grpc.RpcError as exc:
        console.print(f"[yellow]energy report unavailable: {exc.details()}[/yellow]")  # type: ignore[attr-defined]
        return {}, {}
    etable = Table(title="energy during the live part (from the accounting ledger over gRPC)")
    for col in ("region", "energy Wh", "carbon g", "gCO2/kWh"):
        etable.add_column(col, justify="left" if col == "region" else "right")
    for name, t in sorted(report.regions.items()):
        etable.add_row(name, f"{t.energy_kwh * 1000:.2f}", f"{t.carbon_kg * 1000:.2f}",
                       "–" if t.carbon_intensity_g_per_kwh is None else f"{t.carbon_intensity_g_per_kwh:.0f}")
    console.print(etable)
    ttable = Table(title="the same energy by tenant (shared out by requests), largest first",
                   caption=UNATTRIBUTED_NOTE)
    for col in ("tenant", "energy Wh", "carbon g", "share"):
        ttable.add_column(col, justify="left" if col == "tenant" else "right")
    total_kwh = report.totals.energy_kwh or 1.0
    groups = {k: (t.energy_kwh, t.carbon_kg) for k, t in report.groups.items()}
    for name, kwh, kg in tenant_rows(groups):
        ttable.add_row(name, f"{kwh * 1000:.2f}", f"{kg * 1000:.2f}", f"{100 * kwh / total_kwh:.0f} %")
    console.print(ttable)
    return ({k: v.model_dump(mode="json") for k, v in report.regions.items()},
            {k: v.model_dump(mode="json") for k, v in report.groups.items()})


TOP_TENANTS = 10


def tenant_rows(groups: dict[str, tuple[float, float]], top: int = TOP_TENANTS) -> list[tuple[str, float, float]]:
    """``(tenant, kWh, kg)`` rows, largest first: the unattributed row and the ``top`` largest tenants,
    the rest summed into one ``(N more tenants)`` row so a trace with hundreds of tenants stays readable
    (the JSON keeps every tenant)."""
    from global_scheduler.accounting.table import UNATTRIBUTED_TENANT

    ranked = sorted(groups.items(), key=lambda kv: -kv[1][0])
    shown = [kv for kv in ranked if kv[0] == UNATTRIBUTED_TENANT]
    named = [kv for kv in ranked if kv[0] != UNATTRIBUTED_TENANT]
    shown += named[:top]
    rows = [(name, kwh, kg) for name, (kwh, kg) in sorted(shown, key=lambda kv: -kv[1][0])]
    rest = named[top:]
    if rest:
        rows.append((f"({len(rest)} more tenants)", sum(v[0] for _, v in rest), sum(v[1] for _, v in rest)))
    return rows


def replay_summary(results: dict[str, dict[str, Any]], policy: str = "gnn", baseline: str = "karmada") -> str | None:
    """The replay's one-line verdict: ``policy``'s carbon against ``baseline``'s, "for the same work" only when
    it was, otherwise both amounts of work, the failures when they differ and carbon per replica-hour."""
    from global_scheduler.accounting.work import WorkDone, carbon_claim

    if policy not in results or baseline not in results:
        return None
    mine, theirs = results[policy], results[baseline]
    return carbon_claim(policy=policy, carbon_kg=mine["carbon_kg"], work=WorkDone.from_result(mine),
                        baseline=baseline, baseline_carbon_kg=theirs["carbon_kg"],
                        baseline_work=WorkDone.from_result(theirs))


def replay_part(days: int, clusters: int, save_run: Path | None, traces_dir: Path) -> dict[str, Any]:
    from global_scheduler.accounting.run_store import FederationRunHook, save_federation_run
    from global_scheduler.accounting.work import WorkDone
    from global_scheduler.bench_routing import bench_config, comparison, run_routing_bench

    cfg = bench_config(start="12-01", days=days, clusters=clusters, traces_dir=traces_dir)
    hooks: dict[str, Any] = {}

    def on_interval(name: str) -> Any:
        hooks[name] = FederationRunHook(name)
        return hooks[name]

    policies = ("gnn", "karmada", "least-carbon", "least-carbon-slo")
    with console.status("replaying the held-back window…") as status:
        results = run_routing_bench(cfg, traces_dir=traces_dir, policies=policies, on_interval=on_interval,
                                    progress=lambda name: status.update(f"replaying the held-back window with {name}…"))
    table = Table(title=f"replay: {cfg.clusters} clusters, {len(cfg.regions)} regions, {days} day(s) from {cfg.start}")
    for col in ("policy", "energy kWh", "carbon kg", "SLO viol.", "failures", "deadline miss", "Jain"):
        table.add_column(col, justify="right")
    for name, r in results.items():
        table.add_row(name, f"{r['energy_kwh']:,.0f}", f"{r['carbon_kg']:,.0f}", str(r["slo_violations"]),
                      str(r["failures"]), str(r["deadline_misses"]), f"{r['jain_fairness']:.3f}")
    console.print(table)
    summary = comparison(results)
    line = replay_summary(results)
    if line is not None:
        console.print(line)
    if save_run is not None:
        path = save_federation_run(save_run, hooks, provenance={"command": "meridian demo", "days": days},
                                   work={name: WorkDone.from_result(r) for name, r in results.items()})
        console.print(f"run saved to {path}; report it with: meridian report energy --run {path} --plot energy.png")
    return {"policies": results, "comparison": summary}


def kubernetes_live_part(cfg: Any, traces_dir: Path, *, members: int = 2) -> dict[str, Any]:
    """The live part on real control planes: a hub and ``members`` member clusters started from
    ../shared/k8s (meridian_demo.kube_federation); the DLRM workloads go through the global API and end as
    Deployments whose pods Meridian's regional schedulers bind in the members (read back from them)."""
    import grpc

    from meridian_demo import embedded
    from meridian_demo.kube_federation import KubeFederation, MemberSpec
    from protos import global_api_pb2 as api
    from protos import global_api_pb2_grpc as api_grpc

    regions = [r for r in cfg.regions][:members]
    specs = [MemberSpec(f"{region}-k8s", region, nodes=4) for region in regions]
    started = time.monotonic()
    with KubeFederation(specs, routing=cfg.routing,
                        progress=lambda m: console.print(f"[{time.monotonic() - started:5.1f} s] {m}")) as fed:
        console.print(f"[bold]live on Kubernetes[/bold]: members {', '.join(fed.member_names)} (kube-apiserver "
                      f"v1.36 each, with kube-controller-manager and Meridian's regional scheduler), a hub holding "
                      f"their kubeconfigs, global API on {fed.target}, routing {cfg.routing}")
        requests = embedded.trace_workloads(cfg, traces_dir)
        for req in requests:  # members of 4 × 8 CPUs and no GPUs: the trace's shapes, capped to fit
            req.spec.requests.cpu = "250m"
            req.spec.requests.memory = "256Mi"
            req.spec.requests.gpu = ""
            req.spec.replicas = min(req.spec.replicas, 2)
            req.spec.origin_region, req.spec.latency_slo_ms = regions[0], 0.0
        stub = api_grpc.GlobalSchedulerStub(grpc.insecure_channel(fed.target))
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=console) as progress:
            task = progress.add_task("submitting DLRM workloads", total=len(requests))
            ids = []
            for req in requests:
                ids.append(stub.SubmitWorkload(req, timeout=10).id)
                progress.advance(task)
            task2 = progress.add_task("waiting for their pods to be bound", total=len(ids))
            deadline = time.monotonic() + max(cfg.timeout_s, 120.0)
            bound_states = (api.WORKLOAD_STATE_SCHEDULED, api.WORKLOAD_STATE_RUNNING)
            while True:
                current = [stub.GetWorkload(api.GetWorkloadRequest(id=i), timeout=10) for i in ids]
                settled = sum(w.state in bound_states or w.state == api.WORKLOAD_STATE_FAILED for w in current)
                progress.update(task2, completed=settled)
                if settled == len(ids) or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
        placements = fed.placements()
        table = Table(title="member clusters (read from their API servers)")
        for col in ("cluster", "region", "Deployments", "pods", "bound"):
            table.add_column(col, justify="left" if col in ("cluster", "region") else "right")
        per_member: dict[str, dict[str, int]] = {}
        for spec in specs:
            mine = [p for ps in placements.values() for p in ps if p.cluster == spec.name]
            per_member[spec.name] = {"objects": len(mine), "pods": sum(p.pods for p in mine),
                                     "bound": sum(p.bound for p in mine)}
            table.add_row(spec.name, spec.region, *(str(v) for v in per_member[spec.name].values()))
        console.print(table)
        states = Counter(_state_name(w.state) for w in current)
        in_api = sum(w.state in bound_states for w in current)
        confirmed = sum(1 for w in current if w.state in bound_states and any(
            p.cluster == w.cluster and p.bound == w.spec.replicas for p in placements.get(w.id, [])))
        console.print(f"{confirmed} of {len(ids)} workloads submitted through the API have every replica's pod bound "
                      f"in the member the global scheduler chose (the API says {in_api}); workload states: "
                      + ", ".join(f"{k} {v}" for k, v in sorted(states.items())))
        for wid in ids:
            stub.CancelWorkload(api.CancelWorkloadRequest(id=wid), timeout=10)
    return {"members": per_member, "workloads": len(ids), "bound_confirmed_in_members": confirmed,
            "states": dict(states)}


def demo(
    workloads: int = typer.Option(60, min=1, help="Workloads submitted from the DLRM trace."),
    clusters_per_region: int = typer.Option(1, min=1, help="Simulated clusters per region in the live part."),
    nodes_per_cluster: int = typer.Option(40, min=1, help="openb GPU nodes per simulated cluster."),
    routing: str = typer.Option("gnn", help="Global routing policy."),
    placement: str = typer.Option("fgd", help="Regional placement policy."),
    bus: str | None = typer.Option(None, help="Stream bus URL (default $REDIS_URL, a private redis-server, "
                                   "else memory://)."),
    replay_days: int = typer.Option(2, min=0, help="Days of the held-back window to replay (0 = skip)."),
    replay_clusters: int = typer.Option(12, min=1, help="Clusters in the replay federation."),
    save_run: Path | None = typer.Option(Path("runs/demo"), "--save-run", help="Save the replay's accounting here."),
    json_out: Path | None = typer.Option(None, "--json", help="Write what the demo measured."),
    seed: int = typer.Option(0, help="Seed for cluster cuts and workload sampling."),
    kubernetes: bool = typer.Option(False, "--kubernetes", help="Run the live part on real control planes: a hub "
                                    "and two member clusters started from ../shared/k8s (kube-apiserver, etcd, "
                                    "kube-controller-manager; about a minute and 1.5 GB more)."),
) -> None:
    """Run every tier on this machine: live routing and placement over Redis and gRPC, then a replay."""
    from meridian_demo.embedded import DemoConfig

    try:
        traces = locate_traces()
    except TracesNotFoundError as exc:
        raise typer.BadParameter(str(exc)) from None
    console.print(traces.describe())
    traces_dir = traces.path
    cfg = DemoConfig(clusters_per_region=clusters_per_region, nodes_per_cluster=nodes_per_cluster,
                     workloads=workloads, routing=routing, placement=placement, seed=seed)
    out: dict[str, Any]
    if kubernetes:
        out = {"live_kubernetes": kubernetes_live_part(cfg, traces_dir)}
    else:
        bus_url, private = _choose_bus(bus)
        try:
            out = {"live": live_part(cfg, bus_url, traces_dir)}
        finally:
            if private is not None:
                private.stop()
    if replay_days:
        out["replay"] = replay_part(replay_days, replay_clusters, save_run, traces_dir)
    if json_out is not None:
        json_out.parent.mkdir(parents=True, exist_ok=True)
        json_out.write_text(json.dumps(out, indent=2, default=str))
        console.print(f"wrote {json_out}")


def bench_federation(
    workloads: int = typer.Option(200, min=1, help="Workloads submitted through the API at once."),
    members: int = typer.Option(2, min=2, max=4, help="Member clusters (each a control plane on this machine)."),
    nodes: int = typer.Option(4, min=1, help="Ready Nodes per member (8 CPUs, 32 GiB each; no kubelet)."),
    replicas: int = typer.Option(2, min=1, help="Replicas per workload."),
    routing: str = typer.Option("karmada", help="Global routing policy (karmada spreads by free capacity)."),
    registry_timeout: float = typer.Option(5.0, "--registry-timeout", min=1.0, help="Seconds of silence after "
                                           "which a member is down and its workloads fail over."),
    settle: float = typer.Option(60.0, min=1.0, help="Seconds reconciliation gets after the member returns."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the figures as JSON here."),
) -> None:
    """Dispatch into real member clusters: submit → bound, exactly once, failover, return, cancel."""
    from meridian_demo.bench_federation import render, run, write_json

    started = time.monotonic()
    result = run(workloads=workloads, members=members, nodes=nodes, replicas=replicas, routing=routing,
                 registry_timeout_s=registry_timeout, settle_s=settle,
                 progress=lambda m: console.print(f"[{time.monotonic() - started:6.1f} s] {m}"))
    table = Table(title=f"bench federation: {workloads} workloads × {replicas} replicas, {members} members "
                        f"({result['cpu_count']} cores)")
    for col in ("figure", "value", "target"):
        table.add_column(col, justify="left" if col != "value" else "right")
    for row in render(result):
        table.add_row(*row)
    console.print(table)
    if json_out is not None:
        write_json(result, json_out)
        console.print(f"wrote {json_out}")


def register(cli: CliRoot) -> None:
    cli.app.command("demo")(demo)
    cli.bench.command("federation")(bench_federation)
