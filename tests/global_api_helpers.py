"""Helpers for tests of the global scheduler's API: the federation fixture's token, a workload spec,
and a polling wait on a workload's state (not a test module, so tests import it freely). Waits on any
other condition: ``meridian.envtest.wait_for``, the one polling helper of every test."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from meridian.envtest import wait_for
from protos import global_api_pb2 as api

TOKEN = "test-token"  # the federation fixture's token
AUTH = (("authorization", f"Bearer {TOKEN}"),)


def spec(**kw: object) -> api.WorkloadSpec:
    """A small workload (2 replicas of 2 CPUs and 4 GiB), with ``kw`` overriding any field."""
    base: dict[str, object] = {"name": "web", "tenant": "shop", "replicas": 2,
                               "requests": api.ResourceQuantities(cpu="2", memory="4Gi")}
    base.update(kw)
    return api.WorkloadSpec(**base)


def wait_state(stub, wid: str, state: int, timeout_s: float = 30.0) -> api.Workload:
    """Poll the API until workload ``wid`` is in ``state``; returns it."""
    return wait_for(lambda: (w := stub.GetWorkload(api.GetWorkloadRequest(id=wid), metadata=AUTH)).state == state and w,
                    timeout=timeout_s, interval=0.05, message=f"workload {wid} to reach {api.WorkloadState.Name(state)}")


def self_signed_certificate(tmp_path: Path) -> tuple[Path, Path]:
    """(certificate, key) for localhost and 127.0.0.1, valid a day, made with the openssl command."""
    if shutil.which("openssl") is None:
        pytest.fail("openssl is needed to make a test certificate (apt-get install openssl)")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key
