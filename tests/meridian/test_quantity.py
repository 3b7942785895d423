from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meridian import quantity
from meridian.model import Pod, Resources
from meridian.quantity import QuantityError


@pytest.mark.parametrize(
    ("text", "milli"),
    [
        pytest.param("100m", 100, id="millicores"),
        pytest.param("1.5", 1500, id="decimal"),
        pytest.param("1e3", 1_000_000, id="exponent"),
        pytest.param("1k", 1_000_000, id="kilo"),
        pytest.param("0.1", 100, id="tenth"),
        pytest.param("0.0001", 1, id="rounds-up-like-kubernetes"),
        pytest.param(2, 2000, id="int"),
    ],
)
def test_to_milli(text: str, milli: int) -> None:
    assert quantity.to_milli(text) == milli


@pytest.mark.parametrize(
    ("text", "n_bytes"),
    [
        pytest.param("2Gi", 2 * 2**30, id="gibi"),
        pytest.param("500Mi", 500 * 2**20, id="mebi"),
        pytest.param("1k", 1000, id="kilo-decimal"),
        pytest.param("1e3", 1000, id="exponent"),
        pytest.param("128974848", 128974848, id="plain"),
        pytest.param("129e6", 129_000_000, id="exponent-mega"),
        pytest.param("123Mi", 128974848, id="k8s-docs-example"),
    ],
)
def test_to_int(text: str, n_bytes: int) -> None:
    assert quantity.to_int(text) == n_bytes


@pytest.mark.parametrize(
    "bad",
    [
        pytest.param("12Qi", id="unknown-suffix"),
        pytest.param("-1", id="negative"),
        pytest.param("NaN", id="nan"),
        pytest.param(float("nan"), id="float-nan"),
        pytest.param("1..2", id="two-dots"),
        pytest.param("", id="empty"),
        pytest.param("   ", id="blank"),
        pytest.param("inf", id="infinite"),
        pytest.param("1e400", id="absurdly-large"),
        pytest.param("99999Ei", id="beyond-max"),
        pytest.param(True, id="boolean"),
        pytest.param("1 Gi", id="inner-space"),
    ],
)
def test_bad_quantities_raise_one_error_naming_field_and_value(bad: object) -> None:
    with pytest.raises(QuantityError) as err:
        quantity.parse(bad, field="requests.memory")  # type: ignore[arg-type]
    assert err.value.field == "requests.memory"
    assert "requests.memory" in str(err.value)
    assert repr(bad) in str(err.value)


def test_bad_quantity_in_a_pod_names_the_field() -> None:
    with pytest.raises(Exception) as err:
        Pod(name="p", requests=Resources(milli_cpu="1", memory_bytes="12Qi"))
    assert "memory_bytes" in str(err.value)
    assert "12Qi" in str(err.value)


@given(st.integers(min_value=0, max_value=2**62))
def test_bytes_round_trip(n: int) -> None:
    assert quantity.to_int(quantity.format_bytes(n)) == n


@given(st.integers(min_value=0, max_value=10**15))
def test_milli_round_trip(n: int) -> None:
    assert quantity.to_milli(quantity.format_milli(n)) == n


@given(st.decimals(min_value=0, max_value=10**9, places=3, allow_nan=False, allow_infinity=False))
def test_decimal_strings_parse_exactly(d: Decimal) -> None:
    assert quantity.parse(str(d)) == d
