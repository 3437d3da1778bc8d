"""Key grammar: which keys are chunk keys, and how chunks map into shards.

Pure functions over strings and numpy arrays; the store decides what to do
with the answers. A chunk key is the array's path, ``/``, then the array's
chunk key encoding of the chunk's grid coordinates; its shard key is the same
encoding of the coordinates floor-divided by ``chunks_per_shard``.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest

from shardstore.errors import InvalidKeyError, InvalidOffsetError

__all__ = [
    "INTEGER",
    "ChunkKeyGrammar",
    "candidate_array_paths",
    "check_byte_range",
    "check_key",
    "checked_offset",
    "join_path",
    "split_key",
]

INTEGER = re.compile(r"0|[1-9][0-9]*")
"""A canonical non-negative integer, as chunk key encodings spell coordinates."""
_INTS = {sep: re.compile(rf"(?:0|[1-9][0-9]*)(?:{re.escape(sep)}(?:0|[1-9][0-9]*))*") for sep in "/."}
"""Canonical integers joined by each separator: a whole tail checked in one match."""
_DIGITS_OR_NEWLINES = re.compile(r"[0-9\n]*")
_POWERS_OF_TEN = 10 ** np.arange(1, 19, dtype=np.int64)
"""Where a non-negative int64 gains a digit: ``searchsorted`` counts its digits less one."""
_DOTTED = re.compile(r"(?:c|0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*")
_DRAFT_FIRST = re.compile(r"c(?:0|[1-9][0-9]*)(?:\.(?:0|[1-9][0-9]*))*")

Separator = Literal["/", "."]


def check_key(key: str) -> None:
    """Reject keys that could escape the root of a file-system store."""
    if key.startswith("/") or ".." in key.split("/"):
        raise InvalidKeyError(f"invalid key {key!r}: keys may not start with '/' or contain '..'")


def check_byte_range(byte_range: Any) -> None:
    """Reject what is not one of zarr's byte requests (as zarr's own stores do)."""
    if byte_range is not None and not isinstance(
        byte_range, RangeByteRequest | OffsetByteRequest | SuffixByteRequest
    ):
        raise TypeError(f"Unexpected byte_range, got {byte_range}")


def checked_offset(key: str, start: Any) -> int:
    """The offset of a partial write into ``key``, as an int: a negative one, or one that
    is not an integer, would splice the bytes somewhere no one asked for."""
    try:
        offset = operator.index(start)
    except TypeError:
        offset = -1
    if offset < 0:
        raise InvalidOffsetError(
            f"partial write into {key!r} at offset {start!r}: offsets are integers from 0"
        )
    return offset


def split_key(key: str) -> tuple[str, str]:
    """``(path, name)`` of a key: ``"a/b/zarr.json"`` -> ``("a/b", "zarr.json")``."""
    path, _, name = key.rpartition("/")
    return path, name


def join_path(path: str, name: str) -> str:
    """``path/name``, where the root path is ``""``."""
    return f"{path}/{name}" if path else name


@dataclass(frozen=True)
class ChunkKeyGrammar:
    """One array's chunk key encoding, relative to the array's directory.

    ``default`` is zarr v3's ``c/1/2`` (or ``c.1.2``; ``c`` for 0-d) and ``v2``
    is zarr v2's ``1.2`` (or ``1/2``; ``0`` for 0-d), used by v2 arrays and by
    v3 arrays with the ``v2`` chunk key encoding. ``draft`` is the pre-release
    v3 draft's ``c1/2`` (zarr-python 2.x's experimental v3 arrays, under
    ``data/root/``).
    """

    kind: Literal["default", "v2", "draft"]
    separator: Separator

    def encode(self, coords: tuple[int, ...] | list[int]) -> str:
        body = self.separator.join(map(str, coords))
        if self.kind == "default":
            return f"c{self.separator}{body}" if body else "c"
        if self.kind == "draft":
            return f"c{body}"
        return body or "0"

    def decode(self, tail: str) -> tuple[int, ...] | None:
        """Coordinates of any rank if ``tail`` is written in this encoding, else None.

        ``v2``'s ``0`` reads as ``(0,)``: only the array's rank tells it from the
        0-d key, see :meth:`decode_rank`.
        """
        if self.kind != "v2":
            if tail == "c":
                return ()
            lead = "c" + (self.separator if self.kind == "default" else "")
            if not tail.startswith(lead):
                return None
            tail = tail[len(lead) :]
        if _INTS[self.separator].fullmatch(tail) is None:
            return None
        return tuple(map(int, tail.split(self.separator)))

    def decode_rank(self, tail: str, ndim: int) -> tuple[int, ...] | None:
        coords = self.decode(tail)
        if ndim == 0 and self.kind == "v2":
            return () if coords == (0,) else None
        return coords if coords is not None and len(coords) == ndim else None

    def decode_many(self, keys: Sequence[str], prefix: str, ndim: int) -> npt.NDArray[np.int64] | None:
        """Coordinates (one row per key) of many chunk keys of one array whose keys start
        with ``prefix`` (its path and ``/``), decoded at once; None unless every key is
        this encoding's canonical key of rank ``ndim`` (the caller then decodes them
        one by one). A key zarr makes costs a fraction of a microsecond here, where
        decoding it alone costs several."""
        lead = prefix + self.common_prefix(ndim)
        if ndim == 0 or not keys:
            return None
        body = "\n".join(keys)
        if not body.startswith(lead) or body.count("\n" + lead) != len(keys) - 1:
            return None  # (a key that does not start with the lead leaves one fewer)
        numbers = body.replace("\n" + lead, "\n")[len(lead) :].replace(self.separator, "\n")
        if (
            _DIGITS_OR_NEWLINES.fullmatch(numbers) is None
            or "\n\n" in numbers
            or numbers.startswith("\n")
            or numbers.endswith("\n")
        ):
            return None
        flat = np.fromstring(numbers, dtype=np.int64, sep="\n")  # digits only: parses whole
        if flat.size != len(keys) * ndim:
            return None
        coords = flat.reshape(len(keys), ndim)
        # Canonical keys only (no leading zeros), each with exactly ``ndim`` numbers: a
        # key's length is the lead, its numbers' digits and the separators between them.
        digits = np.searchsorted(_POWERS_OF_TEN, coords, side="right") + 1
        # (each key's length from where the newlines are, a code point a 4-byte number:
        # a quarter of the time of len() a key; a key holding a newline makes one more)
        points = np.frombuffer(body.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        bounds = np.concatenate(([-1], np.flatnonzero(points == ord("\n")), [len(body)]))
        lengths = bounds[1:] - bounds[:-1] - 1
        if not np.array_equal(lengths, len(lead) + digits.sum(axis=1) + (ndim - 1)):
            return None
        return coords

    def common_prefix(self, ndim: int) -> str:
        """The prefix every chunk key of an array of that rank starts with."""
        if self.kind == "default":
            return "c" + self.separator if ndim else "c"
        if self.kind == "draft":
            return "c"
        return "" if ndim else "0"


def candidate_array_paths(key: str) -> list[str]:
    """Array paths under which ``key`` would be a chunk key in some encoding.

    Found from the key's shape alone (trailing integer segments, a ``c``
    segment, a dotted last segment); the store confirms with metadata. Most
    likely first: the ``default`` encoding's ``.../c/...`` form.
    """
    segs = key.split("/")
    n = len(segs)
    j = n
    while j > 0 and INTEGER.fullmatch(segs[j - 1]):
        j -= 1
    cuts: list[int] = []
    if j > 0 and segs[j - 1] == "c":
        cuts.append(j - 1)
    if _DOTTED.fullmatch(segs[-1]):
        cuts.append(n - 1)
    if j > 0 and _DRAFT_FIRST.fullmatch(segs[j - 1]):  # the v3 draft's c1/2 (or c1.2)
        cuts.append(j - 1)
    elif _DRAFT_FIRST.fullmatch(segs[-1]):
        cuts.append(n - 1)
    cuts.extend(range(j, n))
    seen: dict[str, None] = {}
    for cut in cuts:
        seen.setdefault("/".join(segs[:cut]), None)
    return list(seen)
