"""Unsafe API settings refuse to start, at the place the port is bound and at the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from global_scheduler.settings import ApiSettings, unsafe_api_reason
from meridian.cli import build_app

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


@pytest.mark.parametrize(("api", "refused"), [
    pytest.param({"listen": "0.0.0.0:50051"}, "authentication is off", id="no-auth-beyond-loopback"),
    pytest.param({"listen": "[::]:50051"}, "authentication is off", id="no-auth-any-ipv6"),
    pytest.param({"listen": "0.0.0.0:50051", "insecure": True}, None, id="explicitly-insecure"),
    pytest.param({"listen": "0.0.0.0:50051", "auth_tokens": ["t"]}, None, id="tokens"),
    pytest.param({"listen": "127.0.0.1:50051"}, None, id="loopback-without-auth"),
    pytest.param({"listen": "localhost:50051"}, None, id="localhost-without-auth"),
    pytest.param({"listen": "127.0.0.1:0", "tls_cert_file": "cert.pem"}, "tls_key_file is not", id="cert-no-key"),
    pytest.param({"listen": "127.0.0.1:0", "tls_key_file": "key.pem"}, "tls_cert_file is not", id="key-no-cert"),
    # Streams may not take the threads unary calls and health checks need (interceptors.py).
    pytest.param({"max_workers": 8, "max_watches_total": 6}, "reserved_workers", id="watches-leave-too-few-threads"),
    pytest.param({"max_workers": 6}, "reserved_workers", id="default-half-leaves-too-few"),
    pytest.param({"max_workers": 8}, None, id="half-of-8-threads-for-watches"),
    pytest.param({"max_workers": 32, "max_watches_total": 28}, None, id="explicit-limit-with-reserve"),
])
def test_unsafe_api_settings(api: dict[str, object], refused: str | None) -> None:
    reason = unsafe_api_reason(ApiSettings(**api))
    if refused is None:
        assert reason is None
    else:
        assert reason is not None and refused in reason


def test_the_command_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("MERIDIAN_GLOBAL_API__AUTH_TOKENS", "[]")
    result = CliRunner().invoke(build_app(), ["global-scheduler", "--listen", "0.0.0.0:0"])
    assert result.exit_code == 2
    assert "authentication is off" in result.output and "Traceback" not in result.output


def test_build_server_refuses_a_certificate_without_its_key(redis_url: str, key_prefix: str) -> None:
    from global_scheduler.scheduler import GlobalScheduler
    from global_scheduler.server import UnsafeSettingsError, build_server
    from global_scheduler.settings import GlobalSchedulerSettings
    from meridian.bus import open_bus

    settings = GlobalSchedulerSettings(api={"listen": "127.0.0.1:0", "tls_cert_file": "cert.pem"},
                                       bus={"url": redis_url, "key_prefix": key_prefix},
                                       routing={"policy": "karmada", "worker_process": False})
    engine = GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix))
    with pytest.raises(UnsafeSettingsError, match="TLS needs both"):
        build_server(engine)
