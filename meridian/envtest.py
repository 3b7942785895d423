"""A real Kubernetes control plane for tests and benchmarks, after controller-runtime's envtest.

Schedulers are judged by what a real API server accepts: Bindings, status patches, RBAC denials, the
admission that taints new Nodes. Fakes drift from that behaviour, so tests (and the benchmark) run the
stock binaries instead: etcd, kube-apiserver, optionally kube-controller-manager, and as many
kube-scheduler processes as a test wants. There is no kubelet, so pods are created and bound to Node
objects but never run, which is all a scheduler needs.

The binaries are found the envtest way (``KUBEBUILDER_ASSETS``), so anyone with ``setup-envtest`` can
run the same tests on their own binaries; otherwise the project's xz-compressed copies are unpacked
once into a cache. ``MERIDIAN_TEST_KUBECONFIG`` points the same interface at an existing cluster
instead, so a test written here also runs against kind or a real cluster.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import copy
import fcntl
import json
import lzma
import os
import secrets
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NotRequired, TypedDict

import yaml
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.client.exceptions import ApiException

K8S_VERSION = "v1.36.2"
"""The version of the binaries shipped with the project; it names the cache directory."""

BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl")
REQUIRED_BINARIES = ("etcd", "kube-apiserver")
"""The least an external ``KUBEBUILDER_ASSETS`` must hold: setup-envtest ships only these and kubectl."""

NOT_READY_TAINT = "node.kubernetes.io/not-ready"
ADMIN_USER = "meridian-admin"
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
RBAC_KINDS = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")

_REPO = Path(__file__).resolve().parents[1]


class AssetsNotFoundError(RuntimeError):
    """The control-plane binaries are missing; the message says which and how to get them."""


class ControlPlaneError(RuntimeError):
    """A control-plane process failed to start or to become ready; the message carries its log tail."""


# --------------------------------------------------------------------------------------------- assets


def _default_binaries_dir() -> Path:
    env = os.environ.get("MERIDIAN_K8S_BINARIES")
    return Path(env) if env else _REPO.parent / "shared" / "k8s"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "meridian" / f"k8s-{K8S_VERSION}"


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _fix_hint() -> str:
    return ("install etcd with `apt-get install -y etcd-server`, and either set KUBEBUILDER_ASSETS to a "
            "directory holding etcd and kube-apiserver (e.g. from setup-envtest) or MERIDIAN_K8S_BINARIES "
            "to a directory holding kube-apiserver.xz, kube-controller-manager.xz, kube-scheduler.xz and "
            "kubectl.xz")


def _source_stamp(xz: Path) -> str:
    st = xz.stat()
    return f"{xz.resolve()}:{st.st_size}:{st.st_mtime_ns}\n"


def _decompress(xz: Path, target: Path) -> None:
    """Unpack ``xz`` to ``target`` under a temporary name, then rename: a reader never sees half a file."""
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")
    try:
        with lzma.open(xz, "rb") as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 4 << 20)
        tmp.chmod(0o755)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _link(source: Path, target: Path) -> None:
    if target.is_symlink() and Path(os.readlink(target)) == source:
        return
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")
    os.symlink(source, tmp)
    os.replace(tmp, target)


def ensure_assets(binaries_dir: Path | None = None) -> Path:
    """A directory holding etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kubectl.

    ``KUBEBUILDER_ASSETS`` wins when it holds at least etcd and kube-apiserver (the envtest convention).
    Otherwise the ``.xz`` binaries of ``binaries_dir`` (default ``MERIDIAN_K8S_BINARIES``, else the
    project's ``shared/k8s``) are unpacked into ``$XDG_CACHE_HOME/meridian/k8s-<version>`` once, and
    etcd is linked in from PATH. An exclusive lock plus write-then-rename keeps concurrent pytest-xdist
    workers from unpacking twice or reading a half-written binary; a stamp per binary re-unpacks it
    when its source changes.
    """
    env_assets = os.environ.get("KUBEBUILDER_ASSETS")
    if env_assets:
        assets = Path(env_assets)
        if all(_is_executable(assets / b) for b in REQUIRED_BINARIES):
            return assets

    source = Path(binaries_dir) if binaries_dir is not None else _default_binaries_dir()
    missing = [f"{b}.xz" for b in BINARIES if b != "etcd" and not (source / f"{b}.xz").is_file()]
    etcd = shutil.which("etcd")
    problems = []
    if env_assets:
        problems.append(f"KUBEBUILDER_ASSETS={env_assets} lacks an executable etcd or kube-apiserver")
    if missing:
        problems.append(f"{source} lacks {', '.join(missing)}")
    if etcd is None:
        problems.append("etcd is not on PATH")
    if problems:
        raise AssetsNotFoundError(f"Kubernetes test binaries not found: {'; '.join(problems)}. "
                                  f"To fix: {_fix_hint()}.")
    assert etcd is not None

    cache = _cache_root()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for name in BINARIES:
            if name == "etcd":
                continue
            xz, target, stamp = source / f"{name}.xz", cache / name, cache / f".{name}.source"
            wanted = _source_stamp(xz)
            if _is_executable(target) and stamp.is_file() and stamp.read_text() == wanted:
                continue
            _decompress(xz, target)
            stamp.write_text(wanted)
        _link(Path(etcd).resolve(), cache / "etcd")
    return cache


# ------------------------------------------------------------------------------------------ processes


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on at the moment of asking."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _free_ports(n: int) -> list[int]:
    """``n`` distinct free ports: the sockets stay open together so the kernel cannot hand one out twice."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


_SETPRIV = shutil.which("setpriv")


def with_parent_death_signal(argv: Sequence[str]) -> list[str]:
    """``argv`` run so that Linux SIGKILLs it when the thread that started it dies, so a killed test
    run leaves no etcd or API server behind: util-linux's ``setpriv --pdeathsig`` sets the signal and
    execs. (Setting it in a ``preexec_fn`` instead deadlocked children forked from a process with
    gRPC's threads.) Only for children started from the main thread, since the signal follows the
    starting *thread*; elsewhere, and without setpriv, ``argv`` unchanged."""
    if _SETPRIV is None or threading.current_thread() is not threading.main_thread():
        return list(argv)
    return [_SETPRIV, "--pdeathsig", "KILL", *argv]


def tail(path: Path, lines: int = 40) -> str:
    """The last ``lines`` lines of a log file, or a note that it is absent."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout`` seconds; returns the exit status."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            proc.wait(timeout=timeout)
    return proc.returncode


# --------------------------------------------------------------------------------------- kubeconfigs


def _write_kubeconfig(path: Path, *, cluster: Mapping[str, Any], user: Mapping[str, Any],
                      name: str = "meridian") -> Path:
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": dict(cluster)}],
        "users": [{"name": name, "user": dict(user)}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
        "current-context": name,
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    path.chmod(0o600)
    return path


def _current_cluster(kubeconfig: Path) -> dict[str, Any]:
    """The cluster entry of a kubeconfig's current context, with relative file paths made absolute
    (kubeconfig paths are relative to the file, which a copy elsewhere would break)."""
    doc = yaml.safe_load(kubeconfig.read_text()) or {}
    contexts = {c["name"]: c.get("context", {}) for c in doc.get("contexts") or []}
    current = doc.get("current-context")
    if current not in contexts:
        raise ValueError(f"{kubeconfig} has no current context")
    cluster_name = contexts[current].get("cluster")
    clusters = {c["name"]: dict(c.get("cluster", {})) for c in doc.get("clusters") or []}
    if cluster_name not in clusters:
        raise ValueError(f"{kubeconfig}: context {current!r} names unknown cluster {cluster_name!r}")
    cluster = clusters[cluster_name]
    ca = cluster.get("certificate-authority")
    if ca and not Path(ca).is_absolute():
        cluster["certificate-authority"] = str((kubeconfig.parent / ca).resolve())
    return cluster


# ------------------------------------------------------------------------------------- certificates


def _openssl(*args: str, cwd: Path) -> None:
    binary = shutil.which("openssl")
    if binary is None:
        raise ControlPlaneError("the openssl CLI is needed to make the API server's certificates")
    result = subprocess.run([binary, *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{result.stderr}")


def _make_pki(pki: Path) -> None:
    """A CA, a serving certificate it signs for 127.0.0.1/localhost, a front-proxy CA and the
    service-account signing key. ECDSA P-256 keeps key generation instant."""
    pki.mkdir(parents=True)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3650",
             "-subj", "/CN=meridian-envtest-ca", cwd=pki)
    _openssl("req", *ec, "-keyout", "apiserver.key", "-out", "apiserver.csr",
             "-subj", "/CN=kube-apiserver", cwd=pki)
    (pki / "apiserver.ext").write_text(
        "basicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth\n"
        "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,"
        "DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n")
    _openssl("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "apiserver.crt", "-days", "3650", "-extfile", "apiserver.ext",
             cwd=pki)
    _openssl("req", "-x509", *ec, "-keyout", "front-proxy-ca.key", "-out", "front-proxy-ca.crt",
             "-days", "3650", "-subj", "/CN=meridian-envtest-front-proxy-ca", cwd=pki)
    _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=pki)
    _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    for key in pki.glob("*.key"):
        key.chmod(0o600)


# -------------------------------------------------------------------------------------- control plane


def _api_server_argv(assets: Path, *, etcd_url: str, api_port: int, pki: Path, tokens: Path) -> list[str]:
    """kube-apiserver's command line: on loopback, etcd at ``etcd_url``, the PKI of :func:`_make_pki`,
    static bearer tokens from ``tokens`` and RBAC enforced."""
    return [
        str(assets / "kube-apiserver"),
        f"--etcd-servers={etcd_url}",
        "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        f"--token-auth-file={tokens}",
        "--authorization-mode=Node,RBAC",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
        "--endpoint-reconciler-type=none",  # a loopback address cannot be advertised as an endpoint
        "--allow-privileged=true",
        # Without a front-proxy CA, kube-controller-manager and kube-scheduler log a missing
        # requestheader-client-ca-file forever.
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
    ]


class ControlPlane:
    """etcd + kube-apiserver (+ kube-controller-manager, + kube-schedulers) on free loopback ports,
    or an existing cluster behind the same interface (:meth:`from_kubeconfig`).

    Every process logs to ``<workdir>/logs/<name>.log``; startup failures quote those logs. RBAC is
    really enforced (``--authorization-mode=Node,RBAC``) and identities are ordinary bearer tokens: an
    admin in ``system:masters`` and ServiceAccount tokens from the TokenRequest API, so a component
    run under its own ServiceAccount gets exactly what its manifest grants.
    """

    def __init__(self, *, controller_manager: bool = False, assets: Path | None = None,
                 startup_timeout: float = 90.0, keep_workdir: bool = False,
                 controller_manager_qps: float | None = None) -> None:
        """``controller_manager_qps``: kube-controller-manager's client rate (``--kube-api-qps``, burst twice
        that); None keeps its default of 20/s (burst 30), which paces every Deployment → ReplicaSet → Pod."""
        self.controller_manager = controller_manager
        self.controller_manager_qps = controller_manager_qps
        self.startup_timeout = startup_timeout
        self.keep_workdir = keep_workdir
        self._assets = assets
        self._external_kubeconfig: Path | None = None
        self._workdir: Path | None = None
        self._processes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[int, Path] = {}
        self._schedulers = 0
        self._server: str | None = None
        self._ca_file: Path | None = None
        self._admin_kubeconfig: Path | None = None
        self._api_argv: list[str] = []
        self._admin_token = ""
        self._lock = threading.Lock()
        self._started = False

    @classmethod
    def from_kubeconfig(cls, kubeconfig: Path | str) -> ControlPlane:
        """An existing cluster: nothing is started; ``start()`` only prepares a scratch directory."""
        plane = cls()
        plane._external_kubeconfig = Path(kubeconfig).expanduser().resolve()
        return plane

    # -- properties

    @property
    def external(self) -> bool:
        return self._external_kubeconfig is not None

    @property
    def workdir(self) -> Path:
        if self._workdir is None:
            raise RuntimeError("the control plane is not started")
        return self._workdir

    @property
    def server(self) -> str:
        """The API server's https URL."""
        if self._server is None:
            raise RuntimeError("the control plane is not started")
        return self._server

    @property
    def ca_file(self) -> Path | None:
        """The CA that signs the API server's certificate (None for an external cluster that skips
        verification)."""
        if self._server is None:
            raise RuntimeError("the control plane is not started")
        return self._ca_file

    @property
    def admin_kubeconfig(self) -> Path:
        if self._admin_kubeconfig is None:
            raise RuntimeError("the control plane is not started")
        return self._admin_kubeconfig

    @property
    def assets(self) -> Path:
        if self._assets is None:
            self._assets = ensure_assets()
        return self._assets

    @property
    def processes(self) -> dict[str, subprocess.Popen[bytes]]:
        """The running processes this control plane started, by name (``etcd``, ``kube-apiserver``,
        ``kube-controller-manager``, ``kube-scheduler-<n>``); empty for an external cluster."""
        with self._lock:
            return dict(self._processes)

    def log_path(self, name: str) -> Path:
        return self.workdir / "logs" / f"{name}.log"

    def log_tail(self, name: str, lines: int = 40) -> str:
        return tail(self.log_path(name), lines)

    # -- lifecycle

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> ControlPlane:
        if self._started:
            return self
        self._workdir = Path(tempfile.mkdtemp(prefix="meridian-envtest-"))
        (self._workdir / "logs").mkdir()
        self._started = True
        atexit.register(self.stop)
        try:
            if self.external:
                self._start_external()
            else:
                self._start_local()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every process this control plane started and remove its directory (logs included,
        unless ``keep_workdir``)."""
        self._stop_processes()
        if self._workdir is not None and not self.keep_workdir:
            shutil.rmtree(self._workdir, ignore_errors=True)
        self._started = False
        atexit.unregister(self.stop)

    def _start_external(self) -> None:
        kubeconfig = self._external_kubeconfig
        assert kubeconfig is not None
        cluster = _current_cluster(kubeconfig)
        self._server = str(cluster["server"])
        if cluster.get("certificate-authority"):
            self._ca_file = Path(cluster["certificate-authority"])
        elif cluster.get("certificate-authority-data"):
            self._ca_file = self.workdir / "ca.crt"
            self._ca_file.write_bytes(base64.b64decode(cluster["certificate-authority-data"]))
        self._admin_kubeconfig = kubeconfig

    def _start_local(self) -> None:
        last: ControlPlaneError | None = None
        for _attempt in range(3):
            try:
                self._start_local_once()
                return
            except ControlPlaneError as e:
                # Free ports are only free when asked: another test process may take one first.
                if "address already in use" not in str(e):
                    raise
                last = e
                self._stop_processes()
        assert last is not None
        raise last

    def _stop_processes(self) -> None:
        """SIGTERM to every client of etcd at once (each takes about a second to shut down), then
        etcd: the API server exits cleanly only while its storage still answers."""
        with self._lock:
            procs = list(self._processes.items())
            self._processes.clear()
        clients = [p for n, p in procs if n != "etcd"]
        for p in clients:
            if p.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    p.terminate()
        for p in clients:
            stop_process(p)
        for n, p in procs:
            if n == "etcd":
                stop_process(p)

    def _start_local_once(self) -> None:
        assets = self.assets
        needed = [*REQUIRED_BINARIES, *(["kube-controller-manager"] if self.controller_manager else [])]
        absent = [b for b in needed if not _is_executable(assets / b)]
        if absent:  # before anything starts: setup-envtest's assets, for one, lack kube-controller-manager
            raise AssetsNotFoundError(f"{assets} lacks {', '.join(absent)}; {_fix_hint()}")
        work = self.workdir
        pki = work / "pki"
        if not pki.exists():
            _make_pki(pki)
        etcd_port, etcd_peer_port, api_port = _free_ports(3)
        self._server = f"https://127.0.0.1:{api_port}"
        self._ca_file = pki / "ca.crt"
        admin_token, kcm_kubeconfig = self._write_credentials()
        etcd_url = self._spawn_etcd(etcd_port, etcd_peer_port)
        self._api_argv = _api_server_argv(assets, etcd_url=etcd_url, api_port=api_port, pki=pki,
                                          tokens=work / "tokens.csv")
        self._admin_token = admin_token
        self._spawn("kube-apiserver", self._api_argv)
        self._wait_ready("kube-apiserver", admin_token)
        if self.controller_manager:
            self._spawn_controller_manager(kcm_kubeconfig, pki)
            self._wait_default_service_account()

    def _write_credentials(self) -> tuple[str, Path]:
        """The static tokens file and the kubeconfigs that use it; returns the admin token and
        kube-controller-manager's kubeconfig.

        Static tokens: an admin, and kube-controller-manager as the user its bootstrap ClusterRole
        (system:kube-controller-manager) is bound to, so it runs with its real, limited rights."""
        work = self.workdir
        admin_token = secrets.token_hex(24)
        kcm_token = secrets.token_hex(24)
        (work / "tokens.csv").write_text(
            f'{admin_token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n'
            f"{kcm_token},system:kube-controller-manager,system:kube-controller-manager\n")
        cluster = {"server": self._server, "certificate-authority": str(self._ca_file)}
        self._admin_kubeconfig = _write_kubeconfig(work / "admin.kubeconfig", cluster=cluster,
                                                   user={"token": admin_token})
        kcm_kubeconfig = _write_kubeconfig(work / "kube-controller-manager.kubeconfig", cluster=cluster,
                                           user={"token": kcm_token})
        return admin_token, kcm_kubeconfig

    def _spawn_etcd(self, port: int, peer_port: int) -> str:
        """Start etcd on a fresh data directory; returns its client URL."""
        etcd_data = self.workdir / "etcd"
        etcd_url, peer_url = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{peer_port}"
        shutil.rmtree(etcd_data, ignore_errors=True)
        self._spawn("etcd", [
            str(self.assets / "etcd"), "--name=envtest", f"--data-dir={etcd_data}",
            f"--listen-client-urls={etcd_url}", f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}", f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=envtest={peer_url}", "--initial-cluster-state=new",
            "--logger=zap", "--log-outputs=stderr",
        ])
        return etcd_url

    def _spawn_controller_manager(self, kubeconfig: Path, pki: Path) -> None:
        self._spawn("kube-controller-manager", [
            str(self.assets / "kube-controller-manager"),
            f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            "--secure-port=0",
            "--leader-elect=false",
            # A busy cluster's tuning: a faster client and more workers for Deployments, ReplicaSets and Jobs.
            *([f"--kube-api-qps={self.controller_manager_qps:g}",
               f"--kube-api-burst={2 * self.controller_manager_qps:g}", "--concurrent-deployment-syncs=20",
               "--concurrent-replicaset-syncs=20", "--concurrent-job-syncs=20"]
              if self.controller_manager_qps else []),
            # No kubelet renews Node leases: the node-lifecycle controller would mark every Node
            # NotReady and taint it NoExecute after ~50 s.
            "--controllers=*,-node-lifecycle-controller",
            # The key lets the token controller run; per-controller ServiceAccounts are how a real
            # cluster runs its controllers (and what creates each namespace's "default" one).
            f"--service-account-private-key-file={pki / 'sa.key'}",
            "--use-service-account-credentials=true",
            f"--root-ca-file={pki / 'ca.crt'}",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}",
            f"--cluster-signing-key-file={pki / 'ca.key'}",
        ])

    def stop_api_server(self) -> None:
        """Stop the API server alone (etcd and the controllers keep running): a member cluster whose API
        server stops answering, as the federation tests need. :meth:`start_api_server` brings it back on
        the same address."""
        if self.external:
            raise ControlPlaneError("an external cluster's API server is not this process's to stop")
        with self._lock:
            proc = self._processes.pop("kube-apiserver", None)
        if proc is not None:
            stop_process(proc)

    def start_api_server(self) -> None:
        """Start the API server again after :meth:`stop_api_server` and wait until it is ready."""
        if self.external:
            raise ControlPlaneError("an external cluster's API server is not this process's to start")
        with self._lock:
            running = "kube-apiserver" in self._processes
        if not running:
            self._spawn("kube-apiserver", self._api_argv)
        self._wait_ready("kube-apiserver", self._admin_token)

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
        binary = Path(argv[0])
        if not _is_executable(binary):
            raise AssetsNotFoundError(f"{binary} is missing or not executable; {_fix_hint()}")
        log = self.log_path(name)
        with open(log, "ab") as out:
            proc = subprocess.Popen(with_parent_death_signal(argv), stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.STDOUT, cwd=self.workdir)
        with self._lock:
            self._processes[name] = proc
            self._logs[proc.pid] = log
        return proc

    def _check_alive(self) -> None:
        with self._lock:
            procs = list(self._processes.items())
        for name, proc in procs:
            if proc.poll() is not None:
                raise ControlPlaneError(f"{name} exited with status {proc.returncode}; last lines of "
                                        f"{self.log_path(name)}:\n{self.log_tail(name)}")

    def _wait_ready(self, name: str, token: str) -> None:
        ctx = ssl.create_default_context(cafile=str(self._ca_file))
        request = urllib.request.Request(f"{self.server}/readyz",
                                         headers={"Authorization": f"Bearer {token}"})
        deadline = time.monotonic() + self.startup_timeout
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(request, context=ctx, timeout=5) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as e:
                last = e.read().decode(errors="replace")[-2000:]
            except (OSError, ssl.SSLError) as e:
                last = str(e)
            time.sleep(0.2)
        raise ControlPlaneError(
            f"{name} was not ready after {self.startup_timeout:.0f} s (last /readyz answer: {last}); "
            f"last lines of its log:\n{self.log_tail(name)}\n--- etcd:\n{self.log_tail('etcd', 10)}")

    def _wait_default_service_account(self) -> None:
        """kube-controller-manager is useful once it has created the ``default`` ServiceAccount."""
        deadline = time.monotonic() + self.startup_timeout
        with self.api_client() as client:
            api = k8s.CoreV1Api(client)
            while time.monotonic() < deadline:
                self._check_alive()
                try:
                    api.read_namespaced_service_account("default", "default")
                    return
                except ApiException as e:
                    if e.status != 404:
                        raise
                time.sleep(0.2)
        raise ControlPlaneError(
            f"kube-controller-manager did not create the default ServiceAccount within "
            f"{self.startup_timeout:.0f} s; last lines of its log:\n{self.log_tail('kube-controller-manager')}")

    # -- clients and identities

    def client_configuration(self, kubeconfig: Path | None = None, *,
                             pool_maxsize: int | None = None) -> k8s.Configuration:
        """A client configuration from ``kubeconfig`` (default: the admin's)."""
        cfg = k8s.Configuration()
        k8s_config.load_kube_config(config_file=str(kubeconfig or self.admin_kubeconfig),
                                    client_configuration=cfg, persist_config=False)
        if pool_maxsize is not None:
            cfg.connection_pool_maxsize = pool_maxsize
        return cfg

    def api_client(self, kubeconfig: Path | None = None, *, pool_maxsize: int | None = None) -> k8s.ApiClient:
        """An ``ApiClient`` for ``kubeconfig`` (default: the admin)."""
        return k8s.ApiClient(self.client_configuration(kubeconfig, pool_maxsize=pool_maxsize))

    def service_account_kubeconfig(self, namespace: str, name: str, *,
                                   expiration_seconds: int = 3600) -> Path:
        """A kubeconfig whose user is a TokenRequest token of an existing ServiceAccount.

        TokenRequest (rather than a static token file) is what makes the same code work on any
        cluster; the API server refuses expirations under 10 minutes.
        """
        with self.api_client() as api:
            request = k8s.AuthenticationV1TokenRequest(
                spec=k8s.V1TokenRequestSpec(audiences=[], expiration_seconds=expiration_seconds))
            token = k8s.CoreV1Api(api).create_namespaced_service_account_token(name, namespace, request)
        assert token.status is not None
        cluster = {"server": self.server}
        if self.external:
            assert self._external_kubeconfig is not None
            cluster = _current_cluster(self._external_kubeconfig)
        elif self._ca_file is not None:
            cluster["certificate-authority"] = str(self._ca_file)
        path = self.workdir / f"sa-{namespace}-{name}-{secrets.token_hex(3)}.kubeconfig"
        return _write_kubeconfig(path, cluster=cluster, user={"token": token.status.token},
                                 name=f"{namespace}-{name}")

    def apply_rbac(self, manifest: Path | str) -> None:
        """Create or replace the Namespace, ServiceAccount and RBAC documents of a manifest.

        Only identity and permission objects are applied (not Deployments or Services), so a test can
        run a component in-process under exactly the ClusterRole its deploy/ manifest grants.
        """
        docs = [d for d in yaml.safe_load_all(Path(manifest).read_text()) if d and d.get("kind") in RBAC_KINDS]
        with self.api_client() as api:
            apply_rbac_documents(api, docs)

    # -- kube-scheduler

    def start_kube_scheduler(self, config: Mapping[str, Any] | None = None, *,
                             kubeconfig: Path | None = None,
                             extra_args: Sequence[str] = ()) -> subprocess.Popen[bytes]:
        """Run the stock kube-scheduler against this API server; ``stop()`` stops it too.

        ``config`` is a KubeSchedulerConfiguration; its ``clientConnection.kubeconfig`` is set to
        ``kubeconfig`` if given, else kept if the config has one, else the admin's. Leader election is
        off unless the config turns it on, so several schedulers (different ``schedulerName``
        profiles) can run side by side. ``--secure-port=0``: the scheduler serves nothing, so parallel
        schedulers cannot clash on ports (``extra_args`` may override it; the last flag wins).
        """
        binary = self.assets / "kube-scheduler"
        cfg: dict[str, Any] = copy.deepcopy(dict(config or {}))
        cfg.setdefault("apiVersion", "kubescheduler.config.k8s.io/v1")
        cfg.setdefault("kind", "KubeSchedulerConfiguration")
        connection = cfg.setdefault("clientConnection", {})
        if kubeconfig is not None or not connection.get("kubeconfig"):
            connection["kubeconfig"] = str(kubeconfig or self.admin_kubeconfig)
        kc = str(connection["kubeconfig"])
        cfg.setdefault("leaderElection", {}).setdefault("leaderElect", False)
        with self._lock:
            self._schedulers += 1
            name = f"kube-scheduler-{self._schedulers}"
        config_file = self.workdir / f"{name}.yaml"
        config_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
        return self._spawn(name, [
            str(binary), f"--config={config_file}", "--secure-port=0",
            f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            *extra_args,
        ])

    def stop_process(self, proc: subprocess.Popen[bytes], timeout: float = 10.0) -> int | None:
        """Stop one process this control plane started (e.g. a kube-scheduler) and forget it."""
        with self._lock:
            for name, p in list(self._processes.items()):
                if p is proc:
                    del self._processes[name]
        return stop_process(proc, timeout)

    def process_log(self, proc: subprocess.Popen[bytes]) -> Path:
        """The log file of a process this control plane started (it outlives the process)."""
        with self._lock:
            return self._logs[proc.pid]


def from_environment(*, controller_manager: bool = False, startup_timeout: float = 90.0) -> ControlPlane:
    """The cluster named by ``MERIDIAN_TEST_KUBECONFIG`` if set, else a local control plane (unstarted)."""
    external = os.environ.get("MERIDIAN_TEST_KUBECONFIG")
    if external:
        return ControlPlane.from_kubeconfig(external)
    return ControlPlane(controller_manager=controller_manager, startup_timeout=startup_timeout)


# ---------------------------------------------------------------------------------------------- RBAC


def _namespace_of(doc: Mapping[str, Any]) -> str | None:
    return (doc.get("metadata") or {}).get("namespace")


def apply_rbac_documents(api: k8s.ApiClient, docs: Iterable[Mapping[str, Any]]) -> None:
    """Create (or replace) Namespace, ServiceAccount, ClusterRole(Binding) and Role(Binding) documents,
    namespaces first. A binding whose ``roleRef`` changed is deleted and recreated (roleRef is
    immutable)."""
    core, rbac = k8s.CoreV1Api(api), k8s.RbacAuthorizationV1Api(api)
    docs = [d for d in docs if d.get("kind") in RBAC_KINDS]
    wanted_ns = {d["metadata"]["name"] for d in docs if d["kind"] == "Namespace"}
    for doc in docs:
        ns = _namespace_of(doc)
        if ns and ns not in wanted_ns:
            wanted_ns.add(ns)
            docs.insert(0, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    ops: dict[str, tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any]]] = {
        "Namespace": (core.create_namespace, core.replace_namespace, core.delete_namespace),
        "ServiceAccount": (core.create_namespaced_service_account, core.replace_namespaced_service_account,
                           core.delete_namespaced_service_account),
        "ClusterRole": (rbac.create_cluster_role, rbac.replace_cluster_role, rbac.delete_cluster_role),
        "ClusterRoleBinding": (rbac.create_cluster_role_binding, rbac.replace_cluster_role_binding,
                               rbac.delete_cluster_role_binding),
        "Role": (rbac.create_namespaced_role, rbac.replace_namespaced_role, rbac.delete_namespaced_role),
        "RoleBinding": (rbac.create_namespaced_role_binding, rbac.replace_namespaced_role_binding,
                        rbac.delete_namespaced_role_binding),
    }
    order = {kind: i for i, kind in enumerate(RBAC_KINDS)}
    for doc in sorted(docs, key=lambda d: order[d["kind"]]):
        create, replace, delete = ops[doc["kind"]]
        name, ns = doc["metadata"]["name"], _namespace_of(doc)
        scope = (ns,) if doc["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding") else ()
        body = dict(doc)
        try:
            create(*scope, body=body)
            continue
        except ApiException as e:
            if e.status != 409:
                raise
        if doc["kind"] == "Namespace":
            continue  # an existing namespace is what was wanted; replacing it would drop its finalizers
        try:
            replace(name, *scope, body=body)
        except ApiException as e:
            if e.status != 422 or not doc["kind"].endswith("Binding"):
                raise
            delete(name, *scope)
            create(*scope, body=body)


# --------------------------------------------------------------------------------------------- nodes


class NodeSpec(TypedDict):
    """A Node to create: ``capacity`` as Kubernetes quantities, e.g. ``{"cpu": "8", "memory": "32Gi"}``.
    ``allocatable`` defaults to ``capacity``; ``pods`` defaults to 110 in both."""

    name: str
    capacity: Mapping[str, str | int]
    allocatable: NotRequired[Mapping[str, str | int]]
    labels: NotRequired[Mapping[str, str]]
    taints: NotRequired[Sequence[Mapping[str, str]]]
    annotations: NotRequired[Mapping[str, str]]


def _quantities(q: Mapping[str, str | int]) -> dict[str, str]:
    out = {k: str(v) for k, v in q.items()}
    out.setdefault("pods", "110")
    return out


def _concurrent_client(api: k8s.ApiClient, workers: int) -> k8s.ApiClient:
    """A copy of ``api``'s configuration with a connection pool as wide as the thread pool; the
    default (5 × CPUs) makes threads queue for connections on small machines."""
    cfg = copy.deepcopy(api.configuration)
    cfg.connection_pool_maxsize = max(workers * 2, cfg.connection_pool_maxsize or 0)
    return k8s.ApiClient(cfg)


def _create_ready_node(core: k8s.CoreV1Api, spec: NodeSpec, labels: Mapping[str, str]) -> str:
    name = spec["name"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "capacity": _quantities(spec["capacity"]),
        "allocatable": _quantities(spec.get("allocatable", spec["capacity"])),
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                        "message": "meridian envtest node (no kubelet)", "lastHeartbeatTime": now,
                        "lastTransitionTime": now}],
    }
    taints = [dict(t) for t in spec.get("taints", [])]
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **labels, **spec.get("labels", {})},
                     "annotations": dict(spec.get("annotations", {}))},
        "spec": {"taints": taints},
        "status": status,
    }
    # Raw replies: decoding each into the client's models costs more CPU than the request itself.
    created = json.loads(core.create_node(body, _preload_content=False).data)
    # The API server keeps a new Node's status (a kubelet registers that way), but a status
    # subresource patch is the documented route; take it only when the create dropped the status.
    conditions = (created.get("status") or {}).get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        discard_reply(core.patch_node_status(name, {"status": status}, _preload_content=False))
    # Admission (TaintNodesByCondition) adds the not-ready taint on create; without a kubelet nothing
    # would ever lift it, so lift it here and keep the spec's own taints.
    if any(t.get("key") == NOT_READY_TAINT for t in (created.get("spec") or {}).get("taints") or []):
        discard_reply(core.patch_node(name, {"spec": {"taints": taints or None}}, _preload_content=False))
    return name


def discard_reply(response: Any) -> None:
    """Read an undecoded reply to its end before its connection goes back to the pool: a reply still
    arriving on a pooled connection would be read as the next request's answer."""
    response.drain_conn()
    response.release_conn()


def create_ready_nodes(api: k8s.ApiClient, specs: Iterable[NodeSpec], *,
                       labels: Mapping[str, str] | None = None, workers: int = 8) -> list[str]:
    """Create Nodes and make them Ready and schedulable, ``workers`` at a time; returns their names.

    There is no kubelet, so each Node is created with the status a kubelet would report (Ready
    condition, capacity, allocatable; patched through the status subresource where a cluster drops it
    on create) and then loses the ``node.kubernetes.io/not-ready`` taint admission added: two requests
    per Node, about 5 s for 1,000 on two cores. ``labels`` go on every Node (e.g. a run id for
    :func:`delete_nodes`).
    """
    specs = list(specs)
    extra = dict(labels or {})
    with _concurrent_client(api, workers) as concurrent:
        core = k8s.CoreV1Api(concurrent)
        with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="envtest-nodes") as pool:
            return list(pool.map(lambda s: _create_ready_node(core, s, extra), specs))


def delete_nodes(api: k8s.ApiClient, label_selector: str) -> None:
    """Delete every Node matching ``label_selector`` in one request."""
    if not label_selector:
        raise ValueError("refusing to delete every Node: give a label selector")
    # The reply lists every deleted Node; it is not worth decoding.
    discard_reply(k8s.CoreV1Api(api).delete_collection_node(label_selector=label_selector, _preload_content=False))


def wait_for(predicate: Callable[[], Any], *, timeout: float = 30.0, interval: float = 0.2,
             message: str = "condition") -> Any:
    """Poll until ``predicate()`` is truthy and return its value; TimeoutError names ``message``."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {message}")
        time.sleep(interval)


if __name__ == "__main__":  # pragma: no cover - python -m meridian.envtest [--kcm]: a cluster to poke at
    t0 = time.monotonic()
    with ControlPlane(controller_manager="--kcm" in sys.argv) as plane:
        print(f"ready in {time.monotonic() - t0:.1f} s; logs in {plane.workdir / 'logs'}\n"
              f"export KUBECONFIG={plane.admin_kubeconfig}\n(Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
