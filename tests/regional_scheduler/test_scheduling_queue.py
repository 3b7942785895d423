"""The scheduling queue: active order, back-off, unschedulable and parked pods, on a fake clock.

``pop(timeout_s=0)`` looks once and never waits, so the fake clock alone decides what is due.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from regional_scheduler.scheduling_queue import QueuedPod, SchedulingQueue


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _obj(name: str, *, priority: int | None = None, cpu: str = "100m", rv: str = "1") -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}}}],
                            "schedulerName": "meridian"}
    if priority is not None:
        spec["priority"] = priority
    return {"metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "labels": {"app": name}},
            "spec": spec, "status": {"phase": "Pending"}}


def _queue(clock: FakeClock, **kw: float) -> SchedulingQueue:
    kw = {"initial_backoff_s": 1.0, "max_backoff_s": 10.0, "flush_after_s": 60.0, **kw}
    return SchedulingQueue(clock=clock, **kw)


def _pop(q: SchedulingQueue) -> QueuedPod | None:
    return q.pop(timeout_s=0)


def _drain(q: SchedulingQueue) -> list[str]:
    keys = []
    while (entry := _pop(q)) is not None:
        keys.append(entry.key)
    return keys


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def _unschedulable_pod(q: SchedulingQueue, key: str = "ns/a") -> QueuedPod:
    q.add(key, _obj(key))
    entry = _pop(q)
    assert entry is not None and entry.key == key
    q.unschedulable(entry)
    return entry


# ---------------------------------------------------------------------- active order


def test_priority_then_fifo(clock: FakeClock) -> None:
    q = _queue(clock)
    for t, (key, priority) in enumerate([("ns/low-1", 0), ("ns/high-1", 10), ("ns/mid", 5), ("ns/high-2", 10),
                                         ("ns/low-2", None)]):
        clock.now = float(t)
        q.add(key, _obj(key, priority=priority))
    assert _drain(q) == ["ns/high-1", "ns/high-2", "ns/mid", "ns/low-1", "ns/low-2"]


def test_fifo_at_the_same_instant_follows_arrival(clock: FakeClock) -> None:
    q = _queue(clock)
    for key in ("ns/c", "ns/a", "ns/b"):
        q.add(key, _obj(key))
    assert _drain(q) == ["ns/c", "ns/a", "ns/b"]


def test_pop_marks_in_flight_and_counts_attempts(clock: FakeClock) -> None:
    q = _queue(clock)
    clock.now = 5.0
    q.add("ns/a", _obj("ns/a"))
    entry = _pop(q)
    assert entry is not None
    assert (entry.where, entry.attempts, entry.last_attempt_s) == ("in-flight", 1, 5.0)
    assert _pop(q) is None
    q.done(entry)
    assert len(q) == 0


def test_update_of_active_pod_keeps_one_entry(clock: FakeClock) -> None:
    q = _queue(clock)
    q.add("ns/a", _obj("ns/a"))
    q.add("ns/a", _obj("ns/a", cpu="200m", rv="2"))
    entry = _pop(q)
    assert entry is not None and entry.obj["metadata"]["resourceVersion"] == "2"
    assert _pop(q) is None


# ---------------------------------------------------------------------- unschedulable pods


def test_unschedulable_waits_for_cluster_change_then_backoff(clock: FakeClock) -> None:
    q = _queue(clock)
    _unschedulable_pod(q)  # attempted at t=0: back-off 1 s
    clock.now = 30.0  # long past the back-off, but nothing changed
    assert _pop(q) is None
    assert q.counts()["unschedulable"] == 1
    q.cluster_changed()
    assert q.counts()["backoff"] == 1
    entry = _pop(q)  # due at 0 + 1 s, long past
    assert entry is not None and entry.key == "ns/a" and entry.attempts == 2


def test_cluster_change_within_backoff_waits_for_it(clock: FakeClock) -> None:
    q = _queue(clock)
    clock.now = 10.0
    _unschedulable_pod(q)  # attempt 1 at t=10: back-off 1 s, due at 11
    clock.now = 10.2
    q.cluster_changed()
    assert _pop(q) is None
    clock.now = 10.999
    assert _pop(q) is None
    clock.now = 11.0
    entry = _pop(q)
    assert entry is not None and entry.key == "ns/a"


def test_unschedulable_flushed_after_flush_after_s(clock: FakeClock) -> None:
    q = _queue(clock, flush_after_s=60.0)
    clock.now = 100.0
    _unschedulable_pod(q)  # unschedulable since t=100: flushed at 160
    clock.now = 159.9
    assert _pop(q) is None
    clock.now = 160.0
    entry = _pop(q)
    assert entry is not None and entry.key == "ns/a"


def test_cluster_change_affects_only_unschedulable_pods(clock: FakeClock) -> None:
    q = _queue(clock)
    stuck = _unschedulable_pod(q, "ns/stuck")
    q.add("ns/parked", _obj("ns/parked"))
    parked = _pop(q)
    assert parked is not None
    q.park(parked)
    clock.now = 5.0
    q.cluster_changed()
    assert _drain(q) == [stuck.key]
    assert q.counts()["parked"] == 1


def test_unschedulable_twice_needs_a_second_change(clock: FakeClock) -> None:
    q = _queue(clock)
    entry = _unschedulable_pod(q)
    q.cluster_changed()
    clock.now = 1.0
    entry = _pop(q)
    assert entry is not None
    q.unschedulable(entry)
    clock.now = 20.0
    assert _pop(q) is None  # the first change was spent on the first retry
    q.cluster_changed()
    assert _pop(q) is entry


@pytest.mark.parametrize(
    ("attempts", "backoff_s"),
    [
        # initial × 2^(attempts - 1), capped at the maximum (1 s initial, 10 s maximum).
        pytest.param(1, 1.0, id="first"),
        pytest.param(2, 2.0, id="second-doubles"),
        pytest.param(3, 4.0, id="third"),
        pytest.param(4, 8.0, id="fourth"),
        pytest.param(5, 10.0, id="capped-16-to-10"),
        pytest.param(9, 10.0, id="stays-capped"),
    ],
)
def test_backoff_doubles_up_to_max(clock: FakeClock, attempts: int, backoff_s: float) -> None:
    q = _queue(clock, initial_backoff_s=1.0, max_backoff_s=10.0)
    q.add("ns/a", _obj("ns/a"))
    for _ in range(attempts - 1):  # earlier attempts, each retried once its back-off has long run out
        entry = _pop(q)
        assert entry is not None
        q.retry(entry.key)
        clock.now += 1000.0
    entry = _pop(q)
    assert entry is not None and entry.attempts == attempts
    start = clock.now
    q.retry(entry.key)
    clock.now = start + backoff_s - 0.001
    assert _pop(q) is None
    clock.now = start + backoff_s
    assert _pop(q) is entry


def test_retry_puts_pod_back_after_backoff(clock: FakeClock) -> None:
    q = _queue(clock, initial_backoff_s=2.0)
    clock.now = 50.0
    q.add("ns/a", _obj("ns/a"))
    entry = _pop(q)
    assert entry is not None
    q.retry("ns/a")  # attempt 1 at t=50: due at 52
    assert q.counts()["backoff"] == 1
    clock.now = 51.9
    assert _pop(q) is None
    clock.now = 52.0
    assert _pop(q) is entry


def test_retry_of_a_pod_that_left_the_queue(clock: FakeClock) -> None:
    q = _queue(clock)
    q.retry("ns/gone")  # unknown and no object: nothing to retry
    assert len(q) == 0
    clock.now = 7.0
    q.retry("ns/a", _obj("ns/a"))  # handed to the binder, binding failed: back after 1 s
    assert q.counts()["backoff"] == 1
    clock.now = 7.5
    assert _pop(q) is None
    clock.now = 8.0
    entry = _pop(q)
    assert entry is not None and entry.key == "ns/a" and entry.attempts == 2


# ---------------------------------------------------------------------- updates of queued pods


def _status_update(obj: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(obj)
    updated["metadata"]["resourceVersion"] = "99"
    updated["metadata"]["managedFields"] = [{"manager": "meridian"}]
    updated["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]
    return updated


def _spec_update(obj: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(obj)
    updated["spec"]["containers"][0]["resources"]["requests"]["cpu"] = "50m"
    return updated


def _label_update(obj: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(obj)
    updated["metadata"]["labels"]["tier"] = "gold"
    return updated


def _annotation_update(obj: dict[str, Any]) -> dict[str, Any]:
    updated = copy.deepcopy(obj)
    updated["metadata"]["annotations"] = {"note": "x"}
    return updated


@pytest.mark.parametrize(
    ("update", "wakes"),
    [
        pytest.param(_status_update, False, id="status-only"),
        pytest.param(_spec_update, True, id="spec"),
        pytest.param(_label_update, True, id="labels"),
        pytest.param(_annotation_update, True, id="annotations"),
    ],
)
def test_update_of_unschedulable_pod(clock: FakeClock, update: Any, wakes: bool) -> None:
    q = _queue(clock)
    entry = _unschedulable_pod(q)
    clock.now = 5.0
    q.add("ns/a", update(entry.obj))
    popped = _pop(q)
    assert (popped is not None) is wakes
    assert q.counts()["unschedulable"] == (0 if wakes else 1)


@pytest.mark.parametrize(
    ("update", "wakes"),
    [
        pytest.param(_status_update, False, id="status-only"),
        pytest.param(_spec_update, True, id="spec"),
    ],
)
def test_parked_pod_comes_back_only_on_its_own_update(clock: FakeClock, update: Any, wakes: bool) -> None:
    q = _queue(clock, flush_after_s=60.0)
    q.add("ns/a", _obj("ns/a"))
    entry = _pop(q)
    assert entry is not None
    q.park(entry)
    clock.now = 1000.0  # past any flush
    q.cluster_changed()
    assert _pop(q) is None
    assert q.counts()["parked"] == 1
    q.add("ns/a", update(entry.obj))
    popped = _pop(q)
    assert (popped is not None) is wakes
    if wakes:
        assert popped is entry and popped.obj["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "50m"


def test_spec_update_wakes_only_after_backoff(clock: FakeClock) -> None:
    q = _queue(clock, initial_backoff_s=4.0)
    entry = _unschedulable_pod(q)  # attempt 1 at t=0: due at 4
    clock.now = 1.0
    q.add("ns/a", _spec_update(entry.obj))
    assert _pop(q) is None
    clock.now = 4.0
    assert _pop(q) is entry


def test_cluster_change_while_in_flight_is_not_lost(clock: FakeClock) -> None:
    """A node added while the pod was being decided (on the state before it) must wake the pod, as
    kube-scheduler's moveRequestCycle does, instead of stranding it until the flush."""
    q = _queue(clock, flush_after_s=60.0)
    q.add("ns/a", _obj("ns/a"))
    entry = _pop(q)
    assert entry is not None
    q.cluster_changed()  # the informer thread, between the decision and unschedulable()
    q.unschedulable(entry)
    assert q.counts()["backoff"] == 1
    clock.now = 1.0  # back-off of attempt 1
    assert _pop(q) is entry


def test_spec_update_while_in_flight_is_not_lost(clock: FakeClock) -> None:
    """An edit that lands while the pod is being decided on its old spec wakes it once it is refused
    (parked) or found unschedulable."""
    q = _queue(clock)
    for key, verdict in (("ns/refused", "park"), ("ns/stuck", "unschedulable")):
        q.add(key, _obj(key))
        entry = _pop(q)
        assert entry is not None
        q.add(key, _spec_update(entry.obj))
        getattr(q, verdict)(entry)
    clock.now = 1.0
    assert sorted(_drain(q)) == ["ns/refused", "ns/stuck"]


def test_status_update_while_in_flight_does_not_wake(clock: FakeClock) -> None:
    q = _queue(clock)
    q.add("ns/a", _obj("ns/a"))
    entry = _pop(q)
    assert entry is not None
    q.add("ns/a", _status_update(entry.obj))  # the scheduler's own PodScheduled=False condition
    q.unschedulable(entry)
    clock.now = 30.0
    assert _pop(q) is None


# ---------------------------------------------------------------------- deletion, counts


def test_delete_removes_wherever_it_is(clock: FakeClock) -> None:
    q = _queue(clock)
    _unschedulable_pod(q, "ns/stuck")
    q.add("ns/backoff", _obj("ns/backoff"))
    entry = _pop(q)
    assert entry is not None
    q.retry(entry.key)
    q.add("ns/active", _obj("ns/active"))
    assert q.counts() == {"active": 1, "backoff": 1, "unschedulable": 1, "parked": 0, "in-flight": 0}
    for key in ("ns/active", "ns/stuck", "ns/backoff"):
        q.delete(key)
    assert len(q) == 0
    q.cluster_changed()
    clock.now = 1000.0
    assert _pop(q) is None


def test_delete_then_readd_is_a_fresh_pod(clock: FakeClock) -> None:
    q = _queue(clock)
    old = _unschedulable_pod(q)
    q.delete("ns/a")
    q.unschedulable(old)  # a late verdict on the deleted pod changes nothing
    assert len(q) == 0
    clock.now = 3.0
    q.add("ns/a", _obj("ns/a"))
    fresh = _pop(q)
    assert fresh is not None and fresh is not old and fresh.attempts == 1
    q.cluster_changed()  # the old pod's stale flush entry must not resurrect anything
    clock.now = 1000.0
    assert _pop(q) is None


def test_done_of_a_replaced_entry_keeps_the_new_one(clock: FakeClock) -> None:
    q = _queue(clock)
    q.add("ns/a", _obj("ns/a"))
    old = _pop(q)
    assert old is not None
    q.delete("ns/a")
    q.add("ns/a", _obj("ns/a"))
    q.done(old)
    assert len(q) == 1


def test_counts(clock: FakeClock) -> None:
    q = _queue(clock)
    for key in ("ns/stuck", "ns/parked", "ns/backoff", "ns/flight", "ns/active"):
        q.add(key, _obj(key))
    stuck, parked, backoff, flight = (_pop(q) for _ in range(4))
    assert stuck is not None and parked is not None and backoff is not None and flight is not None
    q.unschedulable(stuck)
    q.park(parked)
    q.retry(backoff.key)
    assert q.counts() == {"active": 1, "backoff": 1, "unschedulable": 1, "parked": 1, "in-flight": 1}
    assert len(q) == 5
    q.done(flight)
    assert q.counts()["in-flight"] == 0 and len(q) == 4


def test_close_ends_pop(clock: FakeClock) -> None:
    q = _queue(clock)
    q.add("ns/a", _obj("ns/a"))
    q.close()
    assert q.pop(timeout_s=5.0) is None
