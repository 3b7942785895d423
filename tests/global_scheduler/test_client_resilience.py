"""The client and CLI when the connection is the problem: a watch that outlives a server restart on the
same port, and a plaintext client at a TLS server told so at once (issue 22)."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from typer.testing import CliRunner

from global_scheduler.client import GlobalClient, UnreachableError, speaks_tls
from global_scheduler.scheduler import GlobalScheduler
from global_scheduler.server import build_server
from meridian.bus import open_bus
from meridian.cli import build_app
from meridian.envtest import wait_for
from protos import global_api_pb2 as api
from tests.global_api_helpers import TOKEN, self_signed_certificate
from tests.global_scheduler.conftest import Federation

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


AUTH = (("authorization", f"Bearer {TOKEN}"),)
SPEC = api.WorkloadSpec(name="web", tenant="shop", replicas=1, requests=api.ResourceQuantities(cpu="1"))
STATE_LINE = re.compile(r"^\d\d:\d\d:\d\d  (\w+)\s", re.MULTILINE)


def _restart_on_same_port(fed: Federation, redis_url: str, key_prefix: str) -> None:
    """Stop the API (and its engine) and start a new one on the same port over the same Redis."""
    port = fed.server.port
    fed.server.stop(0.2)
    settings = fed.engine.settings.model_copy(deep=True)
    settings.api.listen = f"127.0.0.1:{port}"
    engine = GlobalScheduler(settings=settings, bus=open_bus(redis_url, key_prefix=key_prefix))
    fed.server, fed.engine = build_server(engine), engine  # the fixture stops this one


def test_cli_watch_resumes_across_a_server_restart(federation, redis_url: str, key_prefix: str) -> None:
    fed = federation()
    client = GlobalClient(fed.target, token=TOKEN)
    w = client.submit(SPEC)
    wait_for(lambda: client.get(w.id).state == api.WORKLOAD_STATE_RUNNING, message="the workload to run")
    result: dict[str, object] = {}
    env = {"MERIDIAN_API": fed.target, "MERIDIAN_TOKEN": TOKEN}
    watcher = threading.Thread(target=lambda: result.update(
        out=CliRunner().invoke(build_app(), ["watch", w.id, "--deadline", "60"], env=env)), daemon=True)
    watcher.start()
    wait_for(lambda: fed.server.streams.open == 1, message="the watch to open")
    _restart_on_same_port(fed, redis_url, key_prefix)
    # The watch reconnects to the new server and gets the same snapshot: not printed again.
    wait_for(lambda: fed.server.streams.open == 1, message="the watch to reconnect")
    client.cancel(w.id)
    watcher.join(timeout=30)
    assert not watcher.is_alive(), "the watch did not end after the cancellation"
    out = result["out"]
    assert out.exit_code == 0, out.output
    states = STATE_LINE.findall(out.output)
    assert states[-1] == "CANCELLED"
    assert states.count("RUNNING") == 1, out.output  # resumed without repeating the unchanged state
    assert "reconnecting" in out.output, out.output
    client.close()


def test_follow_stops_at_its_deadline_while_the_server_is_down(federation,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    fed = federation()
    client = GlobalClient(fed.target, token=TOKEN)
    w = client.submit(SPEC)
    fed.server.stop(0.2)
    fed.server.server.wait_for_termination(5)
    retries: list[tuple[str, float]] = []
    with pytest.raises(grpc.RpcError) as err:  # never connected: the first failure is the answer
        list(client.follow(w.id, deadline_s=3, on_reconnect=lambda why, d: retries.append((why, d))))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and retries == []  # not retried until the deadline

    # Connected once, then the server went away: retried with back-off until the deadline, on the client's
    # clock, injected here: each back-off advances it by exactly its delay.
    def flaky_watch(wid: str, timeout_s: float | None = None):  # the same snapshot, then the stream breaks
        yield w
        raise _Unavailable()

    clock = [100.0]

    def sleep(s: float) -> None:
        clock[0] += s

    monkeypatch.setattr("global_scheduler.client.time", SimpleNamespace(monotonic=lambda: clock[0]))
    client.watch = flaky_watch  # type: ignore[method-assign]
    seen = list(client.follow(w.id, deadline_s=2.0, on_reconnect=lambda why, d: retries.append((why, d)),
                              sleep=sleep))
    assert [x.id for x in seen] == [w.id]
    # 0.2 + 0.5 + 1.0, then what is left of the 2 s deadline, then nothing: it ended at its deadline.
    assert [d for _, d in retries] == pytest.approx([0.2, 0.5, 1.0, 0.3])
    assert clock[0] == pytest.approx(102.0)
    client.close()


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "Socket closed"


def test_plaintext_client_at_a_tls_server_is_told_to_pass_ca(federation, tmp_path: Path) -> None:
    cert, key = self_signed_certificate(tmp_path)
    fed = federation(tls=(str(cert), str(key)))
    assert speaks_tls(fed.target) is True
    t0 = time.monotonic()
    with GlobalClient(fed.target, token=TOKEN) as client, pytest.raises(UnreachableError) as err:
        client.clusters()
    assert time.monotonic() - t0 < 5
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
    assert "probably serves TLS; pass --ca FILE" in err.value.details() and fed.target in err.value.details()
    env = {"MERIDIAN_API": fed.target, "MERIDIAN_TOKEN": TOKEN}
    for args in (["clusters"], ["ls"], ["watch", "some-id"]):
        t0 = time.monotonic()
        out = CliRunner().invoke(build_app(), args, env=env)
        assert out.exit_code == 2 and "probably serves TLS; pass --ca FILE" in out.output, (args, out.output)
        assert time.monotonic() - t0 < 5
    # With the CA it works; and a TLS client at a plaintext server is told the opposite.
    out = CliRunner().invoke(build_app(), ["clusters", "--ca", str(cert)], env=env)
    assert out.exit_code == 0, out.output
    plain = federation()
    out = CliRunner().invoke(build_app(), ["clusters", "--ca", str(cert)], env={**env, "MERIDIAN_API": plain.target})
    assert out.exit_code == 2 and "probably serves plaintext; drop --ca" in out.output, out.output


def test_nothing_listening_is_said_plainly(tmp_path: Path) -> None:
    from tests.conftest import free_port

    target = f"127.0.0.1:{free_port()}"
    assert speaks_tls(target) is None
    with GlobalClient(target, token=TOKEN) as client, pytest.raises(UnreachableError, match="nothing answers at"):
        client.clusters()
