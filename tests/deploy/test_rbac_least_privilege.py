"""Least-privilege RBAC, checked against the code (issue 23, item 6).

For each deployed component, the Kubernetes API calls its package makes are found statically (an AST scan
of its source), each mapped to the (apiGroup, resource[/subresource], verb) the API server authorizes,
and compared with what the rendered overlays grant its ServiceAccount:

(a) every call is allowed by a Role or ClusterRole bound to the component's ServiceAccount (a call
    without a namespace, on a cluster-scoped resource or across all namespaces, needs a ClusterRoleBinding);
(b) every granted verb is used by some call: no unused grant;
and nowhere is a wildcard verb, resource or apiGroup granted.

The mapping is not a hand-written table: the kubernetes client's generated API classes hold the HTTP
method and URL path of every method (``_<method>_serialize`` → ``param_serialize(method=..., resource_path=...)``),
and the verb follows from them as the API server derives it (GET on an object: get, on a collection: list,
or watch with ``watch=True``; POST: create; PUT: update; PATCH: patch, and create as well in a module that
patches with server-side apply (``application/apply-patch+yaml``), which creates what does not exist yet;
DELETE: delete or deletecollection). A list method that is referenced but not called is
taken to watch when handed to ``watch.Watch().stream``, to list and watch when handed to an informer
(``list_fn=core.list_node``, or any call of a ``*Informer``), and otherwise to do what the call it is
handed to says with its ``watch=`` keyword (a retry wrapper: ``self._call(core.list_namespaced_pod, ns)``
lists). New calls anywhere in a component's package are picked up without touching this test.

Raw calls (``api_client.call_api(method, path)``, ``param_serialize(method=..., resource_path=...)``) are
mapped the same way when the method and path are literals (or f-strings); any other raw call, and any use
of ``kubernetes.dynamic`` or ``kubernetes.utils`` (whose resources are chosen at run time), fails the test
until it is handled here or listed in ``UNCHECKED`` with the grant it needs.

Not scanned: ``bench_*.py`` modules (benchmark drivers run by an operator with the test cluster's admin
credentials, never in a deployed pod) and ``meridian/envtest.py`` (the test control plane). The shared core
(``meridian/``) must make no API calls at all, so none escapes attribution to a component.
"""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes.client.api
import pytest

from tests.deploy.kustomize_helpers import EXTRA_KUSTOMIZATIONS, OVERLAYS, REPO, render, workloads


@dataclass(frozen=True)
class Component:
    namespace: str
    service_account: str
    sources: tuple[str, ...]
    exclude: tuple[str, ...] = ()


#: Deployed component (its pods' app.kubernetes.io/component label) → its ServiceAccount and its code.
COMPONENTS = {
    "node-agent": Component("meridian-node-agent", "meridian-node-agent", ("node_agent",)),
    "regional-scheduler": Component("meridian-system", "meridian-regional-scheduler", ("regional_scheduler",),
                                    exclude=("regional_scheduler/autoscaling",)),
    "autoscaler": Component("meridian-system", "meridian-autoscaler", ("regional_scheduler/autoscaling",)),
    "global-scheduler": Component("meridian-system", "meridian-global-scheduler", ("global_scheduler",)),
}
#: Calls this scan cannot resolve, by (file, enclosing function) → the (apiGroup, resource, verb)s they need.
UNCHECKED: dict[tuple[str, str], set[tuple[str, str, str]]] = {}
#: Not part of any deployed process.
NOT_SCANNED = re.compile(r"(^|/)bench_[^/]*\.py$")
HTTP_VERBS = {"GET", "POST", "PUT", "PATCH", "DELETE"}
RAW_CALLS = {"call_api", "param_serialize"}


@dataclass(frozen=True)
class Access:
    group: str
    resource: str
    verb: str
    cluster_wide: bool  # no namespace in the path: a cluster-scoped resource or all namespaces


@dataclass(frozen=True)
class Call:
    """One access a call needs; ``options`` are its alternatives when the API class of the receiver is not
    known statically (the same method name in several API groups): any one of them, granted, allows it."""

    where: str
    name: str
    options: tuple[Access, ...]

    @property
    def access(self) -> Access:
        return self.options[0]


# ------------------------------------------------------------------ the client's methods → HTTP


@functools.cache
def client_methods() -> dict[str, dict[str, tuple[str, str]]]:
    """Every generated API method name (plain, ``_with_http_info``, ``_without_preload_content``) → its API
    class (``CoreV1Api``, ``EventsV1Api``, ...) → its (HTTP method, resource path), read from the kubernetes
    client package's source. Names are not unique across classes (``create_namespaced_event`` is in the
    core and the events.k8s.io API), hence the class."""
    out: dict[str, dict[str, tuple[str, str]]] = {}
    serialize = re.compile(r"def _(\w+)_serialize\(")
    request = re.compile(r"method='(\w+)',\s*resource_path='([^']+)'")
    for module in sorted(Path(kubernetes.client.api.__file__).parent.glob("*_api.py")):
        text = module.read_text()
        klass = re.search(r"^class (\w+)", text, re.M)
        if klass is None:
            continue
        for m in serialize.finditer(text):
            r = request.search(text, m.end())
            if r is None:
                continue
            for name in (m.group(1), f"{m.group(1)}_with_http_info", f"{m.group(1)}_without_preload_content"):
                out.setdefault(name, {})[klass.group(1)] = (r.group(1), r.group(2))
    assert len(out) > 1000, "the kubernetes client's generated methods were not found"
    return out


def classify(http: str, path: str, *, watch: bool = False) -> Access | None:
    """The RBAC (group, resource, verb) of a request, as the API server's RequestInfo derives it; None for
    a non-resource path (discovery, /version)."""
    segs = [s for s in path.split("?")[0].split("/") if s]
    if len(segs) >= 2 and segs[0] == "api":
        group, rest = "", segs[2:]
    elif len(segs) >= 3 and segs[0] == "apis":
        group, rest = segs[1], segs[3:]
    else:
        return None
    if rest and rest[0] == "watch":
        watch, rest = True, rest[1:]
    cluster_wide = True
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[1].startswith("{"):
        cluster_wide, rest = False, rest[2:]
    if not rest:
        return None
    resource = rest[0] + (f"/{rest[2]}" if len(rest) >= 3 else "")
    named = len(rest) >= 2
    verb = {"GET": "get" if named else "list", "POST": "create", "PUT": "update", "PATCH": "patch",
            "DELETE": "delete" if named else "deletecollection"}[http.upper()]
    if watch and verb in ("get", "list"):
        verb = "watch"
    return Access(group, resource, verb, cluster_wide)


# ------------------------------------------------------------------ the code's calls

APPLY_CONTENT_TYPE = "application/apply-patch+yaml"


def _literal(node: ast.AST) -> str | None:
    """A string constant, or an f-string with its fields as ``{}`` placeholders."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{x}" for v in node.values)
    return None


def _raw_request(call: ast.Call) -> tuple[str, str] | None:
    strings = [_literal(a) for a in [*call.args, *(k.value for k in call.keywords)]]
    methods = [s for s in strings if s and s.upper() in HTTP_VERBS]
    paths = [s for s in strings if s and s.startswith("/")]
    if len(methods) == 1 and len(paths) == 1:
        # a namespace placeholder is "{namespace}" whatever the f-string's variable is called
        return methods[0], re.sub(r"(?<=/namespaces/)\{[^}]*\}(?=/)", "{namespace}", paths[0])
    return None


def _function_of(tree: ast.AST) -> dict[ast.AST, str]:
    """Each node → the name of the innermost function holding it (ast.walk visits outer functions first)."""
    owner: dict[ast.AST, str] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            for node in ast.walk(fn):
                owner[node] = fn.name
    return owner


def _watch_keyword(call: ast.Call) -> set[str]:
    """What a call's ``watch=`` keyword makes of a list: watch, list, or either when it is not a literal."""
    kw = next((k.value for k in call.keywords if k.arg == "watch"), None)
    if kw is None:
        return {"list"}
    if isinstance(kw, ast.Constant):
        return {"watch"} if kw.value else {"list"}
    return {"list", "watch"}


def _list_verbs(call: ast.Call | None, handed: tuple[ast.Call, str | None] | None) -> set[str]:
    """The verbs of a list method: called, by its ``watch=`` keyword; handed to ``watch.Watch().stream``, watch;
    handed to an informer (``list_fn=``, or a call of something named ``*Informer``), list and watch; handed
    to any other call (a retry wrapper), by that call's ``watch=`` keyword; otherwise list."""
    if call is not None:
        return _watch_keyword(call)
    if handed is None:
        return {"list"}
    outer, keyword = handed
    callee = _receiver(outer.func) or ""
    if callee == "stream":
        return {"watch"}
    if keyword == "list_fn" or callee.endswith("Informer"):
        return {"list", "watch"}
    return _watch_keyword(outer)


def _receiver(node: ast.expr) -> str | None:
    """``core`` of ``self.core.m``, ``core.m`` and ``CoreV1Api(api).m``'s class name."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Call):
        return _receiver(node.func)
    return None


def _api_classes(tree: ast.AST) -> dict[str, str]:
    """Names bound in a module to an API class instance (``self.core = client.CoreV1Api(api)``)."""
    classes = {k for per_class in client_methods().values() for k in per_class}
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            klass = _receiver(node.value.func)
            if klass in classes:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    name = _receiver(target)
                    if name:
                        out[name] = klass
    return out


def scan_file(path: Path, rel: str | None = None) -> tuple[list[Call], list[str]]:
    """The API calls of one module, and what could not be resolved."""
    rel = rel or str(path.relative_to(REPO))
    text = path.read_text()
    tree = ast.parse(text, filename=rel)
    applies = APPLY_CONTENT_TYPE in text  # the module patches with server-side apply
    methods = client_methods()
    owner = _function_of(tree)
    bound = _api_classes(tree)
    calls: list[Call] = []
    problems: list[str] = []
    called = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}
    # a function handed to another call: as which argument of which call
    handed: dict[int, tuple[ast.Call, str | None]] = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.Call):
            handed.update({id(a): (n, None) for a in n.args})
            handed.update({id(k.value): (n, k.arg) for k in n.keywords})
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            names += [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else []
            if any(n.startswith(("kubernetes.dynamic", "kubernetes.utils")) for n in names):
                problems.append(f"{rel}:{node.lineno}: kubernetes.dynamic/utils pick resources at run time")
        if not isinstance(node, ast.Attribute):
            continue
        where = f"{rel}:{node.lineno} ({owner.get(node, '<module>')})"
        call = called.get(id(node))
        if node.attr in RAW_CALLS and call is not None:
            key = (rel, owner.get(node, "<module>"))
            if key in UNCHECKED:
                calls += [Call(where, node.attr, (Access(g, r, v, True),)) for g, r, v in UNCHECKED[key]]
                continue
            request = _raw_request(call)
            access = classify(*request) if request else None
            if access is None:
                problems.append(f"{where}: raw {node.attr} without a literal method and resource path")
            else:
                calls.append(Call(where, node.attr, (access,)))
            continue
        if node.attr not in methods:
            continue
        candidates = methods[node.attr]
        receiver = _receiver(node.value)
        klass = receiver if receiver in candidates else bound.get(receiver or "")
        if klass in candidates:
            candidates = {klass: candidates[klass]}
        accesses = [a for a in (classify(*request) for request in candidates.values()) if a is not None]
        if not accesses:
            continue
        verbs = {accesses[0].verb}
        if accesses[0].verb == "list":
            verbs = _list_verbs(call, handed.get(id(node)))
        elif accesses[0].verb == "patch" and applies:
            # Server-side apply creates the object when it does not exist, and the API server then
            # authorizes the PATCH as a create as well.
            verbs = {"patch", "create"}
        for verb in sorted(verbs):
            options = tuple(dict.fromkeys(Access(a.group, a.resource, verb, a.cluster_wide) for a in accesses))
            calls.append(Call(where, node.attr, options))
    return calls, problems


def component_files(component: Component) -> list[Path]:
    files = []
    for source in component.sources:
        for path in sorted((REPO / source).rglob("*.py")):
            rel = str(path.relative_to(REPO))
            if NOT_SCANNED.search(rel) or any(rel.startswith(e + "/") for e in component.exclude):
                continue
            files.append(path)
    return files


@functools.cache
def component_calls(name: str) -> tuple[tuple[Call, ...], tuple[str, ...]]:
    calls: list[Call] = []
    problems: list[str] = []
    for path in component_files(COMPONENTS[name]):
        c, p = scan_file(path)
        calls += c
        problems += p
    return tuple(calls), tuple(problems)


# ------------------------------------------------------------------ what the overlays grant


@dataclass(frozen=True)
class Grant:
    group: str
    resource: str
    verb: str
    scope: str  # "cluster" (ClusterRoleBinding) or the RoleBinding's namespace
    role: str


def grants(docs: list[dict[str, Any]], namespace: str, service_account: str) -> list[Grant]:
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d
             for d in docs if d["kind"] in ("Role", "ClusterRole")}
    out = []
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        subjects = binding.get("subjects") or []
        if not any(s["kind"] == "ServiceAccount" and s["name"] == service_account
                   and s.get("namespace") == namespace for s in subjects):
            continue
        ref = binding["roleRef"]
        scope = "cluster" if binding["kind"] == "ClusterRoleBinding" else binding["metadata"]["namespace"]
        role_ns = None if ref["kind"] == "ClusterRole" else binding["metadata"]["namespace"]
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        assert role is not None, f"{binding['metadata']['name']} binds {ref['kind']} {ref['name']}, which is not there"
        for rule in role["rules"]:
            out += [Grant(g, r, v, scope, f"{ref['kind']}/{ref['name']}") for g in rule.get("apiGroups", [])
                    for r in rule.get("resources", []) for v in rule["verbs"]]
    return out


def allows(grant: Grant, access: Access) -> bool:
    return ((grant.group, grant.resource, grant.verb) == (access.group, access.resource, access.verb)
            and (grant.scope == "cluster" or not access.cluster_wide))


# ------------------------------------------------------------------ the tests


@pytest.mark.parametrize("kustomization", OVERLAYS + EXTRA_KUSTOMIZATIONS)
def test_no_wildcards(kustomization: str) -> None:
    for doc in render(kustomization):
        if doc["kind"] not in ("Role", "ClusterRole"):
            continue
        assert "aggregationRule" not in doc, f"{doc['metadata']['name']}: aggregated roles grant what others add"
        for rule in doc["rules"]:
            for field in ("verbs", "resources", "apiGroups", "nonResourceURLs"):
                values = rule.get(field, [])
                assert not any("*" in v for v in values), f"{doc['kind']} {doc['metadata']['name']}: {field} {values}"
            assert not rule.get("nonResourceURLs")


def test_the_method_table_comes_from_the_client() -> None:
    def one(name: str, klass: str = "") -> Access | None:
        by_class = client_methods()[name]
        (request,) = [by_class[klass]] if klass else by_class.values()
        return classify(*request)

    assert one("read_node") == Access("", "nodes", "get", True)
    assert one("list_namespaced_pod") == Access("", "pods", "list", False)
    assert one("create_namespaced_pod_binding") == Access("", "pods/binding", "create", False)
    assert one("patch_namespaced_deployment") == Access("apps", "deployments", "patch", False)
    assert one("replace_namespaced_deployment_scale") == Access("apps", "deployments/scale", "update", False)
    assert one("delete_collection_namespaced_job") == Access("batch", "jobs", "deletecollection", False)
    assert one("create_namespaced_event", "CoreV1Api") == Access("", "events", "create", False)
    assert one("create_namespaced_event", "EventsV1Api") == Access("events.k8s.io", "events", "create", False)
    assert classify("GET", "/api/v1/namespaces/{name}") == Access("", "namespaces", "get", True)
    assert classify("GET", "/apis/apps/v1/watch/namespaces/{namespace}/deployments") == \
        Access("apps", "deployments", "watch", False)


def test_the_scan_sees_every_kind_of_call(tmp_path: Path) -> None:
    source = tmp_path / "sample.py"
    source.write_text(
        "def f(apps, coordination, api_client, ns, w):\n"
        "    core = client.CoreV1Api(api_client)\n"
        "    core.create_namespaced_event(ns, {})\n"
        "    EventsV1Api(api_client).create_namespaced_event(ns, {})\n"
        "    Informer(list_fn=core.list_node)\n"
        "    w.stream(core.list_namespaced_pod, ns)\n"
        "    retry(apps.list_namespaced_job, ns, label_selector='x')\n"
        "    for lister in (apps.list_namespaced_deployment,):\n"
        "        pass\n"
        "    apps.patch_namespaced_deployment('d', ns, {}, field_manager='meridian')\n"
        "    coordination.create_namespaced_lease(ns, {})\n"
        "    core.list_pod_for_all_namespaces(watch=True)\n"
        "    api_client.call_api('DELETE', f'/apis/batch/v1/namespaces/{ns}/jobs/x')\n"
        "    api_client.call_api(method, path)\n"
        "    text.read_text()\n")
    calls, problems = scan_file(source, "sample.py")
    assert all(len(c.options) == 1 for c in calls)
    found = {(c.access.group, c.access.resource, c.access.verb, c.access.cluster_wide) for c in calls}
    assert found == {("", "nodes", "list", True), ("", "nodes", "watch", True), ("", "pods", "watch", False),
                     ("batch", "jobs", "list", False), ("apps", "deployments", "list", False),
                     ("apps", "deployments", "patch", False),
                     ("coordination.k8s.io", "leases", "create", False), ("", "pods", "watch", True),
                     ("batch", "jobs", "delete", False), ("", "events", "create", False),
                     ("events.k8s.io", "events", "create", False)}
    assert len(problems) == 1 and "raw call_api" in problems[0]


def test_the_shared_core_calls_no_api() -> None:
    calls: list[Call] = []
    for path in sorted((REPO / "meridian").rglob("*.py")):
        if path.name != "envtest.py":
            calls += scan_file(path)[0]
    assert not calls, [c.where for c in calls]


def test_every_component_runs_under_the_service_account_this_test_checks() -> None:
    docs = render("all-in-one")
    seen = {}
    for w in workloads(docs):
        component = w["metadata"]["labels"]["app.kubernetes.io/component"]
        pod = w["spec"]["template"]["spec"]
        if component == "redis":  # not Meridian's code, and no API access
            assert pod.get("automountServiceAccountToken") is False and "serviceAccountName" not in pod
            continue
        assert component in COMPONENTS, f"{component}: add it to COMPONENTS with its code"
        seen[component] = (w["metadata"]["namespace"], pod["serviceAccountName"])
    assert seen == {name: (c.namespace, c.service_account) for name, c in COMPONENTS.items()}


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_every_call_is_allowed_and_every_grant_is_used(component: str) -> None:
    spec = COMPONENTS[component]
    calls, problems = component_calls(component)
    assert not problems, "unresolved Kubernetes API calls (handle them here or list them in UNCHECKED):\n" + \
        "\n".join(problems)
    docs = render("all-in-one")
    granted = grants(docs, spec.namespace, spec.service_account)

    forbidden = sorted({f"{c.where}: {c.name} needs {' or '.join(map(str, c.options))}" for c in calls
                        if not any(allows(g, option) for g in granted for option in c.options)})
    assert not forbidden, f"{component}'s RBAC forbids:\n" + "\n".join(forbidden)

    unused = sorted({f"{g.role} ({g.scope}): {g.group or 'core'} {g.resource} {g.verb}" for g in granted
                     if not any(allows(g, option) for c in calls for option in c.options)})
    assert not unused, f"{component} is granted what its code never calls:\n" + "\n".join(unused)

    if component == "global-scheduler":  # the members' kubeconfigs, in their own namespace, and nothing else
        assert {(g.group, g.resource, g.verb, g.scope) for g in granted} == {("", "secrets", "get", "meridian-clusters")}


@pytest.mark.parametrize("overlay", ["hub", "member", "autoscaler-example"])
def test_every_overlay_grants_what_all_in_one_does_for_its_components(overlay: str) -> None:
    """The check above reads all-in-one; the other overlays must not differ for the components they hold
    (except the autoscaler's Role, which follows its target's namespace)."""
    docs, reference = render(overlay), render("all-in-one")
    for name, spec in COMPONENTS.items():
        here = {(g.group, g.resource, g.verb, g.scope) for g in grants(docs, spec.namespace, spec.service_account)}
        if not here:
            continue
        there = {(g.group, g.resource, g.verb, g.scope)
                 for g in grants(reference, spec.namespace, spec.service_account)}
        if name == "autoscaler":
            here = {(g, r, v, "target") for g, r, v, _ in here}
            there = {(g, r, v, "target") for g, r, v, _ in there}
        assert here == there, (overlay, name)
