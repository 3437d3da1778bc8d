"""The cores this process may use: what "a thread per core" means here.

``os.cpu_count()`` counts the machine's. A process pinned to some of them (taskset, a
Slurm job, a Kubernetes cpuset) or given a CPU quota (``docker --cpus``, a Kubernetes
CPU limit) has fewer, and a thread per machine core there only takes turns, each
thread's share of the quota spent waiting. As Rust's ``available_parallelism`` (the
thread pool of zarrs) and Go's runtime count them: the CPUs the process may run on,
at most its cgroups' CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us``), rounded up.
Parsing is pure; the files are read once, at first use.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import PurePosixPath

__all__ = ["available_cores", "cgroup_dirs", "cores_allowed", "cpu_max_cores", "quota_cores"]

CGROUP_ROOT = "/sys/fs/cgroup"
"""Where the cgroup file systems are mounted (v2 here, v1 one directory a controller)."""


@functools.cache
def available_cores() -> int:
    """The cores this process may use (at least 1), counted once."""
    return cores_allowed(_cpus(), _read_text)


def _cpus() -> int:
    """The CPUs this process may run on (Python 3.13: as ``-X cpu_count`` or
    ``PYTHON_CPU_COUNT`` says, where set); the machine's where the system cannot tell."""
    counted: Callable[[], int | None] | None = getattr(os, "process_cpu_count", None)
    try:
        if counted is not None:
            return counted() or 1
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0)) or 1
    except OSError:  # (a sandbox that refuses to say)
        pass
    return os.cpu_count() or 1


def cores_allowed(cpus: int, read: Callable[[str], str | None], root: str = CGROUP_ROOT) -> int:
    """``cpus`` at most, and at most the tightest quota of the cgroups that
    ``/proc/self/cgroup`` names; ``read(path)`` reads a file's text (None: there is
    none, or it cannot be read)."""
    cgroups = read("/proc/self/cgroup")
    quotas = [_quota(where, read) for where in cgroup_dirs(cgroups or "", root)]
    return max(1, min([cpus, *(q for q in quotas if q is not None)]))


def quota_cores(quota_us: int, period_us: int) -> int | None:
    """The cores a quota of ``quota_us`` each ``period_us`` gives, rounded up (a
    quota of 1.5 cores still runs two threads at once, for part of each period); None:
    no quota (negative, as cgroup v1 says "none")."""
    if quota_us <= 0 or period_us <= 0:
        return None
    return max(1, -(-quota_us // period_us))


def cpu_max_cores(text: str) -> int | None:
    """:func:`quota_cores` of a cgroup v2 ``cpu.max`` ("150000 100000"; "max 100000":
    none); None too for anything else."""
    fields = text.split()
    if len(fields) != 2 or not all(f.isascii() and f.isdigit() for f in fields):
        return None
    return quota_cores(int(fields[0]), int(fields[1]))


def cgroup_dirs(cgroups: str, root: str = CGROUP_ROOT) -> list[tuple[str, str]]:
    """Where the CPU quotas that bind this process lie, from the text of
    ``/proc/self/cgroup``: ``(version, directory)`` of its cgroup and every parent,
    "v2" for the unified hierarchy (``0::/path``), "v1" for the ``cpu`` controller's
    (``N:cpu,cpuacct:/path``). A parent's quota binds its children too."""
    found: list[tuple[str, str]] = []
    for line in cgroups.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if not path.startswith("/"):
            continue
        if number == "0" and controllers == "":
            version, base = "v2", PurePosixPath(root)
        elif "cpu" in controllers.split(","):
            version, base = "v1", PurePosixPath(root) / "cpu"
        else:
            continue
        here = PurePosixPath(path)
        found += [(version, str(base / d.relative_to("/"))) for d in (here, *here.parents)]
    return found


def _quota(where: tuple[str, str], read: Callable[[str], str | None]) -> int | None:
    """The quota in one cgroup directory (None: none, or none readable)."""
    version, directory = where
    if version == "v2":
        return cpu_max_cores(read(f"{directory}/cpu.max") or "")
    quota, period = read(f"{directory}/cpu.cfs_quota_us"), read(f"{directory}/cpu.cfs_period_us")
    try:
        return None if quota is None or period is None else quota_cores(int(quota), int(period))
    except ValueError:
        return None


def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None
