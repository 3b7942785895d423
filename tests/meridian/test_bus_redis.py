"""Redis-only behaviour of the bus: outages surface as ``BusUnavailableError`` and recovery needs no restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from meridian.bus import BusUnavailableError, RedisStreamBus, open_bus
from meridian.bus.memory import InProcessStreamBus
from meridian.envtest import wait_for


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        pytest.param("memory://", InProcessStreamBus, id="memory"),
        pytest.param("redis://127.0.0.1:6379/0", RedisStreamBus, id="redis"),
    ],
)
def test_open_bus_picks_the_implementation(url: str, kind: type) -> None:
    assert isinstance(open_bus(url), kind)


def test_outage_raises_unavailable_then_recovers(redis_server) -> None:
    bus = RedisStreamBus(redis_server.url, connect_timeout_s=0.5, socket_timeout_s=2.0)
    bus.publish("s", b"before")
    redis_server.kill()
    with pytest.raises(BusUnavailableError):
        bus.publish_many("s", [b"during"])
    with pytest.raises(BusUnavailableError):
        bus.read_group("s", "g", "c", count=1)
    assert not bus.ping()
    redis_server.start()
    bus.publish_many("s", [b"after"])
    assert [e.payload for e in bus.read_group("s", "g", "c", count=10)] == [b"after"]
    bus.close()


def test_per_entry_errors_are_reported_and_the_connection_stays_usable(redis_url: str, key_prefix: str) -> None:
    from meridian.bus import BusError

    bus = RedisStreamBus(redis_url, key_prefix=key_prefix)
    bus.set_value("not-a-stream", b"x")
    with pytest.raises(BusError, match="2 of 2 XADD failed"):
        bus.publish_many("not-a-stream", [b"a", b"b"])
    assert bus.publish_many("a-stream", [b"a", b"b"]) == 2
    assert bus.length("a-stream") == 2
    bus.close()


def test_password_and_database_from_the_url(tmp_path: Path) -> None:
    """The hot paths (own sockets) authenticate and select the database like redis-py does."""
    import shutil
    import socket
    import subprocess

    import redis

    binary = shutil.which("redis-server")
    if binary is None:
        pytest.fail("redis-server is not installed; .ci/run installs it")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--requirepass", "s3cret", "--dir", str(tmp_path)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"redis://:s3cret@127.0.0.1:{port}/2"

        def answers() -> bool:
            try:
                return bool(redis.Redis.from_url(url, socket_timeout=0.5).ping())
            except redis.exceptions.ConnectionError:
                return False

        wait_for(answers, timeout=10, interval=0.05, message=f"redis-server on port {port}")
        bus = RedisStreamBus(url)
        bus.publish_many("s", [b"a", b"b"])
        assert [e.payload for e in bus.read_group("s", "g", "c", count=10)] == [b"a", b"b"]
        assert redis.Redis.from_url(url).xlen("s") == 2  # it landed in database 2
        assert redis.Redis.from_url(f"redis://:s3cret@127.0.0.1:{port}/0").xlen("s") == 0
        with pytest.raises(BusUnavailableError):  # wrong password: refused, not silently unauthenticated
            RedisStreamBus(f"redis://:wrong@127.0.0.1:{port}/0").publish_many("s", [b"x"])
        bus.close()
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_a_consumer_looping_on_blocking_reads_does_not_starve_another_threads_acks(redis_url: str,
                                                                                  key_prefix: str) -> None:
    """One bus, two threads: one loops on blocking reads of an empty stream (the engine's summary loop), the
    other reads without blocking and acknowledges (its events loop). Each of the latter's calls waits for at
    most the read in progress, not for however many more the looping thread gets in first (it did: seconds
    on a loaded machine, which a test then waited out)."""
    import threading

    bus = RedisStreamBus(redis_url, key_prefix=key_prefix)
    bus.ensure_group("quiet", "g")
    bus.ensure_group("busy", "g")
    reads = [0]
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            bus.read_group("quiet", "g", "blocking", count=10, block_ms=100)
            reads[0] += 1

    looper = threading.Thread(target=loop, daemon=True)
    looper.start()
    try:
        wait_for(lambda: reads[0] >= 2, message="the looping thread's first blocking reads")
        overtaken = []
        for i in range(20):
            bus.publish("busy", b"x%d" % i)
            before = reads[0]
            entries = bus.read_group("busy", "g", "other", count=10)
            assert bus.ack("busy", "g", [e.entry_id for e in entries]) == 1
            # Two calls, each behind at most the read in progress (one more may be counted late).
            overtaken.append(reads[0] - before)
        assert max(overtaken) <= 4, overtaken
    finally:
        stop.set()
        looper.join(timeout=10)
        bus.close()
