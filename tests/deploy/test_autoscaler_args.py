"""The deployed autoscaler would start: its container's arguments, as rendered by kustomize and expanded as
the kubelet expands ``$(VAR)`` from the container's environment (the ConfigMap meridian-autoscaler-target),
pass the ``meridian autoscaler`` command's own argument parsing and its own start-up validation
(:func:`regional_scheduler.autoscaling.cli.prepare_serving`, which the command calls before it connects
to anything).

The manifest runs ``--shadow=hpa``, and ``hpa`` scales on CPU utilisation: without ``--cpu-usage-query``
and ``--cpu-request-query`` the autoscaler refuses to start (docs/autoscaler-serving.md). The last test
shows that this check catches exactly that.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import pytest
import typer
from typer.core import TyperGroup

from meridian.cli import build_app
from regional_scheduler.autoscaling.cli import prepare_serving
from regional_scheduler.autoscaling.serving import policies_of
from tests.deploy.kustomize_helpers import env_of, find, render

CPU_OPTIONS = ("--cpu-usage-query", "--cpu-request-query", "--ready-query")
#: overlay → the target (namespace, Deployment) its ConfigMap sets.
TARGETS = {"member": ("meridian-workloads", "web"), "autoscaler-example": ("shop", "web")}


def expand(arg: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of a command or argument: ``$(VAR)`` becomes VAR's value when the container
    defines VAR and stays as written otherwise; ``$$`` is a literal ``$``."""
    out: list[str] = []
    i = 0
    while i < len(arg):
        if arg.startswith("$$", i):
            out.append("$")
            i += 2
            continue
        if arg.startswith("$(", i) and (end := arg.find(")", i + 2)) != -1:
            name = arg[i + 2:end]
            out.append(env.get(name, arg[i:end + 1]))
            i = end + 1
            continue
        out.append(arg[i])
        i += 1
    return "".join(out)


def container_of(overlay: str) -> tuple[dict[str, Any], dict[str, str]]:
    """The autoscaler's container in ``overlay`` and its environment (ConfigMap references resolved)."""
    docs = render(overlay)
    deployment = find(docs, "Deployment", "meridian-autoscaler", "meridian-system")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container, env_of(container, docs)


def command_line(container: dict[str, Any], env: dict[str, str]) -> list[str]:
    argv = [expand(a, env) for a in [*container.get("command", []), *container.get("args", [])]]
    unresolved = [a for a in argv if "$(" in a]
    assert not unresolved, f"the kubelet would pass these literally: {unresolved}"
    return argv


def parse(argv: list[str]) -> dict[str, Any]:
    """``meridian <command> ...`` through the real CLI's parser (an unknown option or a bad value fails
    here as it would in the pod); the command's parameters by name, nothing invoked."""
    assert argv[0] == "meridian", argv
    root = typer.main.get_command(build_app())
    assert isinstance(root, TyperGroup)
    command = root.get_command(typer.Context(root), argv[1])
    assert command is not None, f"meridian has no command {argv[1]!r}"
    with command.make_context(argv[1], argv[2:]) as ctx:
        return dict(ctx.params)


def start_up(params: dict[str, Any]) -> Any:
    wanted = inspect.signature(prepare_serving).parameters
    return prepare_serving(**{k: v for k, v in params.items() if k in wanted})


@pytest.fixture
def container_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The test process's environment holds none of the autoscaler's settings but the container's."""
    for name in list(os.environ):
        if name.startswith("MERIDIAN_AUTOSCALER_"):
            monkeypatch.delenv(name)
    return monkeypatch


@pytest.mark.parametrize("overlay", sorted(TARGETS))
def test_the_deployed_autoscaler_passes_its_own_start_up_checks(
        overlay: str, container_env: pytest.MonkeyPatch) -> None:
    container, env = container_of(overlay)
    for name, value in env.items():
        container_env.setenv(name, value)
    argv = command_line(container, env)
    assert argv[:2] == ["meridian", "autoscaler"]
    params = parse(argv)
    namespace, deployment = TARGETS[overlay]
    assert (params["namespace"], params["deployment"]) == (namespace, deployment)

    settings, online, source = start_up(params)  # raises typer.BadParameter where the pod would refuse

    assert source.supplies_utilisation
    assert {p.name for p in policies_of(online.policy)} == {"quantile-budget", "hpa"}
    assert settings.budget.ratio == pytest.approx(1.03)  # the container's environment reached the settings
    # Each CPU query is the target's: its namespace and its Deployment's pods.
    for key in ("cpu_usage_query", "cpu_request_query", "ready_query"):
        assert f'namespace="{namespace}"' in params[key], params[key]
        assert f'pod=~"{deployment}-' in params[key], params[key]


def test_without_the_cpu_queries_the_same_container_would_refuse_to_start(
        container_env: pytest.MonkeyPatch) -> None:
    """The check above bites: the manifest as it was (``--shadow=hpa``, no CPU queries) is refused."""
    container, env = container_of("member")
    for name, value in env.items():
        container_env.setenv(name, value)
    argv = [a for a in command_line(container, env) if not a.startswith(CPU_OPTIONS)]
    with pytest.raises(typer.BadParameter, match="'hpa' scales on CPU utilisation"):
        start_up(parse(argv))
