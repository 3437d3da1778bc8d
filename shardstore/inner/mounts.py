"""Which file system a local path lies on, from the mount table (Linux's
``/proc/self/mounts``): local reads may be made on the calling thread only on a
local disk, where opening a file never waits on a server (NFS, Lustre, GPFS,
FUSE: an open there can take a round trip, or hang with its server)."""

from __future__ import annotations

import functools
import re

__all__ = ["LOCAL_DISKS", "file_system_of", "on_local_disk"]

LOCAL_DISKS = frozenset({"ext2", "ext3", "ext4", "xfs", "btrfs", "f2fs", "bcachefs", "jfs", "zfs", "overlay"})
"""File systems on a disk of this machine (``overlay``: a container's, over one)."""

_ESCAPE = re.compile(r"\\([0-7]{3})")


def file_system_of(path: str, mounts: str) -> str | None:
    """The type of the file system the absolute ``path`` lies on, by the mount table
    ``mounts`` (the text of ``/proc/self/mounts``: the last of the longest mount
    points above it); None if none is."""
    found: tuple[int, str] | None = None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields[1])
        above = path == point or path.startswith(point.rstrip("/") + "/")
        if above and (found is None or len(point) >= found[0]):
            found = (len(point), fields[2])
    return None if found is None else found[1]


@functools.lru_cache(maxsize=256)
def on_local_disk(path: str) -> bool:
    """Whether the absolute ``path`` lies on one of LOCAL_DISKS (False where the mount
    table cannot be read)."""
    try:
        with open("/proc/self/mounts") as table:
            mounts = table.read()
    except OSError:
        return False
    return file_system_of(path, mounts) in LOCAL_DISKS
