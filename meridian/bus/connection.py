"""How a process reaches Redis: one URL plus credentials and TLS, parsed once for every client.

Every path to Redis is built from one :class:`RedisEndpoint`: the bus's redis-py pool, its two
hand-written RESP sockets (the hot ``XREADGROUP`` read and the pipelined publish,
:mod:`meridian.bus.resp`) and the accounting ledger's client (:func:`redis_client`). A password or a
TLS option given once therefore applies to all of them; none of them falls back to plaintext.

Where the pieces come from, the later winning:

1. the URL: ``redis://[user[:password]@]host[:port][/db]``, ``rediss://…`` (TLS) or ``unix:///path``;
   ``redis+cluster://host:port`` (``rediss+cluster://`` with TLS) names one node of a Redis Cluster, from
   which a cluster client (redis-py's ``RedisCluster``) discovers the rest.
   TLS files may ride along as redis-py's query parameters (``?ssl_ca_certs=/ca.crt&ssl_certfile=…``);
2. :class:`RedisSecuritySettings`, from ``MERIDIAN_REDIS_*`` environment variables: the ACL user, a
   password file (a mounted Kubernetes Secret, read once at start) or the password, and TLS files.

So a password never has to appear on a command line or in a manifest, and what logs and error
messages print is :attr:`RedisEndpoint.redacted_url` (or :func:`redact_url`), never the password.
Which user may do what is ``deploy/redis/users.acl``, written by :mod:`meridian.bus.acl`.

Hazards: TLS files without ``rediss://`` are refused rather than ignored (a typo must not mean
plaintext); the password file is read once, so a rotated password takes a restart.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

import redis
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from redis.cluster import RedisCluster

from meridian.bus.base import BusConfigError

SCHEMES = ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster")
#: redis-py's names for the TLS files and the database, accepted as URL query parameters.
_QUERY_PARAMETERS = frozenset({"db", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname"})
_FALSE = frozenset({"0", "false", "no", "off"})


class RedisSecuritySettings(BaseSettings):
    """Credentials and TLS of this process's Redis connections (environment: ``MERIDIAN_REDIS_*``).

    A process is one component, so one ACL user (``deploy/redis/users.acl``); these override the URL's.
    """

    model_config = SettingsConfigDict(env_prefix="MERIDIAN_REDIS_")

    username: str | None = Field(None, description="ACL user (meridian-agent, meridian-regional, meridian-global, "
                                 "…: deploy/redis/users.acl). None: the URL's, else Redis's 'default' user.")
    password_file: Path | None = Field(None, description="File holding the password, e.g. a mounted Secret key; "
                                       "read once at start, trailing newlines ignored. Wins over password and the "
                                       "URL's.")
    password: SecretStr | None = Field(None, description="The password itself (e.g. a secretKeyRef). Prefer "
                                       "password_file: a file is not copied into the process environment.")
    tls_ca_file: Path | None = Field(None, description="PEM CA bundle that signed Redis's certificate (rediss:// "
                                     "only); it alone is trusted. None: the system's CAs.")
    tls_cert_file: Path | None = Field(None, description="PEM client certificate, for a Redis that asks for one "
                                       "(tls-auth-clients yes); with tls_key_file.")
    tls_key_file: Path | None = Field(None, description="PEM private key of tls_cert_file.")
    tls_check_hostname: bool = Field(True, description="Check that Redis's certificate names the URL's host. "
                                     "Turn off only for a certificate that names another host: the chain is "
                                     "still verified against the CA.")


@dataclass(frozen=True)
class RedisEndpoint:
    """Where Redis is and how to authenticate to it; the one description every client is built from."""

    scheme: str
    host: str
    port: int
    socket_path: str
    db: int
    username: str | None
    password: str | None = field(repr=False)
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_check_hostname: bool = True

    @property
    def tls(self) -> bool:
        return self.scheme in ("rediss", "rediss+cluster")

    @property
    def cluster(self) -> bool:
        """A Redis Cluster seed node (``redis+cluster://``): clients must follow slots and redirections."""
        return self.scheme.endswith("+cluster")

    @property
    def user(self) -> str:
        """The ACL user the server will see (``default`` when none is given)."""
        return self.username or "default"

    @property
    def redacted_url(self) -> str:
        """The URL with the password replaced by ``***``: what logs and error messages may print."""
        auth = ""
        if self.username or self.password:
            auth = f"{quote(self.username or '', safe='')}{':***' if self.password else ''}@"
        if self.scheme == "unix":
            return f"unix://{auth}{self.socket_path}" + (f"?db={self.db}" if self.db else "")
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{auth}{host}:{self.port}" + ("" if self.cluster else f"/{self.db}")

    def ssl_context(self) -> ssl.SSLContext:
        """The client TLS context: the CA file alone (else the system's CAs), the optional client certificate."""
        try:
            context = ssl.create_default_context(cafile=self.tls_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise BusConfigError(f"cannot load the Redis TLS CA file {self.tls_ca_file} "
                                 f"(MERIDIAN_REDIS_TLS_CA_FILE): {exc}") from None
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.check_hostname = self.tls_check_hostname
        if self.tls_cert_file or self.tls_key_file:
            try:
                context.load_cert_chain(self.tls_cert_file or "", self.tls_key_file)
            except (OSError, ssl.SSLError) as exc:
                raise BusConfigError(f"cannot load the Redis TLS client certificate {self.tls_cert_file} / key "
                                     f"{self.tls_key_file} (MERIDIAN_REDIS_TLS_CERT_FILE / _KEY_FILE): {exc}") from None
        return context

    def redis_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``redis.Redis`` (or, without ``db``, of ``RedisCluster``) for this endpoint (no
        CLIENT SETINFO: ACL users need no CLIENT)."""
        kwargs: dict[str, Any] = {"username": self.username, "password": self.password, "driver_info": None}
        if not self.cluster:
            kwargs["db"] = self.db
        if self.scheme == "unix":
            kwargs["unix_socket_path"] = self.socket_path
            return kwargs
        kwargs.update(host=self.host, port=self.port)
        if self.tls:
            kwargs.update(ssl=True, ssl_ca_certs=self.tls_ca_file, ssl_certfile=self.tls_cert_file,
                          ssl_keyfile=self.tls_key_file, ssl_check_hostname=self.tls_check_hostname,
                          ssl_min_version=ssl.TLSVersion.TLSv1_2)
        return kwargs


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (unparseable input is cut to what follows the last ``@``)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        user = parts.username or ""
        host = parts.netloc.rpartition("@")[2]
        return parts._replace(netloc=f"{user}:***@{host}").geturl()
    except ValueError:
        return url.rpartition("@")[2]


def _read_password(path: Path) -> str:
    try:
        password = path.read_text().rstrip("\r\n")
    except OSError as exc:
        raise BusConfigError(f"cannot read the Redis password file {path} (MERIDIAN_REDIS_PASSWORD_FILE): "
                             f"{exc.strerror or exc}") from None
    if not password:
        raise BusConfigError(f"the Redis password file {path} (MERIDIAN_REDIS_PASSWORD_FILE) is empty")
    return password


def endpoint_from_url(url: str, security: RedisSecuritySettings | None = None) -> RedisEndpoint:
    """Parse ``url`` and apply ``security`` on top (None: the URL alone, no environment)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise BusConfigError(f"malformed Redis URL {redact_url(url)}: {exc}") from None
    if parts.scheme not in SCHEMES:
        raise BusConfigError(f"unsupported Redis URL {redact_url(url)}: use redis://, rediss:// (TLS), unix:// or, "
                             "for a Redis Cluster, redis+cluster:// (rediss+cluster:// with TLS)")
    query = {name: values[-1] for name, values in parse_qs(parts.query).items()}
    unknown = sorted(set(query) - _QUERY_PARAMETERS)
    if unknown:
        raise BusConfigError(f"unsupported parameter(s) {', '.join(unknown)} in Redis URL {redact_url(url)}; "
                             f"known: {', '.join(sorted(_QUERY_PARAMETERS))}")
    db_text = query.get("db") or (parts.path.strip("/") if parts.scheme != "unix" else "") or "0"
    if not db_text.isdigit():
        raise BusConfigError(f"Redis URL {redact_url(url)}: the database must be a number, not {db_text!r}")
    username = unquote(parts.username) if parts.username else None
    password = unquote(parts.password) if parts.password else None
    ca, cert, key = query.get("ssl_ca_certs"), query.get("ssl_certfile"), query.get("ssl_keyfile")
    check_hostname = query.get("ssl_check_hostname", "true").lower() not in _FALSE
    if security is not None:
        username = security.username or username
        if security.password_file is not None:
            password = _read_password(security.password_file)
        elif security.password is not None:
            password = security.password.get_secret_value()
        ca = str(security.tls_ca_file) if security.tls_ca_file else ca
        cert = str(security.tls_cert_file) if security.tls_cert_file else cert
        key = str(security.tls_key_file) if security.tls_key_file else key
        check_hostname = check_hostname and security.tls_check_hostname
    if parts.scheme.endswith("+cluster") and int(db_text) != 0:
        raise BusConfigError(f"Redis URL {redact_url(url)}: a Redis Cluster has only database 0, not {db_text}")
    if parts.scheme not in ("rediss", "rediss+cluster") and (ca or cert or key):
        raise BusConfigError(f"TLS files are set (MERIDIAN_REDIS_TLS_* or ssl_* URL parameters) but the Redis URL "
                             f"{redact_url(url)} is not rediss://; refusing to connect in plaintext")
    if parts.scheme == "unix":
        if not parts.path:
            raise BusConfigError(f"Redis URL {redact_url(url)} names no socket path (unix:///path/to/redis.sock)")
        return RedisEndpoint("unix", "", 0, parts.path, int(db_text), username, password)
    return RedisEndpoint(parts.scheme, parts.hostname or "127.0.0.1", port or 6379, "", int(db_text), username,
                         password, ca, cert, key, check_hostname)


def redis_client(url: str, *, security: RedisSecuritySettings | None = None, **kwargs: Any) -> redis.Redis:
    """A redis-py client for ``url`` with this process's credentials and TLS (``security`` None: from the
    environment, ``MERIDIAN_REDIS_*``), for code that needs Redis beyond the bus (the energy ledger). One Redis
    only: a cluster URL raises :class:`BusConfigError` (:func:`cluster_client` for those)."""
    endpoint = endpoint_from_url(url, security if security is not None else RedisSecuritySettings())
    if endpoint.cluster:
        raise BusConfigError(f"{endpoint.redacted_url} is a Redis Cluster; this needs one Redis (redis://)")
    return redis.Redis(**endpoint.redis_kwargs(), **kwargs)


def cluster_client(url: str, *, security: RedisSecuritySettings | None = None, **kwargs: Any) -> RedisCluster:
    """A redis-py ``RedisCluster`` for a ``redis+cluster://`` URL, with this process's credentials and TLS."""
    endpoint = endpoint_from_url(url, security if security is not None else RedisSecuritySettings())
    if not endpoint.cluster:
        raise BusConfigError(f"{endpoint.redacted_url} is not a Redis Cluster URL (redis+cluster://host:port)")
    return RedisCluster(**endpoint.redis_kwargs(), **kwargs)


def keyspace_client(url: str, *, security: RedisSecuritySettings | None = None, **kwargs: Any) -> redis.Redis:
    """A client that reaches every key of ``url``: ``RedisCluster`` for a cluster URL (commands routed by slot,
    ``SCAN`` over every primary), else ``redis.Redis``. For whole-keyspace chores such as removing a run's keys."""
    if url.split("://", 1)[0].endswith("+cluster"):
        return cluster_client(url, security=security, **kwargs)  # type: ignore[return-value]
    return redis_client(url, security=security, **kwargs)


def require_redis(url: str, *, setting: str, security: RedisSecuritySettings | None = None,
                  timeout_s: float = 3.0) -> None:
    """Raise :class:`~meridian.errors.UserError` unless Redis at ``url`` answers ``PING`` (with this process's
    credentials and TLS) within ``timeout_s``. A server checks this at start, so a Redis that is not there is
    one line naming the URL and ``setting`` (the option or variable that points elsewhere), not a traceback
    from its first worker. Redis going away later is an outage the workers ride out with back-off."""
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from meridian.errors import UserError, one_line

    shown = redact_url(url)
    try:
        client = keyspace_client(url, security=security, socket_connect_timeout=timeout_s, socket_timeout=timeout_s,
                                 retry=Retry(NoBackoff(), 0))  # one attempt: redis-py's retries take seconds
    except redis.exceptions.RedisClusterException as exc:  # a cluster client asks its seed node at once
        raise UserError(f"Redis Cluster at {shown} is unreachable ({one_line(exc)})",
                        hint=f"start it, or point {setting} at a running one") from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise UserError(f"Redis at {shown} is unreachable ({one_line(exc)})",
                        hint=f"start Redis there (redis-server), or point {setting} at a running one") from exc
    try:
        client.ping()
    except redis.exceptions.AuthenticationError as exc:
        raise UserError(f"Redis at {shown} refused this process's credentials ({one_line(exc)})",
                        hint="check the URL's user and password, MERIDIAN_REDIS_USERNAME and "
                             "MERIDIAN_REDIS_PASSWORD_FILE") from exc
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise UserError(f"Redis at {shown} is unreachable ({one_line(exc)})",
                        hint=f"start Redis there (redis-server), or point {setting} at a running one") from exc
    finally:
        client.close()
