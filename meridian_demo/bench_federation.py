"""``meridian bench federation``: dispatch into real member clusters, exactly once, and failover.

On a :class:`~meridian_demo.kube_federation.KubeFederation` (a hub and member control planes from
``../shared/k8s``, Meridian's regional scheduler in each member, the global scheduler and its API):

1. **submit → bound**: ``--workloads`` services are submitted through the gRPC API at once; a workload
   counts as bound when the API says every replica is (``SCHEDULED``, which the member reports once each
   replica's pod has a node). The API is polled every 0.1 s, so a figure is up to 0.1 s late.
2. **exactly once**: every member's Deployments and Jobs are listed (through the federation file's hub
   Secrets, not Meridian's view): ``duplicates`` counts workloads with more than one object, anywhere;
   ``missing`` those with none; every object must have all its replicas' pods bound.
3. **failover**: the API server of the member holding the most workloads is stopped; ``failover_s`` is
   the time until every workload it held is bound in another member (the target: registry timeout +
   10 s).
4. **return**: the API server starts again; ``running_in_two_clusters`` counts, once reconciliation has
   had ``--settle`` seconds, the workloads with objects in two members; ``reconcile_s`` is the time until
   none had.
5. **cancel**: every workload is cancelled; ``left_after_cancel`` counts the objects and pods left.

The figures are this machine's, three control planes sharing its cores; the JSON records the core count.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from meridian_demo.kube_federation import KubeFederation, MemberSpec, Placed
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

BOUND = (api.WORKLOAD_STATE_SCHEDULED, api.WORKLOAD_STATE_RUNNING, api.WORKLOAD_STATE_SUCCEEDED)
REGIONS = ("eu-north", "eu-west", "eu-central", "us-west")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def list_all(stub: api_grpc.GlobalSchedulerStub) -> dict[str, api.Workload]:
    out: dict[str, api.Workload] = {}
    token = ""
    while True:
        page = stub.ListWorkloads(api.ListWorkloadsRequest(page_size=1000, page_token=token), timeout=30)
        out.update((w.id, w) for w in page.workloads)
        token = page.next_page_token
        if not token:
            return out


def wait_until(predicate: Callable[[], Any], timeout_s: float, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(every_s)


def run(*, workloads: int = 200, members: int = 2, nodes: int = 4, replicas: int = 2, cpu: str = "50m",
        memory: str = "64Mi", routing: str = "karmada", registry_timeout_s: float = 5.0, settle_s: float = 60.0,
        timeout_s: float = 300.0, progress: Callable[[str], None] = print) -> dict[str, Any]:
    specs = [MemberSpec(f"member-{chr(ord('a') + i)}", REGIONS[i % len(REGIONS)], nodes=nodes)
             for i in range(members)]
    result: dict[str, Any] = {"workloads": workloads, "members": members, "nodes_per_member": nodes,
                              "replicas": replicas, "routing": routing, "registry_timeout_s": registry_timeout_s,
                              "failover_target_s": registry_timeout_s + 10.0, "cpu_count": os.cpu_count()}
    with KubeFederation(specs, routing=routing, registry_timeout_s=registry_timeout_s, progress=progress) as fed:
        stub = api_grpc.GlobalSchedulerStub(grpc.insecure_channel(fed.target))

        # 1. submit → bound
        progress(f"submitting {workloads} workloads of {replicas} replicas through the API")
        submitted = _submit_all(stub, workloads=workloads, replicas=replicas, cpu=cpu, memory=memory)
        bound_at = _wait_bound(stub, submitted, timeout_s)
        latencies = [bound_at[w] - submitted.monotonic[w] for w in bound_at]
        result.update(bound=len(bound_at), submit_to_bound_p50_s=percentile(latencies, 50),
                      submit_to_bound_p99_s=percentile(latencies, 99),
                      submit_to_bound_max_s=max(latencies, default=float("nan")))
        progress(f"{len(bound_at)}/{workloads} bound; p50 {result['submit_to_bound_p50_s']:.2f} s, "
                 f"p99 {result['submit_to_bound_p99_s']:.2f} s")

        # 2. exactly once, read from the members
        placements = _check_exactly_once(fed, result, submitted, bound_at, replicas=replicas, progress=progress)
        # 3. failover
        lost = _fail_over(fed, stub, result, placements, submitted, timeout_s=timeout_s, progress=progress)
        # 4. the member returns
        _return_member(fed, result, lost, submitted, settle_s=settle_s, progress=progress)
        # 5. cancel
        _cancel_all(fed, stub, result, submitted, progress=progress)
    result["stdev_submit_to_bound_s"] = statistics.pstdev(latencies) if latencies else float("nan")
    return result


@dataclass
class _Submitted:
    """When each workload was submitted, by id: on the monotonic clock and as a unix time."""

    monotonic: dict[str, float] = field(default_factory=dict)
    unix: dict[str, float] = field(default_factory=dict)


def _submit_all(stub: api_grpc.GlobalSchedulerStub, *, workloads: int, replicas: int, cpu: str,
                memory: str) -> _Submitted:
    """Submit ``workloads`` services through the API at once (eight calls in flight)."""
    submitted = _Submitted()

    def submit(i: int) -> None:
        spec = api.WorkloadSpec(name=f"svc-{i}", tenant=f"tenant-{i % 5}", replicas=replicas,
                                requests=api.ResourceQuantities(cpu=cpu, memory=memory))
        started, started_unix = time.monotonic(), time.time()
        w = stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec, idempotency_key=f"bench-fed-{i}"),
                                timeout=30)
        submitted.monotonic[w.id] = started
        submitted.unix[w.id] = started_unix

    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(submit, range(workloads)))
    return submitted


def _wait_bound(stub: api_grpc.GlobalSchedulerStub, submitted: _Submitted, timeout_s: float) -> dict[str, float]:
    """Poll the API every 0.1 s until every submitted workload is bound (or ``timeout_s``); returns when
    each was first seen bound, on the monotonic clock."""
    bound_at: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while len(bound_at) < len(submitted.monotonic) and time.monotonic() < deadline:
        now = time.monotonic()
        for wid, w in list_all(stub).items():
            if wid in submitted.monotonic and wid not in bound_at and w.state in BOUND:
                bound_at[wid] = now
        time.sleep(0.1)
    return bound_at


def _check_exactly_once(fed: KubeFederation, result: dict[str, Any], submitted: _Submitted,
                        bound_at: dict[str, float], *, replicas: int,
                        progress: Callable[[str], None]) -> dict[str, list[Placed]]:
    """Count duplicates, missing and not fully bound objects in the members, and where the time went;
    returns the placements read."""
    placements = fed.placements()
    result["duplicates"] = sum(1 for wid in submitted.monotonic if len(placements.get(wid, [])) > 1)
    result["missing"] = sum(1 for wid in submitted.monotonic if not placements.get(wid))
    result["objects_not_fully_bound"] = sum(1 for wid in submitted.monotonic for p in placements.get(wid, [])
                                            if p.bound < replicas)
    result["per_member"] = {name: sum(1 for ps in placements.values() for p in ps if p.cluster == name)
                            for name in fed.member_names}
    stages = _stage_times(placements, submitted, bound_at)
    result["stages_p50_s"] = {k: percentile(v, 50) for k, v in stages.items()}
    result["stages_p99_s"] = {k: percentile(v, 99) for k, v in stages.items()}
    progress("stages p50/p99 (s, whole-second stamps): " + ", ".join(
        f"{k.removesuffix('_s')} {result['stages_p50_s'][k]:.1f}/{result['stages_p99_s'][k]:.1f}" for k in stages))
    return placements


def _stage_times(placements: dict[str, list[Placed]], submitted: _Submitted,
                 bound_at: dict[str, float]) -> dict[str, list[float]]:
    """Where the time goes, from the members' own timestamps (whole seconds: the API server's resolution)."""
    stages: dict[str, list[float]] = {"submit_to_object_created_s": [], "object_created_to_pods_bound_s": [],
                                      "pods_bound_to_api_s": []}
    for wid, ps in placements.items():
        if wid not in bound_at or len(ps) != 1 or not ps[0].last_bound_unix_s:
            continue
        p = ps[0]
        api_unix = submitted.unix[wid] + (bound_at[wid] - submitted.monotonic[wid])
        stages["submit_to_object_created_s"].append(p.created_unix_s - submitted.unix[wid])
        stages["object_created_to_pods_bound_s"].append(p.last_bound_unix_s - p.created_unix_s)
        stages["pods_bound_to_api_s"].append(api_unix - p.last_bound_unix_s)
    return stages


def _fail_over(fed: KubeFederation, stub: api_grpc.GlobalSchedulerStub, result: dict[str, Any],
               placements: dict[str, list[Placed]], submitted: _Submitted, *, timeout_s: float,
               progress: Callable[[str], None]) -> str:
    """Stop the API server of the member holding the most workloads and time their move elsewhere;
    returns that member's name."""
    per_member: dict[str, int] = result["per_member"]
    lost = max(per_member, key=lambda n: per_member[n])
    on_lost = [wid for wid, ps in placements.items()
               if wid in submitted.monotonic and any(p.cluster == lost for p in ps)]
    progress(f"stopping {lost}'s API server ({len(on_lost)} workloads there)")
    started = time.monotonic()
    fed.stop_member_api(lost)

    def all_moved() -> bool:
        current = list_all(stub)
        return all(current[w].cluster not in ("", lost) and current[w].state in BOUND for w in on_lost)

    moved = wait_until(all_moved, timeout_s, every_s=0.1)
    result["failover_s"] = time.monotonic() - started if moved else float("nan")
    result["failed_over"] = len(on_lost) if moved else sum(
        1 for w in on_lost if (x := list_all(stub)[w]).cluster != lost and x.state in BOUND)
    progress(f"failover: {result['failed_over']}/{len(on_lost)} bound elsewhere after "
             f"{result['failover_s']:.1f} s")
    return lost


def _return_member(fed: KubeFederation, result: dict[str, Any], lost: str, submitted: _Submitted, *,
                   settle_s: float, progress: Callable[[str], None]) -> None:
    """Start the lost member's API server again and time the reconciliation of workloads in two members."""
    progress(f"starting {lost}'s API server again")
    fed.start_member_api(lost)
    returned = time.monotonic()

    def in_two() -> int:
        now = fed.placements()
        return sum(1 for wid in submitted.monotonic if len({p.cluster for p in now.get(wid, [])}) > 1)

    reconciled = wait_until(lambda: in_two() == 0, settle_s, every_s=0.5)
    result["reconcile_s"] = time.monotonic() - returned if reconciled else float("nan")
    result["running_in_two_clusters"] = in_two()
    placements = fed.placements()
    result["duplicates_after_return"] = sum(1 for wid in submitted.monotonic if len(placements.get(wid, [])) > 1)
    result["missing_after_return"] = sum(1 for wid in submitted.monotonic if not placements.get(wid))


def _cancel_all(fed: KubeFederation, stub: api_grpc.GlobalSchedulerStub, result: dict[str, Any],
                submitted: _Submitted, *, progress: Callable[[str], None]) -> None:
    """Cancel every workload and count the objects and pods left once the members have emptied (or 120 s)."""
    progress("cancelling every workload")
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda wid: stub.CancelWorkload(api.CancelWorkloadRequest(id=wid), timeout=30),
                      submitted.monotonic))
    wait_until(lambda: not fed.placements() and all(fed.live_pods(n) == 0 for n in fed.member_names), 120)
    result["left_after_cancel"] = sum(len(ps) for ps in fed.placements().values()) + sum(
        fed.live_pods(n) for n in fed.member_names)


def render(result: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(figure, value, target) rows for the table."""
    def s(v: float) -> str:
        return f"{v:.2f} s"

    return [
        ("workloads bound", f"{result['bound']}/{result['workloads']}", "all"),
        ("submit → bound p50", s(result["submit_to_bound_p50_s"]), ""),
        ("submit → bound p99", s(result["submit_to_bound_p99_s"]), "≤ 5 s (200 workloads)"),
        ("duplicates", str(result["duplicates"]), "0"),
        ("missing", str(result["missing"]), "0"),
        ("objects not fully bound", str(result["objects_not_fully_bound"]), "0"),
        ("failover", s(result["failover_s"]), f"≤ {result['failover_target_s']:.0f} s (registry timeout + 10 s)"),
        ("running in two clusters after return", str(result["running_in_two_clusters"]), "0"),
        ("reconciled after return", s(result["reconcile_s"]), ""),
        ("left after cancel", str(result["left_after_cancel"]), "0"),
    ]


def write_json(result: dict[str, Any], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2, default=str))
