"""Meridian across real clusters, end to end: a hub and two member clusters (three kube-apiservers, each
member with kube-controller-manager and Meridian's regional scheduler as its own process), the global
scheduler with its gRPC API, and a private Redis (:mod:`meridian_demo.kube_federation`).

Workloads are submitted through the API; their Deployments and Jobs appear in the chosen member and its
pods are bound there; one member's API server is stopped and its workloads are re-created in the other;
it comes back and its stale copies are deleted; cancel removes everything. Every check of a member reads
its API server (through the federation file's hub Secrets), never Meridian's own view.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import grpc
import pytest

from meridian.bus import MOVES_STREAM, open_bus
from meridian.envtest import wait_for
from meridian_demo.kube_federation import KubeFederation, MemberSpec, Placed
from protos import dispatch_pb2 as dpb
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc

pytestmark = [pytest.mark.kubernetes, pytest.mark.slow]

BOUND = (api.WORKLOAD_STATE_SCHEDULED, api.WORKLOAD_STATE_RUNNING)


@pytest.fixture(scope="module")
def federation() -> Iterator[KubeFederation]:
    members = [MemberSpec("member-a", "eu-north", nodes=2), MemberSpec("member-b", "eu-west", nodes=2)]
    with KubeFederation(members, routing="round-robin", registry_timeout_s=5.0, api_silence_s=2.0) as fed:
        yield fed


@pytest.fixture(scope="module")
def stub(federation: KubeFederation) -> api_grpc.GlobalSchedulerStub:
    return api_grpc.GlobalSchedulerStub(grpc.insecure_channel(federation.target))


def submit(stub: api_grpc.GlobalSchedulerStub, name: str, **kw: object) -> api.Workload:
    spec = api.WorkloadSpec(name=name, tenant="shop", replicas=2, requests=api.ResourceQuantities(cpu="500m",
                                                                                                  memory="256Mi"))
    for key, value in kw.items():
        if key == "requests":
            spec.requests.CopyFrom(value)
        else:
            setattr(spec, key, value)
    return stub.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec, idempotency_key=f"e2e-{name}"), timeout=10)


def get(stub: api_grpc.GlobalSchedulerStub, wid: str) -> api.Workload:
    return stub.GetWorkload(api.GetWorkloadRequest(id=wid), timeout=10)


def where(federation: KubeFederation, wid: str, members: list[str] | None = None) -> list[Placed]:
    return federation.placements(members).get(wid, [])


def bound_in(federation: KubeFederation, stub: api_grpc.GlobalSchedulerStub, wid: str) -> Placed | None:
    """The workload's one object, in the cluster the API names, with every replica's pod bound there."""
    w = get(stub, wid)
    if w.state not in BOUND:
        return None
    placed = where(federation, wid, [w.cluster])
    if len(placed) == 1 and placed[0].attempt == w.attempt and placed[0].bound == w.spec.replicas:
        return placed[0]
    return None


def test_dispatch_failover_return_and_cancel_on_real_clusters(federation: KubeFederation,
                                                              stub: api_grpc.GlobalSchedulerStub) -> None:
    # 1. Submitted through the API: a service becomes a Deployment, batch work a Job, in one member each
    #    (round-robin), every replica's pod bound there by Meridian's regional scheduler.
    web = submit(stub, "web")
    batch = submit(stub, "etl", workload_class="batch", replicas=1)
    placed = {w.id: wait_for(lambda w=w: bound_in(federation, stub, w.id),
                             timeout=120, message=f"{w.spec.name} bound")
              for w in (web, batch)}
    assert placed[web.id].kind == "Deployment" and placed[batch.id].kind == "Job"
    assert {p.cluster for p in placed.values()} == set(federation.member_names)
    for w in (web, batch):
        assert len(where(federation, w.id)) == 1  # in no other cluster
        got = get(stub, w.id)
        assert list(got.nodes) and all(n.startswith(got.cluster) for n in got.nodes)

    # 2. The member holding the service loses its API server: after the registry timeout the service is
    #    re-created in the other member, and the move is recorded.
    lost = placed[web.id].cluster
    other = next(n for n in federation.member_names if n != lost)
    started = time.monotonic()
    federation.stop_member_api(lost)
    moved = wait_for(lambda: (w := get(stub, web.id)).cluster == other and w.state in BOUND and w,
                     timeout=90, interval=0.05, message="the service to fail over")
    wait_for(lambda: bound_in(federation, stub, web.id),
             timeout=60, interval=0.05, message="the service's pods bound in the other member")
    failover_s = time.monotonic() - started
    assert moved.attempt >= 2
    assert failover_s < federation.registry_timeout_s + 30, failover_s
    bus = open_bus(federation.bus_url or "")
    moves = [dpb.WorkloadMove.FromString(e.payload) for e in bus.read_range(MOVES_STREAM)]
    assert any(m.workload_id == web.id and m.kind == "failover" and m.from_cluster == lost for m in moves)

    # 3. It comes back: the stale copy there is deleted, so the service runs in one cluster only.
    federation.start_member_api(lost)
    wait_for(lambda: not where(federation, web.id, [lost]),
             timeout=90, message="the stale copy to be deleted")
    assert [p.cluster for p in where(federation, web.id)] == [other]
    wait_for(lambda: lost in {c.name for c in stub.ListClusters(api.ListClustersRequest(), timeout=10).clusters
                              if c.ready}, timeout=60, message="the member to report again")

    # 4. Cancel: every object and pod goes, in both members.
    for w in (web, batch):
        assert stub.CancelWorkload(api.CancelWorkloadRequest(id=w.id), timeout=10).state == \
            api.WORKLOAD_STATE_CANCELLED
    wait_for(lambda: not any(where(federation, w.id) for w in (web, batch)),
             timeout=60, message="the objects to be deleted")
    wait_for(lambda: all(federation.live_pods(n) == 0 for n in federation.member_names),
             timeout=60, message="the pods to go")
    bus.close()


def test_a_workload_no_member_can_place_waits_with_the_schedulers_reason(
        federation: KubeFederation, stub: api_grpc.GlobalSchedulerStub) -> None:
    # Three replicas of 5 CPUs: a member's free total (2 nodes of 8) and its largest node fit them as the
    # global tier sees it, but only one fits per node. The member's scheduler says why the third waits, and
    # the API shows it.
    big = submit(stub, "big", replicas=3, requests=api.ResourceQuantities(cpu="5", memory="1Gi"))
    # Two replicas fit (one per node), the third waits: the member's count and its scheduler's reason.
    w = wait_for(lambda: "2/3 replicas placed" in (x := get(stub, big.id)).message and x,
                 timeout=60, message="the member's reason in the API")
    assert w.message.startswith(f"waiting on {w.cluster}: ") and "Insufficient cpu" in w.message, w.message
    assert w.state == api.WORKLOAD_STATE_DISPATCHED
    stub.CancelWorkload(api.CancelWorkloadRequest(id=big.id), timeout=10)
    wait_for(lambda: not where(federation, big.id), timeout=60, message="the objects to be deleted")
