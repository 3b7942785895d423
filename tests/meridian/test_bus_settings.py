"""The stream workers' shared settings (meridian/bus/settings.py): one model, each component's own defaults
(the values each had before the model existed), bounds and errors that say what is wrong, and the spellings
written for the flat settings still read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from global_scheduler.accounting.consumer import AccountingBus
from global_scheduler.settings import BusSettings, GlobalSchedulerSettings
from meridian.bus.settings import ConsumerSettings
from node_agent.settings import AgentSettings
from regional_scheduler.dispatch_worker import DispatchWorkerSettings
from regional_scheduler.kube_dispatch import KubeDispatchSettings
from regional_scheduler.summary_publisher import SummarySettings
from regional_scheduler.telemetry_state import TelemetryConsumerSettings


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in os.environ:
        if name.startswith(("MERIDIAN_DISPATCH_", "MERIDIAN_KUBE_DISPATCH_", "MERIDIAN_TELEMETRY_",
                            "MERIDIAN_SUMMARY_", "MERIDIAN_GLOBAL_", "MERIDIAN_AGENT_")):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(("make", "expected"), [
    pytest.param(lambda: DispatchWorkerSettings().bus, (256, 200, 30_000, (0.2, 0.5, 1.0, 2.0, 5.0)), id="dispatch"),
    pytest.param(lambda: KubeDispatchSettings().bus, (64, 500, 30_000, (0.2, 0.5, 1.0, 2.0, 5.0)), id="kube-dispatch"),
    pytest.param(lambda: TelemetryConsumerSettings().bus, (5000, 1000, 30_000, (0.1, 0.2, 0.5, 1.0, 2.0, 5.0)),
                 id="telemetry"),
    pytest.param(lambda: GlobalSchedulerSettings().bus, (1000, 200, 30_000, (0.1, 0.5, 1.0, 2.0, 5.0)), id="global"),
    pytest.param(lambda: AccountingBus(), (256, 1000, 30_000, (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)), id="accounting"),
])
def test_each_component_keeps_the_defaults_it_had(make, expected) -> None:  # type: ignore[no-untyped-def]
    bus = make()
    assert isinstance(bus, ConsumerSettings)
    assert (bus.batch, bus.block_ms, bus.claim_idle_ms, bus.backoff_s) == expected


def test_producers_keep_their_back_off() -> None:
    assert SummarySettings().backoff_s == (0.5, 1.0, 2.0, 5.0)
    assert AgentSettings().publish.backoff_s == (0.5, 1.0, 2.0, 5.0, 10.0)


def test_every_field_says_why_its_default() -> None:
    for name, info in ConsumerSettings.model_fields.items():
        assert info.description and len(info.description) > 60, name
    # a component's variant keeps the descriptions
    assert KubeDispatchSettings.model_fields["bus"].annotation.model_fields["batch"].description == \
        ConsumerSettings.model_fields["batch"].description


@pytest.mark.parametrize(("given", "where", "says"), [
    ({"backoff_s": ()}, "backoff_s", "at least 1 item"),
    ({"backoff_s": (0.1, -1.0)}, "backoff_s.1", "greater than or equal to 0"),
    ({"batch": 0}, "batch", "greater than or equal to 1"),
    ({"block_ms": -1}, "block_ms", "greater than or equal to 0"),
    ({"blok_ms": 5}, "blok_ms", "Extra inputs are not permitted"),
])
def test_a_bad_value_is_named_with_the_reason(given: dict, where: str, says: str) -> None:
    with pytest.raises(ValidationError) as info:
        ConsumerSettings(**given)
    error = info.value.errors()[0]
    assert ".".join(map(str, error["loc"])) == where and says in error["msg"]


def test_a_component_keeps_its_stricter_bounds() -> None:
    with pytest.raises(ValidationError, match=r"bus\.claim_idle_ms\n.*greater than or equal to 1000"):
        DispatchWorkerSettings(bus={"claim_idle_ms": 999})
    with pytest.raises(ValidationError, match=r"bus\.block_ms\n.*greater than or equal to 1"):
        KubeDispatchSettings(bus={"block_ms": 0})
    with pytest.raises(ValidationError, match=r"claim_idle_ms\n.*greater than or equal to 1"):
        BusSettings(claim_idle_ms=0)
    assert TelemetryConsumerSettings(bus={"block_ms": 0, "claim_idle_ms": 0}).bus.block_ms == 0  # tests step it


def test_tailoring_refuses_unknown_fields_and_defaults_outside_their_bounds() -> None:
    with pytest.raises(TypeError, match="'blok_ms' is not a field of ConsumerSettings"):
        ConsumerSettings.tailored("Typo", blok_ms=5)
    with pytest.raises(ValidationError, match="greater than or equal to 1000"):
        ConsumerSettings.tailored("Broken", claim_idle_ms=10, at_least={"claim_idle_ms": 1000})


def test_a_partial_override_keeps_the_components_other_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_KUBE_DISPATCH_BUS__BLOCK_MS", "50")
    monkeypatch.setenv("MERIDIAN_KUBE_DISPATCH_BUS__BACKOFF_S", "[0.1, 1]")
    bus = KubeDispatchSettings().bus
    assert (bus.batch, bus.block_ms, bus.backoff_s) == (64, 50, (0.1, 1.0))
    assert KubeDispatchSettings(bus={"claim_idle_ms": 5000}).bus.batch == 64
    assert TelemetryConsumerSettings(bus={"block_ms": 0}).bus.batch == 5000


def test_the_flat_spellings_still_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_DISPATCH_BLOCK_MS", "50")
    monkeypatch.setenv("MERIDIAN_DISPATCH_BACKOFF_S", "[0.1, 0.2]")
    monkeypatch.setenv("MERIDIAN_TELEMETRY_BATCH_COUNT", "10")
    monkeypatch.setenv("MERIDIAN_TELEMETRY_CLAIM_MIN_IDLE_MS", "0")
    monkeypatch.setenv("MERIDIAN_GLOBAL_BUS__POLL_BLOCK_MS", "25")
    dispatch = DispatchWorkerSettings().bus
    assert (dispatch.block_ms, dispatch.backoff_s, dispatch.batch) == (50, (0.1, 0.2), 256)
    telemetry = TelemetryConsumerSettings().bus
    assert (telemetry.batch, telemetry.claim_idle_ms, telemetry.block_ms) == (10, 0, 1000)
    assert GlobalSchedulerSettings().bus.block_ms == 25
    # keyword arguments too, and the nested spelling wins where both are given
    assert DispatchWorkerSettings(claim_idle_ms=2000).bus.claim_idle_ms == 2000
    monkeypatch.setenv("MERIDIAN_DISPATCH_BUS__BLOCK_MS", "70")
    assert DispatchWorkerSettings().bus.block_ms == 70
    assert GlobalSchedulerSettings(bus={"poll_block_ms": 5}).bus.block_ms == 5


def test_the_producers_spellings_are_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MERIDIAN_AGENT_PUBLISH__BACKOFF_S", "[1, 2]")
    monkeypatch.setenv("MERIDIAN_SUMMARY_BACKOFF_S", "[3]")
    assert AgentSettings().publish.backoff_s == (1.0, 2.0)
    assert SummarySettings().backoff_s == (3.0,)
    with pytest.raises(ValidationError, match="at least 1 item"):
        SummarySettings(backoff_s=())
