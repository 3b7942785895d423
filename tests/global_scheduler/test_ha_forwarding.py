"""Two replicas in high availability (two real gRPC servers on loopback, real Redis): the follower forwards every
call to the leader with the caller's bearer token and relays the leader's errors unchanged; a graceful stop of
the leader hands the lock over, and the new leader restores the store before it answers."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest

from global_scheduler.errors import error_details
from global_scheduler.leadership import LeaderRecord, Replica
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import RunningServer, build_server
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus import open_bus
from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from protos import global_api_pb2_grpc as api_grpc
from tests.global_api_helpers import AUTH, TOKEN, spec


def _replica_server(redis_url: str, key_prefix: str) -> RunningServer:
    settings = GlobalSchedulerSettings(
        api={"listen": "127.0.0.1:0", "auth_tokens": [TOKEN], "max_workers": 16},
        bus={"url": redis_url, "key_prefix": key_prefix, "block_ms": 50},
        routing={"policy": "karmada", "worker_process": False},
        ha={"enabled": True, "lease_duration_s": 2.0, "renew_deadline_s": 1.4, "retry_period_s": 0.1,
            "forward_timeout_s": 10.0})
    replica = Replica.from_settings(settings, make_engine=lambda fence: GlobalScheduler(
        settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix), fence=fence))
    return build_server(None, settings, replica=replica)


@pytest.fixture
def pair(redis_url: str, key_prefix: str) -> Iterator[tuple[RunningServer, RunningServer]]:
    first = _replica_server(redis_url, key_prefix)
    assert first.replica is not None
    wait_for(first.replica.leading, timeout=30, message="the first replica to lead")
    second = _replica_server(redis_url, key_prefix)
    yield first, second
    for s in (second, first):
        s.stop(0.2)


def _stub(server: RunningServer) -> api_grpc.GlobalSchedulerStub:
    return api_grpc.GlobalSchedulerStub(grpc.insecure_channel(f"127.0.0.1:{server.port}"))


def test_a_follower_forwards_with_the_callers_token_and_relays_errors(pair) -> None:
    leader, follower = pair
    assert follower.replica is not None and not follower.replica.leading()
    wait_for(lambda: follower.replica.leader() is not None,
             timeout=10, message="the follower to see the leader")
    via_follower, via_leader = _stub(follower), _stub(leader)
    w = via_follower.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k1"), metadata=AUTH,
                                    timeout=10)
    assert via_leader.GetWorkload(api.GetWorkloadRequest(id=w.id), metadata=AUTH, timeout=10).id == w.id
    assert via_follower.GetWorkload(api.GetWorkloadRequest(id=w.id), metadata=AUTH, timeout=10) == \
        via_leader.GetWorkload(api.GetWorkloadRequest(id=w.id), metadata=AUTH, timeout=10)
    # The same key through the other replica: the same workload (one store, the leader's).
    again = via_leader.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k1"), metadata=AUTH,
                                      timeout=10)
    assert again.id == w.id
    keyless = via_follower.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec()), metadata=AUTH, timeout=10)
    page = via_follower.ListWorkloads(api.ListWorkloadsRequest(), metadata=AUTH, timeout=10)
    assert {x.id for x in page.workloads} == {w.id, keyless.id}
    watch = via_follower.WatchWorkload(api.WatchWorkloadRequest(id=w.id), metadata=AUTH, timeout=30)
    assert next(watch).id == w.id
    assert leader.streams is not None and leader.streams.open == 1  # the follower's stream to the leader
    watch.cancel()  # the caller leaves: the follower ends its stream to the leader too
    wait_for(lambda: leader.streams.open == 0, timeout=10, message="the leader's stream to close")
    # The leader's error, code, message and details unchanged.
    with pytest.raises(grpc.RpcError) as err:
        via_follower.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(replicas=0)), metadata=AUTH, timeout=10)
    details = error_details(err.value)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and details.fields == ("spec.replicas",)
    with pytest.raises(grpc.RpcError) as err:
        via_follower.GetWorkload(api.GetWorkloadRequest(id="f" * 32), metadata=AUTH, timeout=10)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND and error_details(err.value).reason == "WORKLOAD_NOT_FOUND"
    # No token: refused by the follower itself (the leader checks the forwarded token again).
    with pytest.raises(grpc.RpcError) as err:
        via_follower.GetWorkload(api.GetWorkloadRequest(id=w.id), timeout=10)
    assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_a_graceful_stop_hands_over_and_the_new_leader_restores_the_store(pair, redis_url: str,
                                                                          key_prefix: str) -> None:
    leader, follower = pair
    via_follower = _stub(follower)
    ids = [via_follower.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key=f"k{i}"),
                                       metadata=AUTH, timeout=10).id for i in range(5)]
    assert leader.replica is not None and follower.replica is not None
    epoch = leader.replica.elector.record.epoch
    leader.stop(0.2)  # stops routing, then deletes the lock: the follower takes it at its next try
    wait_for(follower.replica.leading, timeout=10, message="the follower to lead")
    record = LeaderRecord.parse(open_bus(redis_url, key_prefix=key_prefix).get_value("meridian:global:leader"))
    assert record is not None and record.epoch == epoch + 1 and record.advertise == follower.replica.advertise
    for wid in ids:  # restored from Redis before the new leader answered
        assert via_follower.GetWorkload(api.GetWorkloadRequest(id=wid), metadata=AUTH, timeout=10).id == wid
    assert via_follower.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="k0"), metadata=AUTH,
                                       timeout=10).id == ids[0]


def test_a_deposed_leader_forwards_at_once_and_keeps_no_engine_of_its_term(pair, redis_url: str,
                                                                           key_prefix: str) -> None:
    leader, follower = pair
    assert leader.replica is not None and follower.replica is not None
    via_leader = _stub(leader)
    wid = via_leader.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="before"), metadata=AUTH,
                                    timeout=10).id
    term_engine = leader.replica.engine
    # The lock is lost (as if it expired during a partition): the follower takes it at its next try, and the
    # old leader's next renewal is refused.
    open_bus(redis_url, key_prefix=key_prefix).delete("meridian:global:leader")
    wait_for(follower.replica.leading, timeout=10, message="the follower to lead")
    wait_for(lambda: not leader.replica.leading(), timeout=10, message="the old leader to step down")
    wait_for(lambda: leader.replica.engine is not term_engine, timeout=10, message="a fresh standby engine")
    assert term_engine._stop.is_set()  # the term's workers were stopped
    # Calls to the old leader are forwarded to the new one, which restored what the old one had accepted.
    assert via_leader.GetWorkload(api.GetWorkloadRequest(id=wid), metadata=AUTH, timeout=10).id == wid
    new = via_leader.SubmitWorkload(api.SubmitWorkloadRequest(spec=spec(), idempotency_key="after"), metadata=AUTH,
                                    timeout=10)
    assert follower.replica.engine.store.get(new.id) is not None
    assert len(leader.replica.engine.store) == 0  # the standby holds nothing
