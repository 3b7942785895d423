"""The client-side token bucket, on a fake clock whose sleep advances it (nothing really waits)."""

from __future__ import annotations

import pytest

from regional_scheduler.rate_limit import TokenBucket


class FakeTime:
    """A clock and a sleep: ``sleep`` records the wait and, when ``advance``, moves the clock by it."""

    def __init__(self, *, advance: bool = True) -> None:
        self.now = 1000.0
        self.advance = advance
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        if self.advance:
            self.now += seconds


def _bucket(qps: float, burst: int, fake: FakeTime) -> TokenBucket:
    return TokenBucket(qps, burst, clock=fake.clock, sleep=fake.sleep)


@pytest.mark.parametrize(
    ("qps", "burst", "calls", "waits"),
    [
        # burst 3 at 2 qps: three free tokens, then one every 1/2 s.
        pytest.param(2.0, 3, 6, [0.0, 0.0, 0.0, 0.5, 0.5, 0.5], id="burst-then-1/qps"),
        # burst 1 at 10 qps: the first is free, then 0.1 s apart.
        pytest.param(10.0, 1, 4, [0.0, 0.1, 0.1, 0.1], id="burst-1"),
        # kube-scheduler's defaults, 50 qps and burst 100: 100 free, then 1/50 s apart.
        pytest.param(50.0, 100, 102, [0.0] * 100 + [0.02, 0.02], id="kube-defaults"),
    ],
)
def test_burst_is_free_then_waits_are_1_over_qps(qps: float, burst: int, calls: int, waits: list[float]) -> None:
    fake = FakeTime()
    bucket = _bucket(qps, burst, fake)
    got = [bucket.acquire() for _ in range(calls)]
    assert got == pytest.approx(waits)
    assert fake.sleeps == pytest.approx([w for w in waits if w > 0])
    # The calls after the burst happened 1/qps apart on the clock.
    assert fake.now - 1000.0 == pytest.approx(sum(waits))


def test_waiters_queue_in_arrival_order() -> None:
    """Concurrent callers each reserve a token at once: with the clock standing still (all arrive at
    the same instant), the k-th past the burst waits k/qps."""
    fake = FakeTime(advance=False)
    bucket = _bucket(4.0, 2, fake)
    # burst 2 at 4 qps: 0, 0, then 1/4, 2/4, 3/4 s.
    assert [bucket.acquire() for _ in range(5)] == pytest.approx([0.0, 0.0, 0.25, 0.5, 0.75])


def test_idle_time_refills_up_to_burst_only() -> None:
    fake = FakeTime()
    bucket = _bucket(2.0, 3, fake)
    for _ in range(3):
        bucket.acquire()
    fake.now += 3600.0  # an hour idle would earn 7200 tokens; the bucket holds 3
    assert [bucket.acquire() for _ in range(4)] == pytest.approx([0.0, 0.0, 0.0, 0.5])


def test_partial_refill() -> None:
    fake = FakeTime()
    bucket = _bucket(2.0, 1, fake)
    assert bucket.acquire() == 0.0
    fake.now += 0.2  # 0.2 s × 2 qps = 0.4 token earned; 0.6 token short = 0.3 s at 2 qps
    assert bucket.acquire() == pytest.approx(0.3)


@pytest.mark.parametrize("qps", [pytest.param(0.0, id="zero"), pytest.param(-1.0, id="negative")])
def test_non_positive_qps_disables(qps: float) -> None:
    fake = FakeTime()
    bucket = _bucket(qps, 1, fake)
    assert all(bucket.acquire() == 0.0 for _ in range(1000))
    assert fake.sleeps == []


@pytest.mark.parametrize("burst", [pytest.param(0, id="zero"), pytest.param(-5, id="negative")])
def test_burst_below_one_rejected(burst: int) -> None:
    with pytest.raises(ValueError, match="burst must be at least 1"):
        TokenBucket(10.0, burst)
