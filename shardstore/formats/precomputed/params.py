"""The parameters of the neuroglancer precomputed sharded format: what the id math
(``ids``) and the shard file layout (``shard_file``) read of a ``sharding`` object.
Pure data; the checked ``sharding`` object, a ShardFormat, is ``sharding``'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = ["Encoding", "HashName", "ShardingParams"]

HashName = Literal["identity", "murmurhash3_x86_128"]
Encoding = Literal["raw", "gzip"]


@dataclass(frozen=True)
class ShardingParams:
    """How chunk ids map to shards and minishards, and how a shard file encodes them."""

    preshift_bits: int
    hash: HashName
    minishard_bits: int
    shard_bits: int
    minishard_index_encoding: Encoding = "raw"
    data_encoding: Encoding = "raw"

    @property
    def shard_index_nbytes(self) -> int:
        return 16 << self.minishard_bits

    @property
    def num_minishards(self) -> int:
        return 1 << self.minishard_bits

    @property
    def num_shards(self) -> int:
        return 1 << self.shard_bits
