"""Input edge cases of SubmitWorkload that passed validation one by one: a trailing newline, control,
bidi and ANSI characters, a ledger separator in a tenant, huge echoes, unbounded region lists and
weights that overflow the routing features."""

from __future__ import annotations

import pytest

from global_scheduler.validation import (
    ECHO_CHARS,
    MAX_ALLOWED_REGIONS,
    InvalidArgumentError,
    echo,
    validate_submit,
)
from protos import global_api_pb2 as api

pytestmark = pytest.mark.faults  # part of the hardening suite: pytest -m faults


def _request(**spec: object) -> api.SubmitWorkloadRequest:
    fields: dict[str, object] = {"name": "web", "tenant": "team-a", "replicas": 1,
                                 "requests": api.ResourceQuantities(cpu="500m")}
    fields.update(spec)
    return api.SubmitWorkloadRequest(spec=api.WorkloadSpec(**fields))


@pytest.mark.parametrize(("spec", "field"), [
    pytest.param({"name": "web\n"}, "spec.name", id="name-trailing-newline"),
    pytest.param({"allowed_regions": ["eu-north\n"]}, "spec.allowed_regions[0]", id="region-trailing-newline"),
    pytest.param({"origin_region": "eu-west\n"}, "spec.origin_region", id="origin-trailing-newline"),
    pytest.param({"tenant": "evil|tenant"}, "spec.tenant", id="tenant-ledger-separator"),
    pytest.param({"tenant": "team\x1b[31mred"}, "spec.tenant", id="tenant-ansi-escape"),
    pytest.param({"tenant": "team\u202ea"}, "spec.tenant", id="tenant-bidi-override"),
    pytest.param({"tenant": "team\na"}, "spec.tenant", id="tenant-newline"),
    pytest.param({"tenant": "t" * 254}, "spec.tenant", id="tenant-too-long"),
    pytest.param({"allowed_regions": ["eu-north"] * (MAX_ALLOWED_REGIONS + 1)}, "spec.allowed_regions",
                 id="too-many-regions"),
    pytest.param({"weights": api.ObjectiveWeights(energy=1e308)}, "spec.weights.energy", id="weight-overflows"),
])
def test_edge_cases_are_refused_naming_the_field(spec: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as err:
        validate_submit(_request(**spec), now_s=0.0)
    assert err.value.field == field


@pytest.mark.parametrize("tenant", ["team-a", "app_0", "org/team", "svc@prod", "ns:team.a"])
def test_ordinary_tenants_still_pass(tenant: str) -> None:
    validate_submit(_request(tenant=tenant), now_s=0.0)


def test_a_huge_value_is_not_echoed_in_full() -> None:
    with pytest.raises(InvalidArgumentError) as err:
        validate_submit(_request(name="x" * 1_000_000), now_s=0.0)
    assert len(str(err.value)) < 300 and "1,000,000 characters" in str(err.value)
    assert echo("short") == "'short'" and len(echo("y" * 10_000)) < ECHO_CHARS + 40
