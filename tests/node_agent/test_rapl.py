"""RAPL powercap reading on a fake tree: wrap-around, unreadable zones, zones that must not count."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.collectors.rapl import RaplReader

MAX_RANGE_UJ = 262_143_328_850  # a real Skylake package's max_energy_range_uj


def _zone(root: Path, name: str, energy_uj: int | None, *, label: str = "package-0",
          max_range_uj: int | None = MAX_RANGE_UJ) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    if energy_uj is not None:
        (zone / "energy_uj").write_text(f"{energy_uj}\n")
    if max_range_uj is not None:
        (zone / "max_energy_range_uj").write_text(f"{max_range_uj}\n")
    return zone


def _set(zone: Path, energy_uj: int) -> None:
    (zone / "energy_uj").write_text(f"{energy_uj}\n")


@pytest.mark.parametrize(
    ("first_uj", "second_uj", "max_range_uj", "expect_joules", "expect_wraps"),
    [
        # 100 J over 2 s → 50 W
        pytest.param(1_000_000, 101_000_000, MAX_RANGE_UJ, 100.0, 0, id="increasing"),
        # wrap: (range − first) + second = 30 J + 70 J = 100 J
        pytest.param(MAX_RANGE_UJ - 30_000_000, 70_000_000, MAX_RANGE_UJ, 100.0, 1, id="wrap-around"),
        # no max range known: a decrease is a reset, the new value is the energy since it
        pytest.param(500_000_000, 40_000_000, None, 40.0, 0, id="reset-without-range"),
        pytest.param(5_000_000, 5_000_000, MAX_RANGE_UJ, 0.0, 0, id="idle-counter"),
    ],
)
def test_energy_delta_and_power(tmp_path: Path, first_uj: int, second_uj: int, max_range_uj: int | None,
                                expect_joules: float, expect_wraps: int) -> None:
    zone = _zone(tmp_path, "intel-rapl:0", first_uj, max_range_uj=max_range_uj)
    reader = RaplReader(tmp_path)
    first = reader.read(100.0)
    assert first is not None and first.power_watts is None and first.energy_joules == 0.0
    _set(zone, second_uj)
    second = reader.read(102.0)
    assert second is not None
    assert second.energy_joules == pytest.approx(expect_joules)
    assert second.power_watts == pytest.approx(expect_joules / 2.0)
    assert reader.wraps == expect_wraps


def test_packages_are_summed_but_subzones_and_psys_are_not(tmp_path: Path) -> None:
    p0 = _zone(tmp_path, "intel-rapl:0", 0)
    p1 = _zone(tmp_path, "intel-rapl:1", 0, label="package-1")
    core = _zone(tmp_path, "intel-rapl:0:0", 0, label="core")
    psys = _zone(tmp_path, "intel-rapl:2", 0, label="psys")
    reader = RaplReader(tmp_path)
    assert [z.path.name for z in reader.zones] == ["intel-rapl:0", "intel-rapl:1"]
    reader.read(0.0)
    _set(p0, 10_000_000)  # 10 J
    _set(p1, 20_000_000)  # 20 J
    _set(core, 999_000_000)  # inside package 0: must not count
    _set(psys, 999_000_000)  # the whole platform: must not count
    sample = reader.read(1.0)
    assert sample is not None
    assert sample.energy_joules == pytest.approx(30.0)
    assert sample.power_watts == pytest.approx(30.0)


def test_unreadable_zone_is_skipped_and_counted(tmp_path: Path) -> None:
    good = _zone(tmp_path, "intel-rapl:0", 0)
    bad = _zone(tmp_path, "intel-rapl:1", 0, label="package-1")
    reader = RaplReader(tmp_path)
    reader.read(0.0)
    # Root reads any file whatever its mode, so make the counter unreadable by turning it into a
    # directory (EISDIR), the same OSError path as EACCES on a non-root agent.
    (bad / "energy_uj").unlink()
    (bad / "energy_uj").mkdir()
    _set(good, 4_000_000)
    sample = reader.read(2.0)
    assert sample is not None and sample.zones == 1
    assert sample.power_watts == pytest.approx(2.0)
    assert reader.unreadable_zones == 1


@pytest.mark.parametrize(
    "content",
    [pytest.param("not-a-number\n", id="garbage"), pytest.param("", id="empty")],
)
def test_no_readable_zone_means_no_sample(tmp_path: Path, content: str) -> None:
    zone = _zone(tmp_path, "intel-rapl:0", 0)
    reader = RaplReader(tmp_path)
    (zone / "energy_uj").write_text(content)
    assert reader.read(1.0) is None
    assert reader.unreadable_zones == 1


@pytest.mark.parametrize(
    "layout",
    [pytest.param("missing-root", id="no-powercap"), pytest.param("no-rapl", id="powercap-without-rapl")],
)
def test_absent_rapl_is_unavailable(tmp_path: Path, layout: str) -> None:
    root = tmp_path / "powercap"
    if layout == "no-rapl":
        (root / "dtpm").mkdir(parents=True)
    reader = RaplReader(root)
    assert not reader.available
    assert reader.read(0.0) is None
