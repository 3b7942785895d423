"""Redis-only behaviour of the bus: outages surface as ``BusUnavailableError`` and recovery needs no restart."""

from __future__ import annotations

import pytest

from meridian.bus import BusUnavailableError, RedisStreamBus, open_bus
from meridian.bus.memory import InProcessStreamBus


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
