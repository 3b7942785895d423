"""Grid trace loaders: synthetic files with each format's quirks, then the shared traces."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from meridian import grid_data

EM_HEADER = ("Datetime (UTC),Country,Zone Name,Zone Id,Carbon Intensity gCO\u2082eq/kWh (direct),"
             "Carbon Intensity gCO\u2082eq/kWh (LCA),Low Carbon Percentage,Renewable Percentage,Data Source,"
             "Data Estimated,Data Estimation Method")


def _write(path: Path, lines: list[str], newline: str = "\n") -> Path:
    path.write_bytes(newline.join(lines).encode("utf-8") + newline.encode())
    return path


@pytest.mark.parametrize(("column", "expected"), [
    pytest.param("direct", [10.0, 20.0, 20.0, 40.0], id="direct-with-gap-filled"),
    pytest.param("lca", [11.0, 21.0, 21.0, 41.0], id="lca"),
])
def test_electricitymaps_crlf_non_ascii_header(tmp_path: Path, column: str, expected: list[float]) -> None:
    path = _write(tmp_path / "XX_2022_hourly.csv", [
        EM_HEADER,
        "2022-01-01 00:00:00,X,X,XX,10,11,0,0,s,false,",
        "2022-01-01 01:00:00,X,X,XX,20,21,0,0,s,false,",
        # 02:00 is missing: carried forward from 01:00
        "2022-01-01 03:00:00,X,X,XX,40,41,0,0,s,true,EST",
    ], newline="\r\n")
    s = grid_data.load_electricitymaps(path, column=column)
    assert s.zone == "XX"
    assert s.values.tolist() == expected
    assert s.filled_hours == 1
    assert s.at(datetime(2022, 1, 1, 3, 30, tzinfo=UTC)) == expected[3]


def test_lets_wait_awhile_resampled_to_hourly_mean(tmp_path: Path) -> None:
    path = _write(tmp_path / "ger_ci.csv", [
        "Time,Carbon Intensity",
        "2020-01-01 00:00:00,100", "2020-01-01 00:15:00,200", "2020-01-01 00:30:00,300", "2020-01-01 00:45:00,400",
        "2020-01-01 01:00:00,10", "2020-01-01 01:30:00,30",
    ])
    s = grid_data.load_lets_wait_awhile(path)
    # hour 0: (100+200+300+400)/4 = 250; hour 1: (10+30)/2 = 20
    assert s.zone == "DE"
    assert s.values.tolist() == [250.0, 20.0]


def test_entsoe_prices_cet_to_utc(tmp_path: Path) -> None:
    path = _write(tmp_path / "prices.csv", [
        ",date,country,area,mtu,price(eur/mwh)",
        "0,01.12.2022,Albania,BZN AL,00:00 - 01:00,",
        "1,01.12.2022,France,BZN FR,00:00 - 01:00,100.5",
        "2,01.12.2022,France,BZN FR,01:00 - 02:00,90",
        "3,01.12.2022,Germany,BZN DE-LU,00:00 - 01:00,50",
        "4,01.12.2022,Luxembourg,BZN DE-LU,00:00 - 01:00,51",
    ])
    prices = grid_data.load_entsoe_prices(path)
    assert sorted(prices) == ["DE-LU", "FR"]
    # 00:00 CET on 1 Dec is 23:00 UTC on 30 Nov.
    assert prices["FR"].hours[0] == np.datetime64("2022-11-30T23", "h")
    assert prices["FR"].values.tolist() == [100.5, 90.0]
    assert prices["DE-LU"].values.tolist() == [50.0]


@pytest.mark.parametrize("bad", [
    pytest.param("Foo,Bar\n1,2\n", id="unknown-header"),
    pytest.param("Time,Carbon Intensity\nnot-a-time,3\n", id="bad-timestamp"),
    pytest.param("Time,Carbon Intensity\n2020-01-01 00:00:00,abc\n", id="bad-value"),
])
def test_bad_files_name_the_problem(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "x_ci.csv"
    path.write_text(bad)
    with pytest.raises(grid_data.GridDataError, match=r"x_ci\.csv"):
        grid_data.load_lets_wait_awhile(path)


def test_shared_traces(traces_dir: Path) -> None:
    carbon = grid_data.load_carbon_dir(traces_dir / "carbon")
    assert {"BR", "NO", "US-CAL-CISO", "DE", "GB", "FR"} <= set(carbon)
    no = carbon["NO"]
    assert len(no) == 3 * 8760 and no.filled_hours == 0
    assert 5 < no.values.mean() < 15
    assert 300 < carbon["DE"].values.mean() < 330
    prices = grid_data.load_entsoe_prices(next((traces_dir / "prices").glob("*.csv")))
    assert len(prices["NO1"]) == 240
    window = no.window(datetime(2022, 12, 1, tzinfo=UTC), 24)
    assert len(window) == 24 and window.hours[0] == np.datetime64("2022-12-01T00", "h")
