"""The bus inside the security boundary (issue 22): per-component ACL users, passwords, TLS, on every path.

A real ``redis-server`` per module (``tests/redis_helpers.py``) loads the ACL of :mod:`meridian.bus.acl`
(what ``deploy/redis/users.acl`` holds). The headline: with the node agent's credentials the product's
bus publishes telemetry, and a dispatch order or a workload record is refused with one clear line.
Both hand-written RESP sockets (hot read, pipelined publish) and redis-py's pool are exercised, in
plaintext and over TLS (mutual: the server requires a client certificate).
"""

from __future__ import annotations

import ssl
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis

from meridian.bus import (
    SUMMARY_STREAM,
    BusAuthenticationError,
    BusConfigError,
    BusPermissionError,
    BusUnavailableError,
    RedisSecuritySettings,
    RedisStreamBus,
    StreamEntry,
    carbon_key,
    dead_letter_stream,
    dispatch_stream,
    events_stream,
    open_bus,
    redact_url,
    telemetry_stream,
)
from meridian.bus.acl import ENERGY_STREAM, acl_rules, users
from meridian.bus.connection import endpoint_from_url
from meridian.bus.resp import RespSocket
from meridian.bus.streams import workload_bucket
from meridian.model_registry.artifacts import FilesystemArtifactStore
from meridian.model_registry.registry import ModelRegistry
from meridian.model_registry.versions import MODEL_NAMES, DataWindow
from tests.redis_helpers import AclRedis, Pki, make_pki

#: One bucket of the global scheduler's workload store (the ACL grants every ``meridian:workloads:*``).
WORKLOADS_BUCKET = workload_bucket(0)

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


@pytest.fixture(scope="module")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path_factory.mktemp("acl-redis")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_redis(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[AclRedis]:
    server = AclRedis(tmp_path_factory.mktemp("tls-redis"), pki=pki).start()
    yield server
    server.stop()


def _cluster() -> str:
    """A cluster name of this test's own, so tests sharing the module's server never share a stream."""
    return f"c{uuid.uuid4().hex[:10]}"


def _one_clear_line(exc: BaseException, *, user: str, names: tuple[str, ...], password: str) -> None:
    message = str(exc)
    assert "\n" not in message, message
    assert f"'{user}'" in message and all(n in message for n in names), message
    assert password not in message, message
    # No chained redis-py traceback under it: the message says it all.
    assert exc.__cause__ is None and (exc.__context__ is None or exc.__suppress_context__)


# ------------------------------------------------------------------ the required test


def test_an_agents_credentials_cannot_write_a_dispatch_order(acl_redis: AclRedis) -> None:
    """Publishing telemetry works; a dispatch order (either publish path) and the workload store do not."""
    cluster = _cluster()
    agent = acl_redis.bus("meridian-agent")
    password = acl_redis.passwords["meridian-agent"]
    try:
        assert agent.publish_many(telemetry_stream(cluster), [b"report-1", b"report-2"], maxlen=1000) == 2
        agent.publish(telemetry_stream(cluster), b"report-3")
        with pytest.raises(BusPermissionError) as single:
            agent.publish(dispatch_stream(cluster), b"order")
        with pytest.raises(BusPermissionError) as pipelined:
            agent.publish_many(dispatch_stream(cluster), [b"order"], maxlen=1000)
        with pytest.raises(BusPermissionError) as store:
            agent.hash_set(WORKLOADS_BUCKET, {"w-1": b"record"})
        for raised, command, key in ((single, "XADD", dispatch_stream(cluster)),
                                     (pipelined, "XADD", dispatch_stream(cluster)), (store, "HSET", WORKLOADS_BUCKET)):
            _one_clear_line(raised.value, user="meridian-agent", names=(command, key, "NOPERM"), password=password)
        assert agent.publish_many(telemetry_stream(cluster), [b"report-4"]) == 1  # the connection is still usable
    finally:
        agent.close()
    with acl_redis.admin() as admin:
        assert admin.xlen(telemetry_stream(cluster)) == 4
        assert not admin.exists(dispatch_stream(cluster)) and not admin.exists(WORKLOADS_BUCKET)


# ------------------------------------------------------------------ each user: what it needs, nothing more


def _agent(bus: RedisStreamBus, cluster: str) -> None:
    bus.publish_many(telemetry_stream(cluster), [b"r"], maxlen=1000)  # node_agent.publisher
    bus.get_value(carbon_key("zone-1"))  # node_agent.collectors.carbon, source "redis"


def _carbon_feeder(bus: RedisStreamBus, cluster: str) -> None:
    bus.set_value(carbon_key("zone-1"), b"123.0")


def _consume(bus: RedisStreamBus, stream: str, group: str) -> None:
    """What every consumer-group worker sends (telemetry_state, dispatch_worker, scheduler, accounting)."""
    bus.ensure_group(stream, group)
    bus.claim_stale(stream, group, "me", min_idle_ms=0, count=10)
    entries = bus.read_group(stream, group, "me", count=10, block_ms=10)
    bus.ack(stream, group, [e.entry_id for e in entries] or ["0-1"])
    bus.dead_letter(stream, StreamEntry("0-1", b"junk"), reason="test", group=group, consumer="me")
    bus.pending(stream, group)
    bus.group_lag(stream, group)


def _regional(bus: RedisStreamBus, cluster: str) -> None:
    _consume(bus, telemetry_stream(cluster), "regional")
    _consume(bus, dispatch_stream(cluster), "regional-dispatch")
    bus.publish_many(events_stream(cluster), [b"event"], maxlen=1000)
    bus.publish(SUMMARY_STREAM, b"summary", maxlen=10_000)


def _global(bus: RedisStreamBus, cluster: str) -> None:
    _consume(bus, SUMMARY_STREAM, f"global-{cluster}")
    _consume(bus, events_stream(cluster), "global-scheduler")
    bus.publish_many(dispatch_stream(cluster), [b"order"], maxlen=1000)
    bus.publish(dispatch_stream(cluster), b"order", maxlen=1000)
    bus.hash_set(WORKLOADS_BUCKET, {f"w-{cluster}": b"record"})
    assert (f"w-{cluster}", b"record") in bus.hash_items(WORKLOADS_BUCKET)
    bus.hash_delete(WORKLOADS_BUCKET, [f"w-{cluster}"])


def _accounting(bus: RedisStreamBus, cluster: str) -> None:
    _consume(bus, ENERGY_STREAM, "accounting")
    _consume(bus, SUMMARY_STREAM, f"accounting-{cluster}")


def _probe(bus: RedisStreamBus, cluster: str) -> None:
    assert bus.ping()


@pytest.mark.parametrize(("user", "exercise"), [
    pytest.param("meridian-agent", _agent, id="agent"),
    pytest.param("meridian-carbon-feeder", _carbon_feeder, id="carbon-feeder"),
    pytest.param("meridian-regional", _regional, id="regional"),
    pytest.param("meridian-global", _global, id="global"),
    pytest.param("meridian-accounting", _accounting, id="accounting"),
    pytest.param("meridian-probe", _probe, id="probe"),
])
def test_every_user_can_do_what_its_component_does(acl_redis: AclRedis, user: str,
                                                   exercise: Callable[[RedisStreamBus, str], None]) -> None:
    with acl_redis.admin() as admin:
        admin.acl_log_reset()
    bus = acl_redis.bus(user)
    try:
        exercise(bus, _cluster())
        assert bus.ping()
    finally:
        bus.close()
    assert acl_redis.denials() == []


@pytest.mark.parametrize(("user", "attempt", "command"), [
    pytest.param("meridian-agent", lambda b, c: b.read_group(telemetry_stream(c), "g", "me", count=1), "XREADGROUP",
                 id="agent-reads-other-nodes-reports"),
    pytest.param("meridian-agent", lambda b, c: b.publish(events_stream(c), b"e"), "XADD", id="agent-forges-an-event"),
    pytest.param("meridian-agent", lambda b, c: b.publish(SUMMARY_STREAM, b"s"), "XADD", id="agent-forges-a-summary"),
    pytest.param("meridian-agent", lambda b, c: b.set_value(carbon_key("z"), b"0"), "SET",
                 id="agent-sets-the-grid-intensity"),
    pytest.param("meridian-agent", lambda b, c: b.delete(telemetry_stream(c)), "DEL", id="agent-deletes-a-stream"),
    pytest.param("meridian-regional", lambda b, c: b.publish_many(telemetry_stream(c), [b"r"]), "XADD",
                 id="regional-forges-node-reports"),
    pytest.param("meridian-regional", lambda b, c: b.publish(dispatch_stream(c), b"o"), "XADD",
                 id="regional-writes-a-dispatch-order"),
    pytest.param("meridian-regional", lambda b, c: b.hash_set(WORKLOADS_BUCKET, {"w": b"x"}), "HSET",
                 id="regional-writes-the-workload-store"),
    pytest.param("meridian-global", lambda b, c: b.publish_many(telemetry_stream(c), [b"r"]), "XADD",
                 id="global-forges-node-reports"),
    pytest.param("meridian-global", lambda b, c: b.publish(events_stream(c), b"e"), "XADD",
                 id="global-forges-an-event"),
    pytest.param("meridian-accounting", lambda b, c: b.publish(dispatch_stream(c), b"o"), "XADD",
                 id="accounting-writes-a-dispatch-order"),
    pytest.param("meridian-carbon-feeder", lambda b, c: b.publish(telemetry_stream(c), b"r"), "XADD",
                 id="carbon-feeder-forges-node-reports"),
    pytest.param("meridian-probe", lambda b, c: b.get_value(carbon_key("z")), "GET", id="probe-reads-a-key"),
])
def test_what_a_user_may_not_do_is_refused_naming_the_user_and_command(
        acl_redis: AclRedis, user: str, attempt: Callable[[RedisStreamBus, str], object], command: str) -> None:
    bus = acl_redis.bus(user)
    try:
        with pytest.raises(BusPermissionError) as refused:
            attempt(bus, _cluster())
    finally:
        bus.close()
    _one_clear_line(refused.value, user=user, names=(command, "NOPERM"), password=acl_redis.passwords[user])


def test_the_key_prefix_is_part_of_the_patterns(acl_redis: AclRedis) -> None:
    """An ACL rendered for key_prefix "env-1:" admits the prefixed stream and nothing outside the prefix."""
    (agent,) = [u for u in users() if u.name == "meridian-agent"]
    with acl_redis.admin() as admin:
        admin.execute_command("ACL", "SETUSER", "agent-env-1", "reset", ">pw-env-1",
                              *acl_rules(agent, key_prefix="env-1:").split())
    cluster = _cluster()
    inside = acl_redis.bus("agent-env-1", password="pw-env-1", key_prefix="env-1:")
    outside = acl_redis.bus("agent-env-1", password="pw-env-1")
    try:
        assert inside.publish_many(telemetry_stream(cluster), [b"r"]) == 1
        with pytest.raises(BusPermissionError, match="agent-env-1"):
            outside.publish_many(telemetry_stream(cluster), [b"r"])
    finally:
        inside.close()
        outside.close()


def test_the_packed_publish_authenticates_as_an_acl_user(acl_redis: AclRedis) -> None:
    """RespSocket itself (no bus around it): AUTH user password at connect, then pipelined XADD."""
    cluster = _cluster()
    stream = telemetry_stream(cluster).encode()
    endpoint = endpoint_from_url(acl_redis.url("meridian-agent"))
    writer = RespSocket(endpoint, timeout_s=5, connect_timeout_s=2)
    try:
        assert writer.xadd_many(stream, [b"one", b"two"], maxlen=1000) == []
    finally:
        writer.close()
    with acl_redis.admin() as admin:
        assert [fields[b"p"] for _, fields in admin.xrange(stream)] == [b"one", b"two"]


# ------------------------------------------------------------------ credentials


def test_a_wrong_password_is_one_clear_line_at_connect(acl_redis: AclRedis) -> None:
    wrong = "not-the-password"
    bus = acl_redis.bus("meridian-agent", password=wrong)
    try:
        for attempt in (lambda: bus.publish_many(telemetry_stream("a"), [b"r"]),  # the writer socket
                        lambda: bus.read_group(telemetry_stream("a"), "g", "me", count=1),  # redis-py's pool
                        lambda: bus.publish(telemetry_stream("a"), b"r")):
            with pytest.raises(BusAuthenticationError) as refused:
                attempt()
            _one_clear_line(refused.value, user="meridian-agent", password=wrong,
                            names=("invalid username-password pair", "MERIDIAN_REDIS_PASSWORD_FILE"))
            assert isinstance(refused.value, BusUnavailableError)  # callers keep backing off, as for an outage
        assert not bus.ping()
    finally:
        bus.close()


@pytest.mark.parametrize(("url_user", "expected"), [
    pytest.param(None, "refused user 'default': no password is given", id="no-credentials"),
    pytest.param("nobody", "refused user 'nobody': invalid username-password pair", id="unknown-user"),
])
def test_no_or_unknown_credentials_are_refused(acl_redis: AclRedis, url_user: str | None, expected: str) -> None:
    url = acl_redis.url(url_user, "x") if url_user else acl_redis.url()
    bus = RedisStreamBus(url, security=RedisSecuritySettings(), connect_timeout_s=2)
    try:
        for attempt in (lambda: bus.publish_many("s", [b"r"]), lambda: bus.publish("s", b"r")):
            with pytest.raises(BusAuthenticationError, match=expected):
                attempt()
    finally:
        bus.close()


def test_credentials_from_the_environment_and_a_password_file(acl_redis: AclRedis, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """As in Kubernetes: the user in MERIDIAN_REDIS_USERNAME, the password a mounted Secret file (its
    trailing newline ignored), a URL without credentials; open_bus reads them, every path uses them."""
    secret = tmp_path / "password"
    secret.write_text(acl_redis.passwords["meridian-agent"] + "\n")
    monkeypatch.setenv("MERIDIAN_REDIS_USERNAME", "meridian-agent")
    monkeypatch.setenv("MERIDIAN_REDIS_PASSWORD_FILE", str(secret))
    cluster = _cluster()
    bus = open_bus(acl_redis.url(), key_prefix="")
    try:
        assert bus.publish_many(telemetry_stream(cluster), [b"r"]) == 1
        bus.publish(telemetry_stream(cluster), b"r")
        with pytest.raises(BusPermissionError, match="'meridian-agent' may not XADD"):
            bus.publish(dispatch_stream(cluster), b"order")
    finally:
        bus.close()
    monkeypatch.setenv("MERIDIAN_REDIS_PASSWORD_FILE", str(tmp_path / "absent"))
    with pytest.raises(BusConfigError, match=r"cannot read the Redis password file .*absent"):
        open_bus(acl_redis.url())


@pytest.mark.parametrize(("url", "redacted"), [
    pytest.param("redis://meridian-agent:s3cret@redis:6379/0", "redis://meridian-agent:***@redis:6379/0", id="user"),
    pytest.param("rediss://:s3cret@redis:6380/2", "rediss://:***@redis:6380/2", id="password-only"),
    pytest.param("redis://redis:6379/0", "redis://redis:6379/0", id="none"),
    pytest.param("memory://", "memory://", id="memory"),
])
def test_urls_are_printed_without_the_password(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted
    if url.startswith("redis"):
        endpoint = endpoint_from_url(url)
        assert "s3cret" not in endpoint.redacted_url and "s3cret" not in repr(endpoint)


@pytest.mark.parametrize(("url", "security", "error"), [
    pytest.param("redis://redis:6379/0", {"tls_ca_file": "/ca.crt"}, "not rediss://", id="tls-files-without-tls"),
    pytest.param("redis://redis:6379/0?ssl_ca_certs=/ca.crt", {}, "not rediss://", id="tls-query-without-tls"),
    pytest.param("http://redis:6379/0", {}, "use redis://, rediss://", id="scheme"),
    pytest.param("redis://redis:6379/0?protocol=3", {}, "unsupported parameter", id="unknown-parameter"),
    pytest.param("redis://redis:6379/x", {}, "database must be a number", id="database"),
])
def test_misconfiguration_is_refused_at_start(url: str, security: dict[str, str], error: str) -> None:
    with pytest.raises(BusConfigError, match=error):
        RedisStreamBus(url, security=RedisSecuritySettings(**security))


def test_settings_win_over_the_url() -> None:
    endpoint = endpoint_from_url("rediss://u:p@h:1/3?ssl_ca_certs=/url-ca.crt&ssl_check_hostname=false",
                                 RedisSecuritySettings(username="meridian-global", password="from-secret",
                                                       tls_ca_file=Path("/settings-ca.crt")))
    assert (endpoint.username, endpoint.password, endpoint.db) == ("meridian-global", "from-secret", 3)
    assert (endpoint.tls_ca_file, endpoint.tls_check_hostname) == ("/settings-ca.crt", False)


# ------------------------------------------------------------------ TLS


def test_the_whole_bus_runs_over_mutual_tls_as_an_acl_user(tls_redis: AclRedis) -> None:
    """rediss://: the pipelined publish (RespSocket) and redis-py's pool, all TLS."""
    cluster = _cluster()
    agent, regional = tls_redis.bus("meridian-agent"), tls_redis.bus("meridian-regional")
    try:
        stream = telemetry_stream(cluster)
        regional.ensure_group(stream, "regional")  # redis-py
        assert agent.publish_many(stream, [b"a" * 40_000, b"b"], maxlen=1000) == 2  # RespSocket writer
        agent.publish(stream, b"c")  # redis-py
        entries = regional.read_group(stream, "regional", "me", count=10, block_ms=100)  # redis-py
        assert [e.payload for e in entries] == [b"a" * 40_000, b"b", b"c"]
        assert regional.ack(stream, "regional", [e.entry_id for e in entries]) == 3
        assert all(isinstance(w._sock, ssl.SSLSocket) for w in agent._writers.values()) and agent._writers
        with pytest.raises(BusPermissionError, match="'meridian-agent' may not XADD"):
            agent.publish_many(dispatch_stream(cluster), [b"order"])
    finally:
        agent.close()
        regional.close()


@pytest.mark.parametrize(("host", "security", "error"), [
    pytest.param(None, {"ca": "other"}, "CERTIFICATE_VERIFY_FAILED", id="unknown-ca"),
    pytest.param("127.0.0.1", {}, "CERTIFICATE_VERIFY_FAILED", id="host-not-in-certificate"),
    # TLS 1.3: the server's refusal arrives with the first reply (RespSocket) or as an EOF (redis-py)
    pytest.param(None, {"client_cert": False}, "certificate required|EOF occurred", id="no-client-certificate"),
])
def test_tls_refuses_what_it_cannot_verify(tls_redis: AclRedis, host: str | None, security: dict[str, object],
                                           error: str) -> None:
    assert tls_redis.pki is not None
    settings = tls_redis.tls(client_cert=bool(security.get("client_cert", True)),
                             ca=tls_redis.pki.other_ca if security.get("ca") == "other" else None)
    bus = RedisStreamBus(tls_redis.url("meridian-agent", host=host), security=settings, connect_timeout_s=2)
    try:
        for attempt in (lambda: bus.publish_many("s", [b"r"]), lambda: bus.publish("s", b"r")):
            with pytest.raises(BusUnavailableError, match=error):
                attempt()
    finally:
        bus.close()


def test_the_host_name_check_can_be_turned_off_the_chain_is_still_checked(tls_redis: AclRedis) -> None:
    """The certificate names localhost, the URL says 127.0.0.1: accepted with the check off (same CA)."""
    bus = RedisStreamBus(tls_redis.url("meridian-agent", host="127.0.0.1"),
                         security=tls_redis.tls(check_hostname=False), connect_timeout_s=2)
    try:
        assert bus.publish_many(telemetry_stream(_cluster()), [b"r"]) == 1
        assert bus.ping()
    finally:
        bus.close()


def test_an_unreadable_tls_file_fails_at_start(tmp_path: Path) -> None:
    with pytest.raises(BusConfigError, match="MERIDIAN_REDIS_TLS_CA_FILE"):
        RedisStreamBus("rediss://redis:6379/0", security=RedisSecuritySettings(tls_ca_file=tmp_path / "absent.crt"))


def test_dead_letters_of_a_stream_are_where_the_acl_expects_them() -> None:
    """The regional and global users may append to ``<stream>:dead`` of what they consume."""
    assert dead_letter_stream(telemetry_stream("c")) == "meridian:{c}:telemetry:dead"


# ------------------------------------------------------------------ the model registry (meridian:models:*)


class _AnyJson:
    """A stand-in checkpoint validator (the tiers' own are tested beside each tier)."""

    def validate(self, path: Path) -> dict[str, object]:
        return {"layout": Path(path).read_text()}


def _acl_registry(acl_redis: AclRedis, user: str, artifacts: Path) -> ModelRegistry:
    """The product's registry as ``user``: its Redis client and its bus (for transition events)."""
    client = redis.Redis.from_url(acl_redis.url(user), decode_responses=True, socket_timeout=5)
    return ModelRegistry(client, FilesystemArtifactStore(artifacts), bus=acl_redis.bus(user),
                         validators=dict.fromkeys(MODEL_NAMES, _AnyJson()), url=acl_redis.url())


def test_the_global_user_manages_the_model_registry(acl_redis: AclRedis, tmp_path: Path) -> None:
    """Everything ModelService and ``meridian models`` do, as the global scheduler's user: register, promote
    through to active (a transaction that retires the old one), roll back, read versions and the audit."""
    with acl_redis.admin() as admin:
        admin.acl_log_reset()
    registry = _acl_registry(acl_redis, "meridian-global", tmp_path / "artifacts")  # this module's own Redis
    window = DataWindow(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 8, tzinfo=UTC),
                        digest="ef" * 32)
    try:
        ids = []
        for n in range(2):
            checkpoint = tmp_path / f"ckpt-{n}.json"
            checkpoint.write_text(f"layout-{n}")
            ids.append(registry.register("placement", checkpoint, data_window=window, train_command="train",
                                         who="alice").version_id)
            for state in ("shadow", "canary", "active"):
                registry.promote(ids[-1], state, who="bob", why=state, evidence={"n": n})
        assert registry.rollback("placement", who="bob", why="regressed").version.version_id == ids[0]
        assert [v.state.value for v in registry.versions("placement")] == ["active", "retired"]
        assert len(registry.audit("placement", count=3)) == 3 and registry.lineage(ids[1])
    finally:
        registry.close()
    assert acl_redis.denials() == []


def test_the_regional_user_loads_the_active_model_and_changes_nothing(acl_redis: AclRedis, tmp_path: Path) -> None:
    """Regional schedulers and autoscalers read their own models' active version; they cannot promote, roll
    back or read the router's keys."""
    artifacts = tmp_path / "artifacts"
    manager = _acl_registry(acl_redis, "meridian-global", artifacts)
    checkpoint = tmp_path / "ckpt.json"
    checkpoint.write_text(f"layout-{uuid.uuid4().hex}")
    window = DataWindow(start=datetime(2026, 11, 1, tzinfo=UTC), end=datetime(2026, 11, 8, tzinfo=UTC),
                        digest="ef" * 32)
    version = manager.register("autoscaling", checkpoint, data_window=window, train_command="train", who="alice")
    for state in ("shadow", "canary", "active"):
        manager.promote(version.version_id, state, who="bob", why=state)
    regional = _acl_registry(acl_redis, "meridian-regional", artifacts)
    try:
        active = regional.active("autoscaling")
        assert active is not None and active.artifact_digest == version.artifact_digest
        with pytest.raises(redis.exceptions.NoPermissionError):
            regional.promote(version.version_id, "retired", who="mallory", why="no")
        with pytest.raises(redis.exceptions.NoPermissionError):
            regional.active("routing")
    finally:
        regional.close()
        manager.close()
