"""Every overlay applies cleanly to a real v1.36.2 API server (issue 23, item 6): ``kubectl apply -k`` with
a server-side dry run, then for real, server-side, with the admin's kubeconfig.

The control plane is this module's own (etcd, kube-apiserver and kube-controller-manager from
``meridian.envtest``), not the session's: the overlays create cluster-wide objects (the regional
scheduler's ClusterRole, meridian-system) that other tests apply and use under the same names, so applying
and deleting them there could pull them from under a test running in the same process. With the
controller manager running, Deployments and the DaemonSet make pods, so the namespaces' Pod Security
levels are enforced on real pods: an overlay whose pods the API server refuses fails here too.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator

import pytest
from kubernetes.client import AppsV1Api, CoreV1Api

from meridian import envtest
from meridian.envtest import wait_for
from tests.deploy.kustomize_helpers import DEPLOY, EXTRA_KUSTOMIZATIONS, OVERLAYS, in_ci, kubectl, render
from tests.kube_helpers import create_ready_nodes

pytestmark = pytest.mark.kubernetes

#: The warnings expected, and no others: the node agent's namespace warns at `baseline`, which its
#: DaemonSet does not meet, by design (deploy/base/node-agent/node-agent.yaml says why); and the TLS
#: Secret's placeholder is no PEM, as the API server says (a reminder to replace it).
EXPECTED_WARNINGS = (
    'would violate PodSecurity "baseline:latest": non-default capabilities (container "agent" must not include '
    '"DAC_READ_SEARCH" in securityContext.capabilities.add), hostPath volumes',
    "tls: failed to find any PEM data in certificate input",
)


@pytest.fixture(scope="module")
def plane() -> Iterator[envtest.ControlPlane]:
    control_plane = envtest.ControlPlane(controller_manager=True)
    try:
        control_plane.start()
    except envtest.AssetsNotFoundError as exc:
        if in_ci():
            pytest.fail(str(exc))
        pytest.skip(str(exc))
    try:
        yield control_plane
    finally:
        control_plane.stop()


def _kubectl(plane: envtest.ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kubectl()), f"--kubeconfig={plane.admin_kubeconfig}", *args],
                          capture_output=True, text=True, timeout=120)


def _path(kustomization: str) -> str:
    return str(DEPLOY / ("overlays/" + kustomization if kustomization in OVERLAYS else kustomization))


def _unexpected_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not any(w in line for w in EXPECTED_WARNINGS)]


def _apply(plane: envtest.ControlPlane, kustomization: str, *extra: str) -> subprocess.CompletedProcess[str]:
    done = _kubectl(plane, "apply", "-k", _path(kustomization), "--server-side", *extra)
    assert done.returncode == 0, f"kubectl apply -k {kustomization} {' '.join(extra)}:\n{done.stderr}"
    assert not _unexpected_warnings(done.stderr), done.stderr
    return done


@pytest.mark.parametrize("kustomization", [*OVERLAYS, *EXTRA_KUSTOMIZATIONS])
def test_the_overlay_applies(plane: envtest.ControlPlane, kustomization: str) -> None:
    # A server-side dry run creates nothing, so the objects of a namespace the same run would create fail
    # with NotFound: the namespaces first, for real (as `kubectl apply` orders them), then the dry run.
    namespaces = [d for d in render(kustomization) if d["kind"] == "Namespace"]
    if namespaces:
        done = subprocess.run([str(kubectl()), f"--kubeconfig={plane.admin_kubeconfig}", "apply", "--server-side",
                               "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List", "items": namespaces}),
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
    dry = _apply(plane, kustomization, "--dry-run=server")
    assert "serverside-applied (server dry run)" in dry.stdout
    _apply(plane, kustomization)
    # every rendered object is there, as rendered: a server-side diff would show a missing or changed one
    again = _kubectl(plane, "diff", "-k", _path(kustomization), "--server-side")
    assert again.returncode == 0, again.stdout + again.stderr


def test_the_pods_are_admitted(plane: envtest.ControlPlane) -> None:
    """After all-in-one: every Deployment's ReplicaSet made its pods and the DaemonSet made one on the Node,
    so the Pod Security admission of every namespace let them in (no kubelet: they never run)."""
    _apply(plane, "all-in-one")
    with plane.api_client() as api:
        create_ready_nodes(api, [{"name": "deploy-test-node", "capacity": {"cpu": "8", "memory": "32Gi"}}])
        apps, core = AppsV1Api(api), CoreV1Api(api)
        deployments = [d for d in render("all-in-one") if d["kind"] == "Deployment"]
        assert deployments

        def made_all() -> bool:
            for d in deployments:
                live = apps.read_namespaced_deployment(d["metadata"]["name"], d["metadata"]["namespace"])
                if (live.status.replicas or 0) < d["spec"]["replicas"]:
                    return False
            agent = apps.read_namespaced_daemon_set("meridian-node-agent", "meridian-node-agent")
            return (agent.status.current_number_scheduled or 0) >= 1

        try:
            wait_for(made_all, timeout=60)
        except Exception:
            events = core.list_event_for_all_namespaces(field_selector="type=Warning").items
            pytest.fail("pods not made: " + "; ".join(f"{e.involved_object.name}: {e.message}" for e in events))
