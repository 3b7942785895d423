"""The scale-subresource driver builds official client models; we check what it would send."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes import client

from regional_scheduler.autoscaling.k8s_driver import ScaleSubresourceDriver, build_scale


class RecordingAppsApi:
    """Records the calls the driver makes; it answers nothing a real API server would decide."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, str, Any, dict[str, Any]]] = []

    def read_namespaced_deployment_scale(self, name: str, namespace: str, **kwargs: Any) -> client.V1Scale:
        self.calls.append(("read", name, namespace, None, kwargs))
        return client.V1Scale(spec=client.V1ScaleSpec(replicas=3), status=client.V1ScaleStatus(replicas=2))

    def replace_namespaced_deployment_scale(self, name: str, namespace: str, body: client.V1Scale,
                                            **kwargs: Any) -> client.V1Scale:
        self.calls.append(("replace", name, namespace, body, kwargs))
        return body


def test_scale_body_serialises_to_the_autoscaling_v1_scale_wire_format() -> None:
    body = build_scale(name="web", namespace="shop", replicas=7, resource_version="42")
    wire = client.ApiClient().sanitize_for_serialization(body)
    assert wire == {"apiVersion": "autoscaling/v1", "kind": "Scale",
                    "metadata": {"name": "web", "namespace": "shop", "resourceVersion": "42"},
                    "spec": {"replicas": 7}}


def test_negative_replicas_are_refused() -> None:
    with pytest.raises(ValueError, match="replicas"):
        build_scale(name="web", namespace="shop", replicas=-1)


@pytest.mark.parametrize(
    ("dry_run", "kwargs"),
    [pytest.param(False, {}, id="live"), pytest.param(True, {"dry_run": "All"}, id="server-side-dry-run")],
)
def test_driver_replaces_the_scale_subresource(dry_run: bool, kwargs: dict[str, Any]) -> None:
    api = RecordingAppsApi()
    driver = ScaleSubresourceDriver(api, name="web", namespace="shop", dry_run=dry_run)
    assert driver.current() == (3, 2)
    driver.set_replicas(5)
    _, name, namespace, body, sent = api.calls[-1]
    assert (name, namespace, sent) == ("web", "shop", kwargs)
    assert isinstance(body, client.V1Scale) and body.spec.replicas == 5


def test_driver_uses_real_apps_v1_method_names() -> None:
    """The methods the driver calls exist on the official client with these parameters."""
    import inspect

    for method in ("read_namespaced_deployment_scale", "replace_namespaced_deployment_scale"):
        assert hasattr(client.AppsV1Api, method)
    params = inspect.signature(client.AppsV1Api.replace_namespaced_deployment_scale).parameters
    assert list(params)[1:4] == ["name", "namespace", "body"]
