"""A federation on real Kubernetes control planes, on this machine: a hub, member clusters, every tier.

What ``meridian demo --kubernetes``, ``meridian bench federation`` and the end-to-end test run
(tests/e2e/test_federation_kubernetes.py):

* **members**: each a kube-apiserver with etcd and kube-controller-manager started from
  ``../shared/k8s`` (:mod:`meridian.envtest`; Deployments make ReplicaSets and Pods, Jobs make Pods),
  Ready Nodes without a kubelet (pods are bound, never run), the namespace the workloads go to, and
  Meridian's regional scheduler as its own process (``python -m regional_scheduler.kube_cli``): it binds
  the pods that ask for ``schedulerName: meridian``, publishes the cluster's summaries and consumes the
  cluster's dispatch stream into Deployments and Jobs (:mod:`regional_scheduler.kube_dispatch`);
* **hub**: a kube-apiserver holding each member's kubeconfig in a Secret, as Karmada and Cluster API
  keep them; the federation file (``docs/federation-config.md``) names those Secrets, and
  :meth:`KubeFederation.member_api` reaches a member through them, as an operator's tool would;
* **global scheduler**: in this process (engine and gRPC API on loopback), reading only the
  federation file; a private ``redis-server`` is the bus unless a URL is given.

A member's API server can be stopped and started again (:meth:`KubeFederation.stop_member_api`), which is
how failover is shown: its regional scheduler stops reporting once its API server stops answering.

Hazards: three control planes take ~1.5 GB of memory and ~30 s to start on a 2-core machine; pods
never run (no kubelet), so a service reaches ``SCHEDULED`` (every replica bound), not ``RUNNING``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from global_scheduler.federation_config import FederationConfig, api_client_for, load_federation_config
from global_scheduler.federation_sim import REGIONS
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import RunningServer, build_server
from global_scheduler.settings import GlobalSchedulerSettings
from meridian.bus import open_bus
from meridian.envtest import ControlPlane, create_ready_nodes, stop_process, with_parent_death_signal
from meridian_demo.embedded import PrivateRedis

log = logging.getLogger(__name__)

WORKLOAD_NAMESPACE = "meridian-workloads"
HUB_NAMESPACE = "meridian-clusters"  # where deploy/overlays/hub lets member kubeconfigs be read
WORKLOAD_LABEL = "meridian.io/workload"  # as regional_scheduler.kube_dispatch labels its objects
ATTEMPT_LABEL = "meridian.io/attempt"
MANAGED_SELECTOR = "app.kubernetes.io/managed-by=meridian"
REGIONAL_MANIFEST = Path(__file__).resolve().parents[1] / "deploy" / "base" / "regional-scheduler" / \
    "regional-scheduler.yaml"
REGIONAL_SERVICE_ACCOUNT = ("meridian-system", "meridian-regional-scheduler")


def _unix_s(stamp: str | None) -> float:
    """An RFC 3339 time of the API server (``2026-12-02T06:39:27Z``) as unix seconds; 0 when absent."""
    if not stamp:
        return 0.0
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


@dataclass(frozen=True)
class MemberSpec:
    name: str
    region: str
    nodes: int = 4
    node_cpu: str = "8"
    node_memory: str = "32Gi"


@dataclass
class Placed:
    """One Meridian object in a member cluster and its pods."""

    cluster: str
    kind: str
    name: str
    workload: str
    attempt: int
    pods: int = 0
    bound: int = 0
    created_unix_s: float = 0.0  # the object's creationTimestamp (the API server's clock, whole seconds)
    last_bound_unix_s: float = 0.0  # the latest PodScheduled=True transition of its pods (whole seconds)


@dataclass
class Member:
    spec: MemberSpec
    plane: ControlPlane
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    kubeconfig: Path | None = None  # the regional scheduler's identity

    @property
    def name(self) -> str:
        return self.spec.name


@dataclass
class KubeFederation:
    """Start with :meth:`start`, stop with :meth:`close` (or use it as a context manager)."""

    members: Sequence[MemberSpec]
    routing: str = "gnn"
    hub: bool = True
    bus_url: str | None = None
    registry_timeout_s: float = 5.0
    summary_interval_s: float = 1.0
    api_silence_s: float = 3.0
    unschedulable_grace_s: float = 60.0
    controller_qps: float = 200.0
    reconcile_grace_s: float = 20.0  # a burst of hundreds of dispatches takes seconds to show in holdings
    progress: Callable[[str], None] = field(default=lambda message: log.info("%s", message))
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="meridian-kube-federation-")))
    _members: dict[str, Member] = field(default_factory=dict)
    _hub: ControlPlane | None = None
    _redis: PrivateRedis | None = None
    _config: FederationConfig | None = None
    _clients: dict[str, client.ApiClient] = field(default_factory=dict)
    engine: GlobalScheduler | None = None
    server: RunningServer | None = None

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> KubeFederation:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def target(self) -> str:
        assert self.server is not None, "not started"
        return f"127.0.0.1:{self.server.port}"

    @property
    def config(self) -> FederationConfig:
        assert self._config is not None, "not started"
        return self._config

    def start(self, timeout_s: float = 120.0) -> KubeFederation:
        try:
            self._start(timeout_s)
        except BaseException:
            self.close()
            raise
        return self

    def _start(self, timeout_s: float) -> None:
        if self.bus_url is None:
            self._redis = PrivateRedis.start()
            if self._redis is None:
                raise RuntimeError("no redis-server to start a private bus with (apt-get install redis-server), "
                                   "and no bus URL given")
            self.bus_url = self._redis.url
        # kube-controller-manager's default client rate (20/s) would pace every Deployment → ReplicaSet → Pod
        # and be what the benchmark measures; a cluster this busy raises it, as this one does.
        planes = {m.name: ControlPlane(controller_manager=True, controller_manager_qps=self.controller_qps)
                  for m in self.members}
        hub = ControlPlane() if self.hub else None
        self.progress(f"starting {len(planes)} member control planes{' and a hub' if hub else ''} "
                      "(kube-apiserver, etcd, kube-controller-manager)")
        with ThreadPoolExecutor(max_workers=len(planes) + 1) as pool:
            for future in [pool.submit(p.start) for p in [*planes.values(), *([hub] if hub else [])]]:
                future.result()
        self._hub = hub
        if hub is not None:
            with hub.api_client() as hub_api:
                client.CoreV1Api(hub_api).create_namespace({"metadata": {"name": HUB_NAMESPACE}})
        for spec in self.members:
            self._members[spec.name] = Member(spec, planes[spec.name], self.workdir / f"regional-{spec.name}.log")
            self._prepare_member(self._members[spec.name])
        self._config = self._write_config()
        for member in self._members.values():
            self._start_regional(member)
        self._start_global()
        self.progress("waiting for every member's first summary")
        deadline = time.monotonic() + timeout_s
        assert self.engine is not None
        while set(self.engine.registry.names()) < set(self._members):
            for member in self._members.values():
                if member.process is not None and member.process.poll() is not None:
                    raise RuntimeError(f"the regional scheduler of {member.name} exited "
                                       f"({member.process.returncode}); its log:\n{self.regional_log(member.name)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"members {sorted(set(self._members) - set(self.engine.registry.names()))} "
                                   f"sent no summary in {timeout_s:.0f} s")
            time.sleep(0.1)
        self.progress(f"federation up: {', '.join(self._members)} reporting to the global scheduler at {self.target}")

    def _prepare_member(self, member: Member) -> None:
        if REGIONAL_MANIFEST.is_file():
            # The regional scheduler runs under its own ServiceAccount with the RBAC deploy/ grants it, so a
            # call that RBAC forbids fails here as it would in a real member.
            member.plane.apply_rbac(REGIONAL_MANIFEST)
            member.kubeconfig = member.plane.service_account_kubeconfig(*REGIONAL_SERVICE_ACCOUNT)
        else:
            log.warning("%s not found (not a source checkout): %s's regional scheduler runs as the admin",
                        REGIONAL_MANIFEST, member.name)
            member.kubeconfig = member.plane.admin_kubeconfig
        with member.plane.api_client() as api:
            core = client.CoreV1Api(api)
            try:
                core.create_namespace({"metadata": {"name": WORKLOAD_NAMESPACE}})
            except ApiException as exc:
                if exc.status != 409:  # the RBAC manifest creates it
                    raise
            try:  # pods need it; kube-controller-manager makes it a moment later, unless it was first
                core.create_namespaced_service_account(WORKLOAD_NAMESPACE, {"metadata": {"name": "default"}})
            except ApiException as exc:
                if exc.status != 409:
                    raise
            spec = member.spec
            create_ready_nodes(api, [{"name": f"{spec.name}-node-{i}",
                                      "capacity": {"cpu": spec.node_cpu, "memory": spec.node_memory}}
                                     for i in range(spec.nodes)], labels={"meridian.io/member": spec.name})
        if self._hub is not None:
            with self._hub.api_client() as hub_api:
                core = client.CoreV1Api(hub_api)
                data = base64.b64encode(member.plane.admin_kubeconfig.read_bytes()).decode()
                core.create_namespaced_secret(HUB_NAMESPACE, {"metadata": {"name": f"{member.name}-kubeconfig"},
                                                              "data": {"kubeconfig": data}})

    def _write_config(self) -> FederationConfig:
        regions: dict[str, Any] = {}
        for spec in self.members:
            known = REGIONS.get(spec.region)
            regions[spec.region] = ({"location": {"lat": known.lat, "lon": known.lon}, "pue": known.pue,
                                     "carbon": {"zone": known.carbon_zone}} if known is not None
                                    else {"location": {"lat": 0.0, "lon": 0.0}})
        clusters = []
        for spec in self.members:
            entry: dict[str, Any] = {"name": spec.name, "region": spec.region}
            if self._hub is not None:
                entry["secret"] = {"namespace": HUB_NAMESPACE, "name": f"{spec.name}-kubeconfig"}
            else:
                entry["kubeconfig"] = str(self._members[spec.name].plane.admin_kubeconfig)
            clusters.append(entry)
        path = self.workdir / "federation.yaml"
        path.write_text(yaml.safe_dump({"regions": regions, "clusters": clusters}, sort_keys=False))
        return load_federation_config(path)

    def _start_regional(self, member: Member) -> None:
        assert self.bus_url is not None
        env = {**os.environ,
               "MERIDIAN_SUMMARY_INTERVAL_S": str(self.summary_interval_s),
               "MERIDIAN_KUBE_DISPATCH_STATUS_INTERVAL_S": "0.5",
               "MERIDIAN_KUBE_DISPATCH_API_SILENCE_S": str(self.api_silence_s),
               "MERIDIAN_KUBE_DISPATCH_UNSCHEDULABLE_GRACE_S": str(self.unschedulable_grace_s),
               # Nothing confirms a graceful deletion without a kubelet: a released pod would stay Terminating.
               "MERIDIAN_KUBE_DISPATCH_TERMINATION_GRACE_PERIOD_S": "0"}
        argv = [sys.executable, "-m", "regional_scheduler.kube_cli", "--kubeconfig", str(member.kubeconfig),
                "--cluster", member.name, "--region", member.spec.region, "--bus-url", self.bus_url,
                "--no-leader-elect", "--metrics-port", "0", "--kube-api-qps", "0",
                "--workload-namespace", WORKLOAD_NAMESPACE]
        with open(member.log_path, "ab") as out:
            member.process = subprocess.Popen(with_parent_death_signal(argv), stdin=subprocess.DEVNULL, stdout=out,
                                              stderr=subprocess.STDOUT, env=env)

    def _start_global(self) -> None:
        assert self.bus_url is not None and self._config is not None
        settings = GlobalSchedulerSettings(
            api={"listen": "127.0.0.1:0", "max_workers": 32},
            bus={"url": self.bus_url, "block_ms": 50},
            registry={"cluster_timeout_s": self.registry_timeout_s, "sweep_interval_s": 0.5,
                      "config_file": Path(str(self._config.source))},
            reconcile={"interval_s": 2.0, "grace_s": self.reconcile_grace_s},
            routing={"policy": self.routing},
        )
        self.engine = GlobalScheduler(settings=settings, bus=open_bus(self.bus_url))
        self.server = build_server(self.engine, settings)  # starts the engine, then serves

    def close(self) -> None:
        if self.server is not None:
            self.server.stop(0.5)
            self.server = None
        if self.engine is not None:
            self.engine.stop()
            self.engine = None
        for member in self._members.values():
            if member.process is not None:
                stop_process(member.process)
                member.process = None
        for api in self._clients.values():
            api.close()
        self._clients.clear()
        planes = [m.plane for m in self._members.values()] + ([self._hub] if self._hub is not None else [])
        with ThreadPoolExecutor(max_workers=max(1, len(planes))) as pool:
            list(pool.map(lambda p: p.stop(), planes))
        self._members.clear()
        self._hub = None
        if self._redis is not None:
            self._redis.stop()
            self._redis = None
        shutil.rmtree(self.workdir, ignore_errors=True)

    # ------------------------------------------------------------------ members
    @property
    def member_names(self) -> list[str]:
        return list(self._members)

    def regional_log(self, name: str, lines: int = 60) -> str:
        path = self._members[name].log_path
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def member_api(self, name: str) -> client.ApiClient:
        """An API client for a member, made from the federation file's access (the kubeconfig in its hub
        Secret, read through the hub's API), as a tool in the hub reaches a member."""
        if name not in self._clients:
            hub = self._hub.api_client() if self._hub is not None else None
            try:
                self._clients[name] = api_client_for(self.config.cluster(name), hub=hub)
            finally:
                if hub is not None:
                    hub.close()
        return self._clients[name]

    def stop_member_api(self, name: str) -> None:
        self._members[name].plane.stop_api_server()

    def start_member_api(self, name: str) -> None:
        self._members[name].plane.start_api_server()

    def placed(self, name: str) -> list[Placed]:
        """The Meridian objects in member ``name`` (not being deleted) and how many of their pods are bound."""
        api = self.member_api(name)
        apps, batch, core = client.AppsV1Api(api), client.BatchV1Api(api), client.CoreV1Api(api)
        items: list[tuple[str, dict[str, Any]]] = []
        for kind, lister in (("Deployment", apps.list_namespaced_deployment), ("Job", batch.list_namespaced_job)):
            reply = lister(WORKLOAD_NAMESPACE, label_selector=MANAGED_SELECTOR, _preload_content=False,
                           _request_timeout=10)
            items += [(kind, o) for o in json.loads(reply.data)["items"] if not o["metadata"].get("deletionTimestamp")]
        pods = json.loads(core.list_namespaced_pod(WORKLOAD_NAMESPACE, label_selector=WORKLOAD_LABEL,
                                                   _preload_content=False, _request_timeout=10).data)["items"]
        out = {}
        for kind, obj in items:
            labels = obj["metadata"]["labels"]
            key = (labels[WORKLOAD_LABEL], labels[ATTEMPT_LABEL])
            out[key] = Placed(name, kind, obj["metadata"]["name"], key[0], int(key[1]),
                              created_unix_s=_unix_s(obj["metadata"].get("creationTimestamp")))
        for pod in pods:
            if pod["metadata"].get("deletionTimestamp"):
                continue
            labels = pod["metadata"].get("labels") or {}
            p = out.get((labels.get(WORKLOAD_LABEL, ""), labels.get(ATTEMPT_LABEL, "")))
            if p is not None:
                p.pods += 1
                p.bound += bool(pod["spec"].get("nodeName"))
                for c in pod.get("status", {}).get("conditions") or ():
                    if c.get("type") == "PodScheduled" and c.get("status") == "True":
                        p.last_bound_unix_s = max(p.last_bound_unix_s, _unix_s(c.get("lastTransitionTime")))
        return list(out.values())

    def live_pods(self, name: str) -> int:
        """Pods of Meridian workloads in member ``name`` that are not being deleted (any attempt)."""
        core = client.CoreV1Api(self.member_api(name))
        pods = json.loads(core.list_namespaced_pod(WORKLOAD_NAMESPACE, label_selector=WORKLOAD_LABEL,
                                                   _preload_content=False, _request_timeout=10).data)["items"]
        return sum(1 for p in pods if not p["metadata"].get("deletionTimestamp"))

    def placements(self, members: Sequence[str] | None = None) -> dict[str, list[Placed]]:
        """Every workload's objects across the members (all, or those named), by workload id."""
        out: dict[str, list[Placed]] = {}
        for name in members if members is not None else self._members:
            for p in self.placed(name):
                out.setdefault(p.workload, []).append(p)
        return out
