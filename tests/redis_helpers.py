"""Private ``redis-server`` processes with Meridian's ACL users loaded, plaintext or TLS, for the bus's
security tests (``tests/meridian/test_bus_security.py``, ``tests/deploy/test_redis_security.py``).

Each server gets the ACL file of :mod:`meridian.bus.acl` with a random password per user, plus an
``admin`` user the tests use to look behind the components' backs (``XLEN``, ``ACL LOG``).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import redis

from meridian.bus import RedisSecuritySettings, RedisStreamBus
from meridian.bus.acl import render_acl
from meridian.envtest import wait_for

ADMIN = "admin"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def require(binary: str) -> str:
    """The binary's path; a missing one fails under CI and skips elsewhere."""
    path = shutil.which(binary)
    if path is None:
        if os.environ.get("CI", "").lower() in ("true", "1", "yes"):
            pytest.fail(f"{binary} is not installed; .ci/run installs it")
        pytest.skip(f"{binary} is not installed")
    return path


@dataclass
class Pki:
    """A throw-away CA, a server certificate for ``localhost`` (no IP address) and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path  # a CA that signed nothing here


def make_pki(directory: Path) -> Pki:
    openssl = require("openssl")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], cwd=directory, check=True, capture_output=True, timeout=30)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
    for ca in ("ca", "other-ca"):
        run("req", "-x509", *key, "-keyout", f"{ca}.key", "-out", f"{ca}.crt", "-days", "2", "-subj",
            f"/CN=meridian-test-{ca}", "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    common = ("keyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n"
              "subjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid\n")
    for name, extensions in (("server", "subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n"),
                             ("client", "extendedKeyUsage=clientAuth\n")):
        (directory / f"{name}.ext").write_text(common + extensions)
        run("req", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN=meridian-test-{name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext")
    d = directory
    return Pki(d / "ca.crt", d / "server.crt", d / "server.key", d / "client.crt", d / "client.key", d / "other-ca.crt")


@dataclass
class AclRedis:
    """A redis-server with Meridian's ACL users (random passwords) and ``admin``; TLS when ``pki`` is given."""

    workdir: Path
    pki: Pki | None = None
    acl_text: str = field(default_factory=render_acl)
    add_passwords: bool = True  # False: acl_text already holds them (the deployment's rendered file)
    port: int = field(default_factory=free_port)
    passwords: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def host(self) -> str:
        return "localhost" if self.pki else "127.0.0.1"  # the server certificate names localhost

    def url(self, user: str | None = None, password: str | None = None, *, host: str | None = None) -> str:
        auth = ""
        if user is not None:
            pw = password if password is not None else self.passwords[user]
            auth = f"{quote(user, safe='')}:{quote(pw, safe='')}@"
        return f"{'rediss' if self.pki else 'redis'}://{auth}{host or self.host}:{self.port}/0"

    def tls(self, *, client_cert: bool = True, ca: Path | None = None, check_hostname: bool = True
            ) -> RedisSecuritySettings:
        """The security settings of a TLS client (the CA and, unless told not to, the client certificate)."""
        assert self.pki is not None
        return RedisSecuritySettings(
            tls_ca_file=ca or self.pki.ca, tls_check_hostname=check_hostname,
            tls_cert_file=self.pki.client_cert if client_cert else None,
            tls_key_file=self.pki.client_key if client_cert else None)

    def bus(self, user: str, *, password: str | None = None, key_prefix: str = "", **security: Any) -> RedisStreamBus:
        """The product's bus as ``user`` (credentials in the URL; TLS settings explicit, never the environment)."""
        settings = self.tls(**security) if self.pki else RedisSecuritySettings()
        return RedisStreamBus(self.url(user, password), key_prefix=key_prefix, security=settings,
                              connect_timeout_s=2.0, socket_timeout_s=5.0)

    def admin(self) -> redis.Redis:
        kwargs: dict[str, Any] = {}
        if self.pki:
            kwargs = {"ssl": True, "ssl_ca_certs": str(self.pki.ca), "ssl_certfile": str(self.pki.client_cert),
                      "ssl_keyfile": str(self.pki.client_key)}
        return redis.Redis(host=self.host, port=self.port, username=ADMIN, password=self.passwords[ADMIN],
                           socket_timeout=5, **kwargs)

    def start(self) -> AclRedis:
        binary = require("redis-server")
        lines = []
        for line in self.acl_text.splitlines():
            name = line.split()[1]
            if name != "default" and self.add_passwords:
                self.passwords[name] = secrets.token_hex(12)
                line += f" >{self.passwords[name]}"
            lines.append(line)
        self.passwords[ADMIN] = secrets.token_hex(12)
        lines.append(f"user {ADMIN} on >{self.passwords[ADMIN]} ~* &* +@all")
        aclfile = self.workdir / "users.acl"
        aclfile.write_text("\n".join(lines) + "\n")
        args = [binary, "--bind", "127.0.0.1", "-::1", "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--aclfile", str(aclfile), "--logfile", str(self.workdir / "redis.log")]
        if self.pki:
            args += ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.pki.server_cert),
                     "--tls-key-file", str(self.pki.server_key), "--tls-ca-cert-file", str(self.pki.ca),
                     "--tls-auth-clients", "yes"]
        else:
            args += ["--port", str(self.port)]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = self.proc

        def answers_or_exited() -> bool:
            try:
                with self.admin() as admin:
                    return bool(admin.ping())
            except redis.exceptions.ConnectionError:
                return proc.poll() is not None  # exited: no use waiting

        try:
            wait_for(answers_or_exited, timeout=10, interval=0.02, message=f"redis-server on port {self.port}")
            if proc.poll() is None:
                return self
        except TimeoutError:
            pass
        log = self.workdir / "redis.log"
        self.stop()
        tail = log.read_text()[-2000:] if log.exists() else ""
        raise RuntimeError(f"redis-server on port {self.port} did not start:\n{tail}")

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait(timeout=10)
            self.proc = None

    def denials(self) -> list[dict[Any, Any]]:
        """``ACL LOG`` entries (newest first): every command an ACL refused since the last reset."""
        with self.admin() as admin:
            return list(admin.acl_log())
