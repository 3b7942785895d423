"""procfs and cgroup v2 usage on fake trees."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_agent.collectors.usage import CgroupUsage, ProcUsage

MEMINFO = "MemTotal:       16000000 kB\nMemFree:         1000000 kB\nMemAvailable:    6000000 kB\n"


def _stat(root: Path, user: int, idle: int, iowait: int = 0, cpus: int = 4) -> None:
    # cpu user nice system idle iowait irq softirq steal guest guest_nice
    lines = [f"cpu  {user} 0 0 {idle} {iowait} 0 0 0 0 0"]
    lines += [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(cpus)]
    lines += ["intr 0", "ctxt 0"]
    (root / "stat").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize(
    ("busy_delta", "idle_delta", "iowait_delta", "expect_util"),
    [
        pytest.param(100, 300, 0, 0.25, id="quarter-busy"),
        pytest.param(0, 400, 0, 0.0, id="idle"),
        pytest.param(200, 100, 100, 0.5, id="iowait-counts-as-idle"),
    ],
)
def test_procfs_cpu_and_memory(tmp_path: Path, busy_delta: int, idle_delta: int, iowait_delta: int,
                               expect_util: float) -> None:
    (tmp_path / "meminfo").write_text(MEMINFO)
    _stat(tmp_path, 1000, 5000, 100)
    usage = ProcUsage(tmp_path)
    first = usage.read()
    assert first.used_milli_cpu is None
    assert first.used_memory_bytes == (16_000_000 - 6_000_000) * 1024
    _stat(tmp_path, 1000 + busy_delta, 5000 + idle_delta, 100 + iowait_delta)
    second = usage.read()
    assert second.cpu_utilisation == pytest.approx(expect_util)
    assert second.used_milli_cpu == pytest.approx(expect_util * 4 * 1000)  # 4 CPUs


def test_procfs_missing_files_give_no_numbers(tmp_path: Path) -> None:
    sample = ProcUsage(tmp_path).read()
    assert (sample.used_milli_cpu, sample.used_memory_bytes) == (None, None)


@pytest.mark.parametrize("slice_name", [pytest.param("kubepods.slice", id="systemd"),
                                        pytest.param("kubepods", id="cgroupfs")])
def test_cgroup_v2_kubepods(tmp_path: Path, slice_name: str) -> None:
    pods = tmp_path / slice_name
    pods.mkdir()
    (pods / "cpu.stat").write_text("usage_usec 1000000\nuser_usec 800000\nsystem_usec 200000\n")
    (pods / "memory.current").write_text("2147483648\n")
    usage = CgroupUsage(tmp_path)
    assert usage.available
    assert usage.read(10.0).used_milli_cpu is None
    (pods / "cpu.stat").write_text("usage_usec 4000000\n")  # 3 CPU-seconds in 2 s → 1500 milli-CPU
    sample = usage.read(12.0)
    assert sample.used_milli_cpu == pytest.approx(1500.0)
    assert sample.used_memory_bytes == 2 * 2**30


def test_cgroup_without_kubepods(tmp_path: Path) -> None:
    usage = CgroupUsage(tmp_path)
    assert not usage.available
    assert usage.read(0.0).used_memory_bytes is None
