"""The deployed bus is inside the security boundary (issue 22): ACL users from ``deploy/redis/users.acl``,
passwords from Secrets only, a NetworkPolicy in front of Redis, and an ACL that lets every component do
its job — checked on the manifests and by running the components under their users on a real Redis.
"""

from __future__ import annotations

import base64
import fnmatch
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import pytest

from meridian.bus import (
    SUMMARY_STREAM,
    BusPermissionError,
    RedisSecuritySettings,
    dispatch_stream,
    events_stream,
    redis_client,
    telemetry_stream,
)
from meridian.bus.acl import ENERGY_STREAM, WORKLOADS_KEYS, render_acl, users
from meridian.bus.streams import workload_bucket
from tests.deploy.kustomize_helpers import DEPLOY, find, render, workloads
from tests.redis_helpers import AclRedis, require

#: One bucket of the global scheduler's workload store (the ACL grants every ``meridian:workloads:*``).
WORKLOADS_BUCKET = workload_bucket(0)

ACL_FILE = DEPLOY / "base" / "redis" / "users.acl"
REDIS_PORT = 6379
PLACEHOLDER = "REPLACE-ME"


def _documents() -> list[dict[str, Any]]:
    """The all-in-one overlay, rendered: every component and the Secrets it generates."""
    return render("all-in-one")


def _find(kind: str, name: str) -> dict[str, Any]:
    return find(_documents(), kind, name)


def _pods() -> list[tuple[str, dict[str, Any]]]:
    """(component label, pod spec) of every workload of the all-in-one overlay."""
    out = []
    for doc in workloads(_documents()):
        template = doc["spec"]["template"]
        out.append((template["metadata"]["labels"].get("app.kubernetes.io/component", "?"), template["spec"]))
    return out


def _is_bus_url(name: str) -> bool:
    return name.endswith(("BUS_URL", "BUS__URL", "REDIS_URL"))


def _redis_clients() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(component, pod spec, container) of every container given a Redis URL."""
    return [(component, pod, c) for component, pod in _pods() for c in pod["containers"] + pod.get("initContainers", [])
            if any(_is_bus_url(e["name"]) for e in c.get("env", []))]


def _secret_of_file(pod: dict[str, Any], container: dict[str, Any], path: str) -> str | None:
    """The Secret a file path in ``container`` comes from (a mounted secret volume), else None."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        if PurePosixPath(path).is_relative_to(mount["mountPath"]):
            volume = volumes[mount["name"]]
            assert mount.get("readOnly") is True, f"{mount['name']} must be mounted read-only"
            return volume["secret"]["secretName"] if "secret" in volume else None
    return None


def _redis_passwords() -> dict[str, str]:
    """Secret name → ACL user, from the projected password volume of Redis's pod."""
    pod = _find("Deployment", "meridian-redis")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "acl-passwords"]
    out = {}
    for source in volume["projected"]["sources"]:
        (item,) = source["secret"]["items"]
        out[source["secret"]["name"]] = item["path"]
    return out


# ------------------------------------------------------------------ the ACL file


def test_the_acl_file_is_the_one_the_code_writes_and_the_configmap_holds_it() -> None:
    assert ACL_FILE.read_text() == render_acl(), \
        "regenerate: python -m meridian.bus.acl > deploy/base/redis/users.acl"
    assert _find("ConfigMap", "meridian-redis-acl")["data"]["users.acl"] == ACL_FILE.read_text()


def test_the_acl_names_the_keys_the_components_use() -> None:
    """meridian.bus.acl cannot import the global tier (ARCHITECTURE.md), so its names are checked here."""
    from global_scheduler import store
    from global_scheduler.accounting import consumer

    assert consumer.ENERGY_STREAM == ENERGY_STREAM
    assert all(fnmatch.fnmatchcase(key, WORKLOADS_KEYS) for key in store.bucket_keys(64))


def test_the_acl_holds_no_password_and_the_default_user_is_off() -> None:
    lines = ACL_FILE.read_text().splitlines()
    assert lines[0].split()[:3] == ["user", "default", "off"]
    for line in lines:
        rules = line.split()[2:]
        assert not [r for r in rules if r.startswith((">", "#", "<", "!")) or r in ("nopass", "allkeys", "+@all")], line


# ------------------------------------------------------------------ manifests


def test_every_redis_client_gets_its_credentials_from_a_secret() -> None:
    clients = _redis_clients()
    assert {component for component, _, _ in clients} >= {"node-agent", "regional-scheduler", "global-scheduler"}
    acl_users = {u.name for u in users()}
    passwords = _redis_passwords()
    for component, pod, container in clients:
        env = {e["name"]: e for e in container["env"]}
        (url_var,) = [e for name, e in env.items() if _is_bus_url(name)]
        if "valueFrom" in url_var:  # the whole URL, user and password in it, from a Secret
            secret = url_var["valueFrom"]["secretKeyRef"]["name"]
            assert secret in passwords, f"{component}: Redis gets no password from {secret}"
            continue
        assert urlsplit(url_var["value"]).password is None, f"{component}: a password in a manifest"
        user = env["MERIDIAN_REDIS_USERNAME"]["value"]
        assert user in acl_users, f"{component}: {user} is not an ACL user"
        password_file = env["MERIDIAN_REDIS_PASSWORD_FILE"]["value"]
        secret = _secret_of_file(pod, container, password_file)
        assert secret is not None, f"{component}: {password_file} is not a mounted Secret"
        assert passwords.get(secret) == user, f"{component}: Redis takes {user}'s password from another Secret"
        assert "MERIDIAN_REDIS_PASSWORD" not in env


def test_no_password_is_written_in_a_manifest() -> None:
    # The only Secrets are the overlays' generated placeholders (tests/deploy/test_manifests.py checks all).
    for secret in [d for d in _documents() if d["kind"] == "Secret"]:
        assert all(PLACEHOLDER in base64.b64decode(v).decode() for v in secret["data"].values()), secret["metadata"]
    for _, pod in _pods():
        for container in pod["containers"] + pod.get("initContainers", []):
            for e in container.get("env", []):
                if "value" in e and "://" in str(e["value"]):
                    assert urlsplit(str(e["value"])).password is None, e
                secret_like = any(word in e["name"] for word in ("PASSWORD", "AUTH", "TOKEN"))
                if secret_like and not e["name"].endswith(("_FILE", "_DIR")):  # a path is no secret
                    assert "valueFrom" in e, f"{e['name']} must come from a Secret"
            args = " ".join(container.get("args", []) + container.get("command", []))
            assert "requirepass" not in args and "masterauth" not in args and " -a " not in args


def test_redis_starts_with_the_acl_and_the_probe_logs_in() -> None:
    pod = _find("Deployment", "meridian-redis")["spec"]["template"]["spec"]
    (redis,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert redis["args"][redis["args"].index("--appendonly") + 1] == "yes"
    aclfile = redis["args"][redis["args"].index("--aclfile") + 1]
    init_env = {e["name"]: e.get("value") for e in init["env"]}
    assert init_env["ACL_OUT"] == aclfile
    mounts = {m["mountPath"]: m["name"] for m in redis["volumeMounts"]}
    assert mounts[str(PurePosixPath(aclfile).parent)] == "acl"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["acl"]["emptyDir"]["medium"] == "Memory"  # hashes only, but never on a disk
    init_mounts = {m["mountPath"]: m["name"] for m in init["volumeMounts"]}
    template_volume = volumes[init_mounts[str(PurePosixPath(init_env["ACL_TEMPLATE"]).parent)]]
    assert template_volume["configMap"]["name"] == _find("ConfigMap", "meridian-redis-acl")["metadata"]["name"]
    probe = redis["readinessProbe"]["exec"]["command"]
    assert probe[probe.index("--user") + 1] == "meridian-probe" and "-e" in probe
    env = {e["name"]: e for e in redis["env"]}
    assert _redis_passwords()[env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]["name"]] == "meridian-probe"


def test_only_meridians_redis_clients_reach_redis() -> None:
    policy = _find("NetworkPolicy", "meridian-redis")
    redis = _find("Deployment", "meridian-redis")
    redis_pod_labels = redis["spec"]["template"]["metadata"]["labels"]
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"].items() <= redis_pod_labels.items()
    assert spec["policyTypes"] == ["Ingress"] and spec["ingress"]
    clients = {component: pod_namespace for component, pod_namespace in (
        (w["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"], w["metadata"]["namespace"])
        for w in workloads(_documents()))
        if component in {c for c, _, _ in _redis_clients()}}
    admitted: dict[str, str] = {}
    for rule in spec["ingress"]:
        assert [(p["port"], p.get("protocol", "TCP")) for p in rule["ports"]] == [(REDIS_PORT, "TCP")]
        assert rule["from"], "a rule without 'from' admits every source"
        for peer in rule["from"]:
            # by pod labels, in Redis's namespace or one named namespace (no ipBlock, no namespace-wide peer)
            assert set(peer) in ({"podSelector"}, {"podSelector", "namespaceSelector"}), peer
            namespace = redis["metadata"]["namespace"]
            if "namespaceSelector" in peer:
                assert set(peer["namespaceSelector"]) == {"matchLabels"}
                namespace = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            selector = peer["podSelector"]
            assert selector["matchLabels"] == {"app.kubernetes.io/name": "meridian"}
            (components,) = selector["matchExpressions"]
            assert (components["key"], components["operator"]) == ("app.kubernetes.io/component", "In")
            admitted.update({c: namespace for c in components["values"]})
    assert admitted == clients
    service = _find("Service", "meridian-redis")
    assert service["spec"]["ports"][0]["port"] == REDIS_PORT


def test_the_global_schedulers_pods_admit_the_api_metrics_and_health_only() -> None:
    policy = _find("NetworkPolicy", "meridian-global-scheduler")["spec"]
    pod = _find("Deployment", "meridian-global-scheduler")["spec"]["template"]
    assert policy["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    admitted = {p["port"] for rule in policy["ingress"] for p in rule["ports"]}
    assert admitted == {"grpc", "metrics", "health"} and admitted <= named.keys()
    # The kubelet's gRPC probes speak plaintext: they go to the health-only server, not the TLS API.
    env = {e["name"]: e.get("value") for e in container["env"]}
    health_port = int(env["MERIDIAN_GLOBAL_API__HEALTH_LISTEN"].rpartition(":")[2])
    assert named["health"] == health_port != named["grpc"]
    assert container["readinessProbe"]["grpc"]["port"] == container["livenessProbe"]["grpc"]["port"] == health_port


# ------------------------------------------------------------------ the deployment's ACL, for real


def test_the_init_container_renders_a_working_acl(tmp_path: Path) -> None:
    """Run the init container's script on the committed ACL and two password files, start Redis with the
    result: the agent logs in, a user without a Secret cannot, the readiness probe's command passes."""
    require("sh")
    require("sha256sum")
    redis_cli = require("redis-cli")
    pod = _find("Deployment", "meridian-redis")["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    script = init["command"][-1]
    passwords = tmp_path / "passwords"
    passwords.mkdir()
    (passwords / "meridian-agent").write_text("agent-secret\n")
    (passwords / "meridian-probe").write_text("probe-secret")
    out = tmp_path / "run" / "users.acl"
    out.parent.mkdir()
    env = {"PATH": os.environ["PATH"], "ACL_TEMPLATE": str(ACL_FILE), "ACL_PASSWORD_DIR": str(passwords),
           "ACL_OUT": str(out)}
    subprocess.run([shutil.which("sh") or "sh", "-c", script], env=env, check=True, timeout=30)
    rendered = out.read_text()
    assert "agent-secret" not in rendered and "probe-secret" not in rendered
    assert len(rendered.splitlines()) == len(ACL_FILE.read_text().splitlines())
    server = AclRedis(tmp_path / "redis", acl_text=rendered, add_passwords=False)
    server.workdir.mkdir()
    server.start()
    try:
        agent = server.bus("meridian-agent", password="agent-secret")
        regional = server.bus("meridian-regional", password="any-password")
        try:
            assert agent.publish_many(telemetry_stream("c1"), [b"r"]) == 1  # the file's trailing newline is not in it
            with pytest.raises(BusPermissionError):
                agent.publish(dispatch_stream("c1"), b"order")
            assert not regional.ping()  # no Secret, no password: cannot log in
        finally:
            agent.close()
            regional.close()
        (redis,) = pod["containers"]
        probe = [redis_cli, "-p", str(server.port), *redis["readinessProbe"]["exec"]["command"][1:]]
        ok = subprocess.run(probe, env={**env, "REDISCLI_AUTH": "probe-secret"}, capture_output=True, timeout=30)
        assert ok.returncode == 0 and ok.stdout.strip() == b"PONG"
        refused = subprocess.run(probe, env={**env, "REDISCLI_AUTH": "wrong"}, capture_output=True, timeout=30)
        assert refused.returncode != 0
    finally:
        server.stop()


@pytest.fixture
def fabric(tmp_path: Path) -> Any:
    server = AclRedis(tmp_path).start()
    yield server
    server.stop()


def test_every_component_runs_under_its_own_user(fabric: AclRedis) -> None:
    """The real components, each with its own credentials, one round each: a global dispatch, the regional
    dispatch worker, a node agent (its carbon read too), the regional telemetry consumer and summaries, the
    global tier's summary, event and workload-store reads, and the energy ledger (a Lua script). Not one
    command is refused (ACL LOG stays empty), and what each wrote arrived."""
    from global_scheduler.accounting.consumer import SummaryAccountant
    from global_scheduler.accounting.ledger import RedisLedger
    from meridian.envtest import wait_for
    from meridian.model import GIB, Node, Resources
    from node_agent.cli import build_agent
    from node_agent.settings import AgentSettings
    from protos import dispatch_pb2 as dpb
    from protos import telemetry_pb2 as tpb
    from regional_scheduler.dispatch_worker import DispatchWorker, DispatchWorkerSettings, simulated_cluster
    from regional_scheduler.summary_publisher import SummaryPublisher, SummarySettings
    from regional_scheduler.telemetry_state import (
        TelemetryConsumer,
        TelemetryConsumerSettings,
        TelemetryState,
    )

    cluster = f"c{uuid.uuid4().hex[:8]}"
    global_bus, regional_bus = fabric.bus("meridian-global"), fabric.bus("meridian-regional")
    agent = None
    try:
        # global → dispatch order → the regional dispatch worker places it and reports events and a summary
        nodes = [Node(name=f"n{i}", capacity=Resources(milli_cpu="16", memory_bytes=64 * GIB)) for i in range(2)]
        worker = DispatchWorker(bus=regional_bus, state=simulated_cluster(nodes), settings=DispatchWorkerSettings(
            cluster=cluster, region="eu", bus={"block_ms": 10}))
        worker.bus.ensure_group(worker.stream, "regional-dispatch")
        global_bus.publish_many(dispatch_stream(cluster), [dpb.DispatchMessage(cluster=cluster, place=dpb.PlaceWorkload(
            workload_id="w1", attempt=1, name="job", tenant="t", replicas=1,
            requests=dpb.ReplicaRequests(milli_cpu=1000, memory_bytes=GIB))).SerializeToString()], maxlen=1000)
        assert worker.poll_once() == 1
        worker.publish_summary()

        # a node agent (credentials in its URL) → telemetry → the regional consumer → a summary
        settings = AgentSettings(cluster=cluster, region="eu", bus_url=fabric.url("meridian-agent"))
        settings.simulate.nodes = 5
        settings.carbon.source, settings.carbon.zone = "redis", "zone-1"
        agent = build_agent(settings)
        assert agent.tick()
        state = TelemetryState(cluster=cluster)
        consumer = TelemetryConsumer(bus=regional_bus, state=state, settings=TelemetryConsumerSettings(
            cluster=cluster, bus={"block_ms": 10}))
        assert consumer.step() == 5
        SummaryPublisher(bus=regional_bus, state=state, settings=SummarySettings(region="eu")).publish_once()

        # the global tier: summaries and events through its groups, the workload store
        global_bus.ensure_group(SUMMARY_STREAM, cluster)
        summaries = global_bus.read_group(SUMMARY_STREAM, cluster, "g", count=100)
        assert len(summaries) >= 2 and global_bus.ack(SUMMARY_STREAM, cluster, [e.entry_id for e in summaries])
        global_bus.ensure_group(events_stream(cluster), "global-scheduler")
        events = global_bus.read_group(events_stream(cluster), "global-scheduler", "g", count=100)
        assert events and global_bus.ack(events_stream(cluster), "global-scheduler", [e.entry_id for e in events])
        global_bus.hash_set(WORKLOADS_BUCKET, {f"w-{cluster}": b"record"})
        assert dict(global_bus.hash_items(WORKLOADS_BUCKET))[f"w-{cluster}"] == b"record"
        global_bus.hash_delete(WORKLOADS_BUCKET, [f"w-{cluster}"])

        # the energy ledger, as the global scheduler runs it in-process (its client from redis_client)
        ledger = RedisLedger(redis_client(fabric.url("meridian-global"), security=RedisSecuritySettings()),
                             bucket_s=1)
        accountant = SummaryAccountant(bus=global_bus, ledger=ledger, consumer="acc", price_per_mwh=lambda r, t: 50.0,
                                       group=f"acc-{cluster}", settings={"block_ms": 10})
        # The next summary must be younger than the newest so far (the accountant skips older ones).
        newest_ms = max(tpb.ClusterSummary.FromString(e.payload).generated_unix_ms for e in summaries)
        wait_for(lambda: time.time() * 1000 >= newest_ms + 1, interval=0.001,
                 message="the clock to pass the newest summary's stamp")
        worker.publish_summary()
        stats = accountant.poll_once(block=False)
        assert stats.applied >= 1 and stats.dead_lettered == 0
    finally:
        if agent is not None:
            agent.publisher.bus.close()
        global_bus.close()
        regional_bus.close()
    assert fabric.denials() == []
    with fabric.admin() as admin:
        assert admin.hget("meridian:energy:clusters", cluster) == b"eu"
        assert admin.xlen(telemetry_stream(cluster)) == 5
