"""The stream bus: Meridian's message fabric (ARCHITECTURE.md, "The fabric: Redis streams").

``StreamBus`` is the one interface; :class:`RedisStreamBus` is production (consumer groups,
acknowledge after apply, ``XAUTOCLAIM`` of what a dead consumer left pending, dead-letter streams,
approximate ``MAXLEN`` trimming, pipelined batches) and :class:`InProcessStreamBus` is the embedded
default with the same semantics. Stream names come from :mod:`meridian.bus.streams`; how a process
reaches Redis (URL, ACL user, password file, TLS) from :mod:`meridian.bus.connection`, and what each
component's ACL user may do from :mod:`meridian.bus.acl`.
"""

from meridian.bus.base import (
    BusAuthenticationError,
    BusConfigError,
    BusError,
    BusPermissionError,
    BusUnavailableError,
    StreamBus,
    StreamEntry,
)
from meridian.bus.connection import RedisSecuritySettings, redact_url, redis_client, require_redis
from meridian.bus.memory import InProcessStreamBus
from meridian.bus.redis_bus import RedisStreamBus
from meridian.bus.redispy_bus import RedisPyStreamBus
from meridian.bus.streams import (
    MOVES_STREAM,
    SUMMARY_STREAM,
    carbon_key,
    dead_letter_stream,
    dispatch_stream,
    events_stream,
    telemetry_stream,
)

__all__ = [
    "MOVES_STREAM",
    "SUMMARY_STREAM",
    "BusAuthenticationError",
    "BusConfigError",
    "BusError",
    "BusPermissionError",
    "BusUnavailableError",
    "InProcessStreamBus",
    "RedisPyStreamBus",
    "RedisSecuritySettings",
    "RedisStreamBus",
    "StreamBus",
    "StreamEntry",
    "carbon_key",
    "dead_letter_stream",
    "dispatch_stream",
    "events_stream",
    "open_bus",
    "redact_url",
    "redis_client",
    "require_redis",
    "telemetry_stream",
]


def open_bus(url: str, *, key_prefix: str = "", security: RedisSecuritySettings | None = None) -> StreamBus:
    """A bus from a URL: ``redis://…``/``rediss://…``/``unix://…``, ``redis+cluster://…`` (a Redis Cluster,
    through redis-py's ``RedisCluster``) or ``memory://`` (in-process). Redis URLs get :class:`RedisStreamBus`
    (redis-py, plus the hand-packed pipelined publish that measured 3.5× redis-py's).

    ``security`` None: the ACL user, password (file) and TLS files from ``MERIDIAN_REDIS_*``."""
    if url.startswith("memory:"):
        return InProcessStreamBus(key_prefix=key_prefix)
    return RedisStreamBus(url, key_prefix=key_prefix, security=security)
