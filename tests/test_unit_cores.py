"""The cores this process may use: CPU affinity, capped by cgroup CPU quotas."""

from __future__ import annotations

import math
import os

import pytest
from hypothesis import given
from hypothesis import strategies as st

from shardstore import cores
from shardstore.cores import available_cores, cgroup_dirs, cores_allowed, cpu_max_cores, quota_cores


@given(st.integers(1, 10**9), st.integers(1, 10**7))
def test_a_quota_gives_its_cores_rounded_up(quota: int, period: int) -> None:
    got = quota_cores(quota, period)
    assert got == max(1, math.ceil(quota / period))
    assert got is not None and got - 1 < max(quota / period, 1) <= got


@pytest.mark.parametrize("quota", [-1, 0])
def test_no_quota_gives_no_cap(quota: int) -> None:
    assert quota_cores(quota, 100000) is None


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("150000 100000\n", 2),
        ("200000 100000", 2),
        ("50000 100000", 1),
        ("max 100000\n", None),
        ("", None),
        ("\u00b2 100000", None),  # (a digit to str.isdigit, none to int)
        (f"{10**400} 100000", 10**395),  # (too big for a float)
    ],
)
def test_cgroup_v2_cpu_max(text: str, want: int | None) -> None:
    assert cpu_max_cores(text) == want


def test_the_cgroups_that_bind_a_process_are_its_own_and_every_parent() -> None:
    text = "12:memory:/m\n4:cpu,cpuacct:/kube/pod1\n1:name=systemd:/s\n0::/user.slice/job\n"
    assert cgroup_dirs(text, "/cg") == [
        ("v1", "/cg/cpu/kube/pod1"),
        ("v1", "/cg/cpu/kube"),
        ("v1", "/cg/cpu"),
        ("v2", "/cg/user.slice/job"),
        ("v2", "/cg/user.slice"),
        ("v2", "/cg"),
    ]
    assert cgroup_dirs("0::/\n", "/cg") == [("v2", "/cg")]  # (a container's own namespace)


def test_the_count_is_the_cpus_allowed_capped_by_the_tightest_quota() -> None:
    files = {
        "/proc/self/cgroup": "0::/job\n3:cpu:/slot\n",
        "/cg/cpu.max": "max 100000\n",
        "/cg/job/cpu.max": "300000 100000\n",  # 3 cores for the job
        "/cg/cpu/slot/cpu.cfs_quota_us": "250000\n",  # 2.5: 3
        "/cg/cpu/slot/cpu.cfs_period_us": "100000\n",
        "/cg/cpu/cpu.cfs_quota_us": "-1\n",  # (v1: none)
        "/cg/cpu/cpu.cfs_period_us": "100000\n",
    }
    assert cores_allowed(8, files.get, "/cg") == 3
    assert cores_allowed(2, files.get, "/cg") == 2  # (pinned to fewer than the quotas give)
    assert cores_allowed(8, {**files, "/cg/job/cpu.max": "200000 100000"}.get, "/cg") == 2
    assert cores_allowed(8, {**files, "/cg/job/cpu.max": "max 100000"}.get, "/cg") == 3
    assert cores_allowed(8, {"/proc/self/cgroup": "0::/job\n"}.get, "/cg") == 8  # no quota files
    assert cores_allowed(8, {}.get, "/cg") == 8  # (not Linux)
    assert cores_allowed(8, {**files, "/cg/cpu/slot/cpu.cfs_quota_us": "junk"}.get, "/cg") == 3


def test_this_process_has_at_least_one_core_and_no_more_than_it_may_run_on() -> None:
    allowed = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert 1 <= available_cores() <= (allowed or 1)


def test_a_system_that_will_not_say_its_cpus_counts_the_machines(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object) -> int:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(os, "process_cpu_count", refuse, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", refuse, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 5)
    assert cores._cpus() == 5


@pytest.mark.skipif(not hasattr(os, "process_cpu_count"), reason="Python 3.13's override of the count")
def test_pythons_own_cpu_count_override_is_heard(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "process_cpu_count", lambda: 1)  # (as with PYTHON_CPU_COUNT=1)
    assert cores._cpus() == 1
