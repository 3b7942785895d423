"""Deleting a run's keys: every key under its own prefix, none of anyone else's (runs share one Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from meridian.bus import RedisStreamBus
from meridian.bus.cleanup import delete_key_prefix, prefix_pattern


@pytest.fixture
def client(redis_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(redis_url)
    yield c
    c.close()


def test_every_key_under_the_prefix_goes_and_nothing_else(client: redis.Redis, redis_url: str) -> None:
    run = uuid.uuid4().hex[:8]
    mine, other = f"test-cleanup-{run}:", f"test-cleanup-{run}x:"  # other: a longer prefix sharing a start
    bus = RedisStreamBus(redis_url, key_prefix=mine)
    bus.publish("meridian:summary", b"x")
    bus.ensure_group("meridian:dispatch:a", "g")
    bus.set_value("meridian:carbon:DE", b"1")
    client.set(f"{mine}plain", b"1", ex=60)  # with expiry
    for i in range(2500):  # more than one SCAN/UNLINK batch
        client.set(f"{mine}bulk:{i}", b"1")
    client.set(f"{other}keep", b"1", ex=60)
    try:
        assert delete_key_prefix(client, mine, batch=1000) == 2504
        assert list(client.scan_iter(match=prefix_pattern(mine))) == []
        assert client.get(f"{other}keep") == b"1"
    finally:
        bus.close()
        client.delete(f"{other}keep")


@pytest.mark.parametrize(("prefix", "pattern"), [
    pytest.param("demo-1a2b:", "demo-1a2b:*", id="plain"),
    pytest.param("a*[b]?\\:", "a\\*\\[b\\]\\?\\\\:*", id="glob-characters-escaped"),
])
def test_prefix_pattern(prefix: str, pattern: str) -> None:
    assert prefix_pattern(prefix) == pattern


def test_glob_characters_in_a_prefix_match_only_themselves(client: redis.Redis) -> None:
    run = uuid.uuid4().hex[:8]
    client.set(f"test-{run}-ab:k", b"1", ex=60)
    client.set(f"test-{run}-a*:k", b"1", ex=60)
    try:
        assert delete_key_prefix(client, f"test-{run}-a*:") == 1
        assert client.get(f"test-{run}-ab:k") == b"1"
    finally:
        client.delete(f"test-{run}-ab:k")


@pytest.mark.parametrize("prefix", ["", "meridian", "*"])
def test_a_prefix_that_is_not_a_runs_own_is_refused(client: redis.Redis, prefix: str) -> None:
    with pytest.raises(ValueError, match="refusing"):
        delete_key_prefix(client, prefix)
