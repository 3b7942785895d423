"""kube-scheduler's extender protocol, served from the regional scheduler's own cluster state.

A team that keeps the stock kube-scheduler adds Meridian's filter and scores through its
``extenders`` configuration (``deploy/base/extender/regional-scheduler-extender.yaml``). kube-scheduler
first runs its own filters, then POSTs to ``<urlPrefix>/<filterVerb>`` and ``<urlPrefix>/<prioritizeVerb>``:

* ``ExtenderArgs`` ``{"pod": Pod, "nodes": NodeList}`` or, with ``nodeCacheCapable: true``,
  ``{"pod": Pod, "nodenames": [...]}``; both are served.
* filter answers ``ExtenderFilterResult`` ``{"nodes"|"nodenames", "failedNodes": {name: reason},
  "error"}`` in the same shape it was asked. Meridian rejects what kube-scheduler cannot see: a
  shared-GPU pod (``meridian.io/gpu-milli``) needs one *device* with room, where kube-scheduler only
  counts the node's pool.
* prioritize answers ``HostPriorityList`` ``[{"host", "score"}]`` with scores 0–10 (the extender
  maximum; kube-scheduler multiplies by 10 and the extender's ``weight``): the active policy's
  scores, rescaled so that its best node gets 10 and its worst 0.

The state is the one the informers keep (every bound pod, whoever bound it), so the scores reflect
the pods kube-scheduler itself bound a moment ago. Pod features kube-scheduler handles itself
(affinity, volumes) are not refused here: kube-scheduler has filtered for them already.
"""

from __future__ import annotations

import json
import logging
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np

from regional_scheduler import kube_objects as ko
from regional_scheduler.service import RegionalScheduler

log = logging.getLogger(__name__)

MAX_EXTENDER_PRIORITY = 10


def _node_names(args: dict[str, Any]) -> tuple[list[str], dict[str, dict[str, Any]] | None]:
    names = args.get("nodenames") if args.get("nodenames") is not None else args.get("NodeNames")
    if names is not None:
        return list(names), None
    nodes = args.get("nodes") or args.get("Nodes") or {}
    items = nodes.get("items") or []
    by_name = {(n.get("metadata") or {}).get("name", ""): n for n in items}
    return list(by_name), by_name


def _pod(args: dict[str, Any]) -> Any:
    pod = args.get("pod") or args.get("Pod")
    if not isinstance(pod, dict):
        raise ValueError("ExtenderArgs without a pod")
    return ko.pod_from_api(pod, check_supported=False)


def filter_nodes(service: RegionalScheduler, args: dict[str, Any]) -> dict[str, Any]:
    names, objects = _node_names(args)
    try:
        pod = _pod(args)
    except (ValueError, ko.InvalidObjectError) as exc:
        return {"error": str(exc)}
    evaluation = service.evaluate(pod, names)
    passed = [n for n in names if n in evaluation.scores]
    out: dict[str, Any] = {"failedNodes": evaluation.rejected}
    if objects is None:
        out["nodenames"] = passed
    else:
        out["nodes"] = {"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                        "items": [objects[n] for n in passed]}
    return out


def prioritize(service: RegionalScheduler, args: dict[str, Any]) -> list[dict[str, Any]]:
    names, _ = _node_names(args)
    pod = _pod(args)
    evaluation = service.evaluate(pod, names)
    if not evaluation.scores:
        return [{"host": n, "score": 0} for n in names]
    values = np.array(list(evaluation.scores.values()), dtype=float)
    low, high = float(values.min()), float(values.max())
    scaled = {name: (MAX_EXTENDER_PRIORITY if high == low else
                     round(MAX_EXTENDER_PRIORITY * (score - low) / (high - low)))
              for name, score in evaluation.scores.items()}
    return [{"host": n, "score": scaled.get(n, 0)} for n in names]


class _Handler(BaseHTTPRequestHandler):
    server: ExtenderServer

    def log_message(self, fmt: str, *args: Any) -> None:
        log.debug("extender: " + fmt, *args)

    def _reply(self, status: HTTPStatus, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("healthz"):
            self._reply(HTTPStatus.OK, {"status": "ok", **self.server.service.counts()})
        else:
            self._reply(HTTPStatus.NOT_FOUND, {"error": f"no such path {self.path}"})

    def do_POST(self) -> None:
        prefix = self.server.prefix
        verb = self.path[len(prefix):].strip("/") if self.path.startswith(prefix) else ""
        try:
            length = int(self.headers.get("Content-Length") or 0)
            args = json.loads(self.rfile.read(length) or b"{}")
        except (ValueError, json.JSONDecodeError) as exc:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": f"request body is not ExtenderArgs JSON: {exc}"})
            return
        try:
            if verb == "filter":
                self._reply(HTTPStatus.OK, filter_nodes(self.server.service, args))
            elif verb == "prioritize":
                self._reply(HTTPStatus.OK, prioritize(self.server.service, args))
            else:
                self._reply(HTTPStatus.NOT_FOUND, {"error": f"unknown extender verb {verb!r}; serving filter, "
                                                   "prioritize"})
        except (ValueError, ko.InvalidObjectError) as exc:
            self._reply(HTTPStatus.BAD_REQUEST, {"error": str(exc)})
        except Exception as exc:
            log.exception("extender %s failed", verb)
            self._reply(HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"{verb} failed: {exc}"})


class ExtenderServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address: tuple[str, int], service: RegionalScheduler, *, prefix: str = "/meridian") -> None:
        super().__init__(address, _Handler)
        self.service = service
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}{self.prefix}"

    def start(self) -> ExtenderServer:
        self.thread = threading.Thread(target=self.serve_forever, name="extender", daemon=True)
        self.thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def parse_listen(listen: str) -> tuple[str, int]:
    host, _, port = listen.rpartition(":")
    if not port.isdigit():
        raise ValueError(f"extender address {listen!r} must be HOST:PORT, e.g. 0.0.0.0:8888")
    return host or "0.0.0.0", int(port)
