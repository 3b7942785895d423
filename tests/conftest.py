"""Shared fixtures: a real Redis at REDIS_URL with a unique key prefix per test, a real Redis Cluster
(3 primaries, 3 replicas: the one ``.ci/run`` started, named by ``MERIDIAN_TEST_REDIS_CLUSTER_URL``, else one
per test process), private ``redis-server`` processes on free ports for fault tests (kill, restart), and a
real Kubernetes control plane (``meridian.envtest``) for tests marked ``kubernetes``."""

from __future__ import annotations

import os

# One math-library thread per test process: the suite runs as one process per core (pytest -n), so torch's
# and numpy's default of a thread per core would put two threads on every core. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
from kubernetes.client import ApiClient
from redis.cluster import RedisCluster

from meridian import envtest
from meridian.bus import StreamBus, open_bus
from meridian.bus.cleanup import delete_key_prefix
from meridian.envtest import ControlPlane
from meridian.traces import TracesNotFoundError, locate_traces
from tests.kube_helpers import fresh_namespace
from tests.redis_helpers import free_port

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
#: A running Redis Cluster's ``redis+cluster://`` URL (``.ci/run`` starts one); unset: each test process starts one.
REDIS_CLUSTER_URL_ENV = "MERIDIAN_TEST_REDIS_CLUSTER_URL"
SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def traces_dir() -> Path:
    """The shared traces by the product's one rule (``meridian.traces.locate_traces``)."""
    try:
        return locate_traces().path
    except TracesNotFoundError as exc:
        pytest.fail(str(exc))


@pytest.fixture
def redis_url() -> str:
    return REDIS_URL


@pytest.fixture
def key_prefix(redis_url: str) -> Iterator[str]:
    """A unique key prefix; every key under it, and only those (tests run in parallel on one Redis), is
    unlinked after the test (``meridian.bus.cleanup``)."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(redis_url)
    try:
        delete_key_prefix(client, prefix)
    finally:
        client.close()


@pytest.fixture(scope="session")
def redis_cluster_url() -> Iterator[str]:
    """A Redis Cluster shared by this test process's tests (each under its own key prefix); fault tests that
    kill nodes start their own (``tests.redis_cluster.start_cluster``)."""
    url = os.environ.get(REDIS_CLUSTER_URL_ENV)
    if url:
        yield url
        return
    from tests.redis_cluster import start_cluster

    cluster = start_cluster()
    try:
        yield cluster.url
    finally:
        cluster.stop()


def cluster_client(url: str) -> RedisCluster:
    """A redis-py cluster client for a ``redis+cluster://`` URL."""
    host, _, port = url.split("://", 1)[1].rstrip("/").rpartition(":")
    return RedisCluster(host=host, port=int(port))


@pytest.fixture
def cluster_key_prefix(redis_cluster_url: str) -> Iterator[str]:
    """As ``key_prefix``, on the Redis Cluster (``SCAN`` on every primary, ``UNLINK`` split by slot)."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = cluster_client(redis_cluster_url)
    try:
        delete_key_prefix(client, prefix)  # type: ignore[arg-type]
    finally:
        client.close()


@dataclass
class RedisServer:
    """A private redis-server on a free port; ``kill`` and ``start`` simulate outages."""

    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    workdir: str = field(default_factory=lambda: tempfile.mkdtemp(prefix="meridian-redis-"))

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed; .ci/run installs it")
        self.proc = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.workdir],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        envtest.wait_for(self._answers, timeout=10, interval=0.05, message=f"redis-server on port {self.port}")

    def _answers(self) -> bool:
        try:
            return bool(redis.Redis(port=self.port, socket_timeout=0.5).ping())
        except redis.exceptions.ConnectionError:
            return False

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None


@pytest.fixture
def redis_bus(redis_url: str, key_prefix: str) -> Iterator[StreamBus]:
    """A Redis stream bus under the test's key prefix, closed afterwards."""
    bus = open_bus(redis_url, key_prefix=key_prefix)
    yield bus
    bus.close()


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.kill()
    shutil.rmtree(server.workdir, ignore_errors=True)


# ------------------------------------------------------------------ Kubernetes (meridian.envtest)


@pytest.fixture(scope="session")
def kube_control_plane() -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + kube-controller-manager for this test process (each xdist worker gets
    its own), or the cluster ``MERIDIAN_TEST_KUBECONFIG`` names. Missing binaries skip the tests,
    except under CI=true, where they must run."""
    plane = envtest.from_environment(controller_manager=True)
    try:
        plane.start()
    except envtest.AssetsNotFoundError as e:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(str(e))
        pytest.skip(str(e))
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_api(kube_control_plane: ControlPlane) -> Iterator[ApiClient]:
    """An admin ``ApiClient`` for the session's control plane."""
    with kube_control_plane.api_client() as api:
        yield api


@pytest.fixture
def kube_namespace(kube_api: ApiClient) -> Iterator[str]:
    """A fresh namespace, deleted after the test (:func:`tests.kube_helpers.fresh_namespace`)."""
    with fresh_namespace(kube_api) as name:
        yield name
