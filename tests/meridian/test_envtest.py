"""meridian.envtest: the binaries are found or unpacked, and the control plane it starts is a real one:
RBAC enforced per ServiceAccount, controllers creating pods, the stock scheduler binding them."""

from __future__ import annotations

import lzma
import os
import shutil
import stat
import threading
import uuid
from pathlib import Path

import pytest
import yaml
from kube_helpers import bind_pod, pending_pod, ready_nodes
from kubernetes.client import ApiClient, AppsV1Api, AuthenticationV1Api, CoreV1Api
from kubernetes.client.exceptions import ApiException

from meridian import envtest
from meridian.envtest import AssetsNotFoundError, ControlPlane, ControlPlaneError, ensure_assets, wait_for

ROOT = Path(__file__).resolve().parents[2]
NO_SCHEDULER = "meridian-test-nobody"  # a schedulerName nothing serves: pods stay Pending anywhere


# ------------------------------------------------------------------------------ assets (no cluster)


def _fake_binaries(tmp_path: Path) -> tuple[Path, Path]:
    """A directory of tiny xz-compressed scripts and a PATH directory holding a fake etcd."""
    src, bin_dir = tmp_path / "k8s", tmp_path / "bin"
    src.mkdir()
    bin_dir.mkdir()
    for name in envtest.BINARIES:
        if name != "etcd":
            (src / f"{name}.xz").write_bytes(lzma.compress(f"#!/bin/sh\necho {name}\n".encode()))
    etcd = bin_dir / "etcd"
    etcd.write_text("#!/bin/sh\necho etcd\n")
    etcd.chmod(0o755)
    return src, bin_dir


def test_ensure_assets_unpacks_once_into_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    src, bin_dir = _fake_binaries(tmp_path)
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    results: list[Path] = []
    threads = [threading.Thread(target=lambda: results.append(ensure_assets(src))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assets = results[0]
    assert set(results) == {assets}
    assert assets == tmp_path / "cache" / "meridian" / f"k8s-{envtest.K8S_VERSION}"
    for name in envtest.BINARIES:
        assert os.access(assets / name, os.X_OK), name
    assert (assets / "kube-scheduler").read_text() == "#!/bin/sh\necho kube-scheduler\n"
    assert (assets / "etcd").resolve() == (bin_dir / "etcd").resolve()
    assert not [p for p in assets.iterdir() if p.name.startswith(".") and ".kube" in p.name and
                not p.name.endswith(".source")], "no temporary files left behind"

    mtime = (assets / "kube-apiserver").stat().st_mtime_ns
    assert ensure_assets(src) == assets
    assert (assets / "kube-apiserver").stat().st_mtime_ns == mtime, "unpacked again"

    # A changed source is unpacked again.
    (src / "kube-apiserver.xz").write_bytes(lzma.compress(b"#!/bin/sh\necho v2\n"))
    ensure_assets(src)
    assert (assets / "kube-apiserver").read_text() == "#!/bin/sh\necho v2\n"


def test_ensure_assets_prefers_kubebuilder_assets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assets = tmp_path / "assets"
    assets.mkdir()
    for name in ("etcd", "kube-apiserver"):
        (assets / name).write_text("#!/bin/sh\n")
        (assets / name).chmod(stat.S_IRWXU)
    monkeypatch.setenv("KUBEBUILDER_ASSETS", str(assets))
    assert ensure_assets(tmp_path / "nowhere") == assets


def test_ensure_assets_says_what_is_missing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBEBUILDER_ASSETS", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no etcd
    with pytest.raises(AssetsNotFoundError) as e:
        ensure_assets(tmp_path / "nowhere")
    message = str(e.value)
    assert "kube-apiserver.xz" in message and "etcd is not on PATH" in message
    assert "apt-get install -y etcd-server" in message and "KUBEBUILDER_ASSETS" in message


@pytest.mark.kubernetes
def test_a_failing_api_server_is_reported_with_its_log(tmp_path: Path) -> None:
    etcd = shutil.which("etcd")
    if etcd is None:
        pytest.skip("etcd is not installed")
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "etcd").symlink_to(etcd)
    (assets / "kube-apiserver").write_text("#!/bin/sh\necho 'E0101 bad flag --nonsense' >&2\nexit 3\n")
    (assets / "kube-apiserver").chmod(0o755)
    plane = ControlPlane(assets=assets, startup_timeout=20)
    with pytest.raises(ControlPlaneError, match=r"kube-apiserver exited with status 3(.|\n)*bad flag --nonsense"):
        plane.start()
    assert not plane.workdir.exists(), "the temp dir is removed"
    assert plane.processes == {}


# ----------------------------------------------------------------------------------- real cluster


@pytest.mark.kubernetes
def test_rbac_of_the_regional_scheduler_manifest_is_enforced(
        kube_control_plane: ControlPlane, kube_api: ApiClient, kube_namespace: str) -> None:
    core = CoreV1Api(kube_api)
    kube_control_plane.apply_rbac(ROOT / "deploy" / "regional-scheduler.yaml")
    kube_control_plane.apply_rbac(ROOT / "deploy" / "regional-scheduler.yaml")  # idempotent: replaces
    with pytest.raises(ApiException) as missing:  # only identities and permissions are applied
        AppsV1Api(kube_api).read_namespaced_deployment("meridian-regional-scheduler", "meridian-system")
    assert missing.value.status == 404

    kubeconfig = kube_control_plane.service_account_kubeconfig("meridian-system", "meridian-regional-scheduler")
    node_spec = {"name": f"rbac-{uuid.uuid4().hex[:8]}", "capacity": {"cpu": "4", "memory": "8Gi"}}
    with ready_nodes(kube_api, [node_spec]) as (nodes, _), kube_control_plane.api_client(kubeconfig) as sa_api:
        review = AuthenticationV1Api(sa_api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
        assert review.status.user_info.username == \
            "system:serviceaccount:meridian-system:meridian-regional-scheduler"

        sa_core = CoreV1Api(sa_api)
        assert nodes[0] in {n.metadata.name for n in sa_core.list_node().items}
        core.create_namespaced_pod(kube_namespace, pending_pod("p", scheduler_name=NO_SCHEDULER))
        assert bind_pod(sa_api, kube_namespace, "p", nodes[0]) == 201
        assert core.read_namespaced_pod("p", kube_namespace).spec.node_name == nodes[0]

        with pytest.raises(ApiException) as denied:
            sa_core.delete_node(nodes[0])
        assert denied.value.status == 403
        deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "nope"},
                      "spec": {"selector": {"matchLabels": {"app": "nope"}},
                               "template": {"metadata": {"labels": {"app": "nope"}},
                                            "spec": pending_pod("x")["spec"]}}}
        with pytest.raises(ApiException) as denied:
            AppsV1Api(sa_api).create_namespaced_deployment(kube_namespace, deployment)
        assert denied.value.status == 403


@pytest.mark.kubernetes
def test_create_ready_nodes_makes_ready_untainted_nodes(kube_api: ApiClient) -> None:
    core = CoreV1Api(kube_api)
    run = uuid.uuid4().hex[:8]
    gpu_taint = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
    specs = [{"name": f"{run}-cpu-{i}", "capacity": {"cpu": "16", "memory": "64Gi"},
              "allocatable": {"cpu": "15500m", "memory": "62Gi", "pods": "64"},
              "labels": {"meridian.test/pool": "cpu"}} for i in range(40)]
    specs.append({"name": f"{run}-gpu", "capacity": {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": 8},
                  "taints": [gpu_taint]})
    with ready_nodes(kube_api, specs) as (names, selector):
        assert sorted(names) == sorted(s["name"] for s in specs)
        by_name = {n.metadata.name: n for n in core.list_node(label_selector=selector).items}
        assert set(by_name) == set(names)
        for name, node in by_name.items():
            ready = [c for c in node.status.conditions if c.type == "Ready"]
            assert [c.status for c in ready] == ["True"], name
            assert node.metadata.labels["kubernetes.io/hostname"] == name
        cpu = by_name[f"{run}-cpu-0"]
        assert not cpu.spec.taints
        assert cpu.metadata.labels["meridian.test/pool"] == "cpu"
        assert cpu.status.allocatable == {"cpu": "15500m", "memory": "62Gi", "pods": "64"}
        assert cpu.status.capacity == {"cpu": "16", "memory": "64Gi", "pods": "110"}
        gpu = by_name[f"{run}-gpu"]
        assert [(t.key, t.value, t.effect) for t in gpu.spec.taints] == [("nvidia.com/gpu", "present", "NoSchedule")]
        assert gpu.status.allocatable == {"cpu": "32", "memory": "128Gi", "nvidia.com/gpu": "8", "pods": "110"}
    assert core.list_node(label_selector=selector).items == []


@pytest.mark.kubernetes
def test_controller_manager_creates_a_deployments_pods(kube_api: ApiClient, kube_namespace: str) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"},
                  "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                           "template": {"metadata": {"labels": {"app": "web"}},
                                        "spec": pending_pod("unused", scheduler_name=NO_SCHEDULER)["spec"]}}}
    AppsV1Api(kube_api).create_namespaced_deployment(kube_namespace, deployment)
    core = CoreV1Api(kube_api)
    pods = wait_for(lambda: (items := core.list_namespaced_pod(kube_namespace, label_selector="app=web").items)
                    and len(items) == 3 and items, timeout=30, message="3 pods of the Deployment")
    assert all(p.status.phase == "Pending" and not p.spec.node_name for p in pods)
    assert all(p.metadata.owner_references[0].kind == "ReplicaSet" for p in pods)


@pytest.mark.kubernetes
def test_stock_kube_scheduler_binds_a_pod(kube_control_plane: ControlPlane, kube_api: ApiClient,
                                          kube_namespace: str) -> None:
    scheduler_name = f"envtest-{uuid.uuid4().hex[:8]}"  # its own profile: no other scheduler takes the pod
    core = CoreV1Api(kube_api)
    specs = [{"name": f"{scheduler_name}-small", "capacity": {"cpu": "1", "memory": "1Gi"}},
             {"name": f"{scheduler_name}-big", "capacity": {"cpu": "8", "memory": "16Gi"}}]
    with ready_nodes(kube_api, specs) as (_names, selector):
        proc = kube_control_plane.start_kube_scheduler({"profiles": [{"schedulerName": scheduler_name}]})
        log = kube_control_plane.process_log(proc)
        config_file = next(a.removeprefix("--config=") for a in proc.args if a.startswith("--config="))
        config = yaml.safe_load(Path(config_file).read_text())
        assert config["clientConnection"]["kubeconfig"] == str(kube_control_plane.admin_kubeconfig)
        assert config["leaderElection"]["leaderElect"] is False
        run_label = selector.split("=")
        core.create_namespaced_pod(kube_namespace, pending_pod(
            "needs-2-cpus", cpu="2", scheduler_name=scheduler_name, node_selector={run_label[0]: run_label[1]}))
        try:
            node = wait_for(lambda: core.read_namespaced_pod("needs-2-cpus", kube_namespace).spec.node_name,
                            timeout=30, message="the kube-scheduler to bind the pod")
        except TimeoutError as e:
            raise AssertionError(f"{e}; kube-scheduler log:\n{envtest.tail(log)}") from None
        assert node == f"{scheduler_name}-big"
        assert proc.poll() is None, envtest.tail(log)
        kube_control_plane.stop_process(proc)
        assert proc.poll() is not None


@pytest.mark.kubernetes
def test_an_existing_cluster_through_its_kubeconfig(kube_control_plane: ControlPlane, kube_namespace: str,
                                                    tmp_path: Path) -> None:
    admin = yaml.safe_load(kube_control_plane.admin_kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    if cluster.get("certificate-authority"):  # a relative CA path must resolve against the kubeconfig
        shutil.copy(cluster["certificate-authority"], tmp_path / "ca.crt")
        cluster["certificate-authority"] = "ca.crt"
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(admin))

    with ControlPlane.from_kubeconfig(kubeconfig) as external:
        assert external.external and external.server == kube_control_plane.server
        assert external.processes == {}
        with external.api_client() as api:
            assert "kube-system" in {ns.metadata.name for ns in CoreV1Api(api).list_namespace().items}
            envtest.apply_rbac_documents(api, [{"apiVersion": "v1", "kind": "ServiceAccount",
                                                "metadata": {"name": "probe", "namespace": kube_namespace}}])
        sa_kubeconfig = external.service_account_kubeconfig(kube_namespace, "probe")
        with external.api_client(sa_kubeconfig) as sa_api, pytest.raises(ApiException) as denied:
            CoreV1Api(sa_api).list_node()
        assert denied.value.status == 403
    assert kube_control_plane.admin_kubeconfig.exists(), "the external plane's stop() leaves the cluster alone"
