"""The file system a local path lies on, by the mount table: the last of the longest
mount points above it (whole path components), escapes decoded."""

from __future__ import annotations

import pytest

from shardstore.inner.mounts import LOCAL_DISKS, file_system_of

MOUNTS = """\
/dev/vda / ext4 rw,relatime 0 0
proc /proc proc rw,nosuid 0 0
server:/export /data nfs4 rw,vers=4.2 0 0
/dev/vdb /data/scratch xfs rw 0 0
lustre@tcp:/fs /lustre lustre rw 0 0
/dev/vdc /mnt/my\\040disk ext4 rw 0 0
tmpfs /run tmpfs rw 0 0
server:/other /run nfs rw 0 0
overlay /var/lib/docker/overlay2/x/merged overlay rw 0 0
"""


@pytest.mark.parametrize(
    "path, kind",
    [
        ("/home/me/a.zarr", "ext4"),
        ("/", "ext4"),
        ("/data", "nfs4"),
        ("/data/a.zarr/c/0", "nfs4"),
        ("/database/a.zarr", "ext4"),  # (not under /data: a whole component must match)
        ("/data/scratch/a.zarr", "xfs"),  # a local disk mounted inside a network one
        ("/lustre/project/a.zarr", "lustre"),
        ("/mnt/my disk/a.zarr", "ext4"),  # (the table escapes the space)
        ("/run/a", "nfs"),  # mounted over the same point later: the later one
        ("/var/lib/docker/overlay2/x/merged/a", "overlay"),
    ],
)
def test_the_file_system_of_a_path_is_the_innermost_mount_above_it(path: str, kind: str) -> None:
    assert file_system_of(path, MOUNTS) == kind


def test_a_path_no_mount_is_above_has_none() -> None:
    assert file_system_of("/a", "") is None
    assert file_system_of("/a", "garbage\n/dev/x /b ext4 rw 0 0\n") is None


def test_network_and_cluster_file_systems_are_no_local_disks() -> None:
    assert {"nfs", "nfs4", "lustre", "gpfs", "cifs", "fuse.sshfs", "tmpfs", "proc"}.isdisjoint(LOCAL_DISKS)
    assert {"ext4", "xfs", "overlay"} <= LOCAL_DISKS
