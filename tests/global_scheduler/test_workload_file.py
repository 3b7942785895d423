"""Workload files are checked as the API checks a request: strict types, every key known, the API's own
field paths and words, one line per problem; ``meridian submit`` prints them and exits 2."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from typer.testing import CliRunner

from global_scheduler.validation import InvalidArgumentError, validate_submit
from global_scheduler.workload_file import WorkloadFileError, load_workload_file
from meridian.cli import build_app
from protos import global_api_pb2 as api

VALID = "name: web\ntenant: team-a\nreplicas: 3\nrequests: {cpu: 500m, memory: 1Gi}\n"


def _problems(tmp_path: Path, text: str, name: str = "web.yaml") -> list[str]:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(WorkloadFileError) as err:
        load_workload_file(path)
    return [line.removeprefix(f"{path}: ") for line in err.value.problems]


@pytest.mark.parametrize(("text", "expected"), [
    # The three examples.
    pytest.param(VALID + "allowed_regions: eu-west\n",
                 ["spec.allowed_regions: must be a list, got 'eu-west' (a list is written [eu-west])"],
                 id="regions-as-a-string"),
    pytest.param(VALID.replace("replicas: 3", "replicas: three"), ["spec.replicas: must be an integer, got 'three'"],
                 id="replicas-as-a-word"),
    pytest.param(VALID.replace("name: web\n", ""), ["spec.name: required"], id="missing-name"),
    # A typo names the unknown key and the one it probably meant (and is not also reported as missing).
    pytest.param(VALID.replace("replicas:", "replica:"), ["spec.replica: unknown field; did you mean 'replicas'?"],
                 id="typo-replica"),
    pytest.param(VALID + "allowedRegion: [eu-west]\n", ["spec.allowedRegion: unknown field; did you mean "
                                                        "'allowedRegions'?"], id="typo-camel-case"),
    pytest.param(VALID.replace("cpu:", "cpus:"), ["spec.requests.cpus: unknown field; did you mean 'cpu'?"],
                 id="typo-nested"),
    pytest.param(VALID + "colour: blue\n", ["spec.colour: unknown field (known: name, tenant, replicas, requests, "
                                            "priority, allowed_regions, origin_region, latency_slo_ms, deferrable, "
                                            "deadline, deadline_unix_s, weights, workload_class, image, idempotency_key)"],
                 id="unknown-key-without-a-likely-one"),
    # No coercion: a quoted number is not an integer, a boolean is not a quantity.
    pytest.param(VALID.replace("replicas: 3", "replicas: '3'"), ["spec.replicas: must be an integer, got '3'"],
                 id="replicas-quoted"),
    pytest.param(VALID.replace("cpu: 500m", "cpu: yes"), ["spec.requests.cpu: must be a quantity such as 500m, 2 "
                                                          "or 4Gi, got True"], id="quantity-boolean"),
    pytest.param(VALID.replace("requests: {cpu: 500m, memory: 1Gi}", "requests: 2"),
                 ["spec.requests: must be a mapping, got 2"], id="requests-not-a-mapping"),
    # The API's words for the API's checks, every field's problem at once.
    pytest.param("name: Web_1\ntenant: team-a\nreplicas: 0\nrequests: {cpu: two, memory: 1Gi}\n"
                 "allowed_regions: [eu-west, 'eu north']\n",
                 ["spec.name: 'Web_1' is not a DNS-1123 label (lower case, digits, '-', ≤ 63)",
                  "spec.replicas: must be between 1 and 10000, got 0",
                  "spec.requests.cpu: not a Kubernetes quantity: Invalid number format: two",
                  "spec.allowed_regions[1]: 'eu north' is not a region name"], id="several-api-checks"),
    # What spans fields is checked last, by the API's validation of the whole spec.
    pytest.param(VALID + "latency_slo_ms: 80\n",
                 ["spec.origin_region: required with a latency SLO (the round trip is measured from it)"],
                 id="slo-without-origin"),
    pytest.param(VALID + "deadline: tomorrow\n",
                 ["spec.deadline: must be an ISO date-time such as 2026-12-01T06:00:00Z, got 'tomorrow'"],
                 id="deadline-not-a-date"),
    pytest.param("- web\n", ["a workload file is a mapping of WorkloadSpec fields (name, tenant, replicas, requests, "
                             "…), got a list"], id="not-a-mapping"),
    pytest.param("name: [\n", ["not YAML: line 2, column 1: expected the node content, but found '<stream end>'"],
                 id="not-yaml"),
])
def test_problems(tmp_path: Path, text: str, expected: list[str]) -> None:
    assert _problems(tmp_path, text) == expected


@pytest.mark.parametrize(("line", "field", "set_field"), [
    pytest.param("name: Web_1", "spec.name", lambda s: setattr(s, "name", "Web_1"), id="name"),
    pytest.param("tenant: 'a|b'", "spec.tenant", lambda s: setattr(s, "tenant", "a|b"), id="tenant"),
    pytest.param("replicas: 20000", "spec.replicas", lambda s: setattr(s, "replicas", 20000), id="replicas"),
    pytest.param("priority: 2000000", "spec.priority", lambda s: setattr(s, "priority", 2000000), id="priority"),
    pytest.param("origin_region: 'eu west'", "spec.origin_region", lambda s: setattr(s, "origin_region", "eu west"),
                 id="origin-region"),
    pytest.param("latency_slo_ms: -5", "spec.latency_slo_ms", lambda s: setattr(s, "latency_slo_ms", -5.0),
                 id="latency"),
    pytest.param("workload_class: gold", "spec.workload_class", lambda s: setattr(s, "workload_class", "gold"),
                 id="class"),
    pytest.param("weights: {energy: -1}", "spec.weights.energy", lambda s: setattr(s.weights, "energy", -1.0),
                 id="weight"),
])
def test_a_field_reads_as_the_api_answers(tmp_path: Path, line: str, field: str, set_field) -> None:
    """The file's line is the API's INVALID_ARGUMENT message for the same spec, word for word."""
    base = "name: web\ntenant: team-a\nreplicas: 3\nrequests: {cpu: 500m}\norigin_region: eu-west\n"
    key = line.split(":")[0] + ":"
    lines = [x for x in base.splitlines() if not x.startswith(key)] + [line]
    spec = api.WorkloadSpec(name="web", tenant="team-a", replicas=3, requests=api.ResourceQuantities(cpu="500m"),
                            origin_region="eu-west")
    set_field(spec)
    with pytest.raises(InvalidArgumentError) as err:
        validate_submit(api.SubmitWorkloadRequest(spec=spec), now_s=time.time())
    assert err.value.field == field
    assert _problems(tmp_path, "\n".join(lines) + "\n") == [str(err.value)]


def test_both_spellings_and_every_field(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("name: train\ntenant: ads\nreplicas: 2\nrequests: {cpu: 8, memory: 32Gi, gpuMilli: 500}\n"
                    "allowedRegions: [eu-north, eu-west]\noriginRegion: eu-west\nlatencySloMs: 80\npriority: 5\n"
                    "deferrable: true\ndeadline: 2099-12-01T06:00:00Z\nweights: {performance: 0.2, energy: 0.8}\n"
                    "class: batch\nidempotencyKey: train-1\n")
    spec, key = load_workload_file(path)
    assert key == "train-1"
    assert (spec.name, spec.tenant, spec.replicas, spec.priority) == ("train", "ads", 2, 5)
    assert (spec.requests.cpu, spec.requests.memory, spec.requests.gpu_milli) == ("8", "32Gi", "500")
    assert list(spec.allowed_regions) == ["eu-north", "eu-west"] and spec.origin_region == "eu-west"
    assert spec.latency_slo_ms == 80.0 and spec.deferrable and spec.deadline_unix_s == datetime(2099, 12, 1, 6, tzinfo=UTC).timestamp()
    assert (spec.weights.performance, spec.weights.energy, spec.workload_class) == (0.2, 0.8, "batch")


def test_submit_prints_one_line_per_problem_and_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenant: team-a\nreplicas: three\nrequests: {cpu: 500m}\nallowed_regions: eu-west\n")
    # No API is reachable here: the file is refused before any call.
    out = CliRunner().invoke(build_app(), ["submit", str(bad)], env={"MERIDIAN_API": "127.0.0.1:9"})
    assert out.exit_code == 2 and isinstance(out.exception, SystemExit)
    assert out.output.splitlines() == [
        f"{bad}: spec.name: required",
        f"{bad}: spec.replicas: must be an integer, got 'three'",
        f"{bad}: spec.allowed_regions: must be a list, got 'eu-west' (a list is written [eu-west])",
    ]
