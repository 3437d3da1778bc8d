"""What the formats share in judging a shard: the bound past which an offset is
damage, and how a problem names its first few items."""

from __future__ import annotations

__all__ = ["IMPOSSIBLE", "SHOWN", "listed"]

IMPOSSIBLE = 2**53
"""No real shard reaches 8 PiB (S3 objects stop at 5 TiB): an offset or size beyond
is damage, refused before any range is requested or any sum can overflow (tensorstore
refuses offsets that do not fit an int64)."""
SHOWN = 4
"""Items named per problem; the rest are counted."""


def listed(shown: list[str], total: int) -> str:
    """The first few of ``total`` findings, and how many more."""
    return ", ".join(shown[:SHOWN]) + (f" and {total - SHOWN} more" if total > SHOWN else "")
