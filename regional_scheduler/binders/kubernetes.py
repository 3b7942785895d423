"""``kubernetes``: bind through the Pod's ``binding`` subresource, as kube-scheduler's DefaultBinder does.

The official client's ``create_namespaced_pod_binding`` applies the binding and then may raise while
decoding the reply: the API server answers with a ``Status`` object, which the generated code tries to
read as a ``V1Binding`` and fails on (``ValueError: Invalid value for `target`, must not be `None```).
Catching that ``ValueError`` would also swallow real client-side errors, so the call is made with
``_preload_content=False``: success is the HTTP status (201), and every failure is an ``ApiException``
with the server's code. 409 (already bound) and 404 (pod gone) are told apart because neither is
retried.

The binding's annotations are copied onto the pod by the API server, which is how the GPU device
of a shared-GPU pod reaches every replica of the scheduler.
"""

from __future__ import annotations

from kubernetes import client
from kubernetes.client.rest import ApiException

from regional_scheduler.binders.base import BindConflictError, BindError, BindRequest, PodGoneError
from regional_scheduler.rate_limit import TokenBucket

NAME = "kubernetes"


class KubernetesBinder:
    name = NAME

    def __init__(self, api: client.ApiClient, *, limiter: TokenBucket | None = None,
                 request_timeout_s: float = 30.0) -> None:
        self.core = client.CoreV1Api(api)
        self.limiter = limiter
        # An API server that stops answering must fail the binding (rolled back, retried after a
        # back-off), not hold its assumption and a binding thread forever.
        self.request_timeout_s = request_timeout_s

    def bind(self, request: BindRequest) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": request.name, "namespace": request.namespace, "uid": request.uid,
                         "annotations": dict(request.annotations)},
            "target": {"apiVersion": "v1", "kind": "Node", "name": request.node},
        }
        if self.limiter is not None:
            self.limiter.acquire()
        try:
            reply = self.core.create_namespaced_pod_binding(request.name, request.namespace, body,
                                                            _preload_content=False,
                                                            _request_timeout=self.request_timeout_s)
        except ApiException as exc:
            if exc.status == 409:
                raise BindConflictError(f"pod {request.key} is already bound: {exc.reason}") from exc
            if exc.status == 404:
                raise PodGoneError(f"pod {request.key} no longer exists") from exc
            raise BindError(f"binding {request.key} to {request.node} failed: HTTP {exc.status} {exc.reason}: "
                            f"{(exc.body or '')[:300]}") from exc
        except Exception as exc:  # connection refused, timeouts: the binding may not have been made
            raise BindError(f"binding {request.key} to {request.node} failed: {exc}") from exc
        status = reply.status
        reply.read()  # drain, so the connection goes back to the pool
        reply.release_conn()
        if not 200 <= status < 300:
            raise BindError(f"binding {request.key} to {request.node} failed: HTTP {status}")
