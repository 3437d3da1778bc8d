"""Exceptions raised by shardstore.

Every failure a user can cause is a :class:`ShardStoreError` whose message names
the key or array involved and what is wrong, so that a traceback from deep inside
zarr still tells which object to look at.
"""

from __future__ import annotations

__all__ = [
    "BatchCommitError",
    "ChunkDecodeError",
    "ChunkKeyError",
    "ConcurrentWriterWarning",
    "InnerStoreError",
    "InvalidKeyError",
    "InvalidOffsetError",
    "PartialShardWriteError",
    "PipelineChoiceWarning",
    "ReadOnlyError",
    "ShardConflictError",
    "ShardFormatError",
    "ShardStoreError",
    "ShardingConfigError",
    "ShardingPassthroughWarning",
    "StaleArrayError",
    "StrategyFallbackWarning",
    "SyncCallError",
    "UnshardedArrayWarning",
]


class ShardStoreError(Exception):
    """Base class of every error shardstore raises on purpose."""


class ShardingConfigError(ShardStoreError, ValueError):
    """A sharding configuration is invalid (given by the user or found in metadata)."""


class ShardFormatError(ShardStoreError, ValueError):
    """A shard object is corrupt or truncated: its index cannot be trusted, or (a
    :class:`ChunkDecodeError`) a chunk it locates does not decode."""


class ChunkDecodeError(ShardFormatError):
    """A chunk's stored bytes do not decode through its array's codecs (bytes altered
    in place, or written by another codec chain), though the shard's index that
    locates them is sound (or the chunk is an object of its own, in an unsharded
    array). It names the chunk; the codecs' own error is its ``__cause__``."""


class ChunkKeyError(ShardStoreError, KeyError):
    """A chunk key that is malformed or outside its array's chunk grid."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class InvalidKeyError(ShardStoreError, ValueError):
    """A key that could escape the store's root (``..`` segments, leading ``/``)."""


class InvalidOffsetError(ShardStoreError, ValueError):
    """A partial write (``set_partial_values``) at an offset no value has: negative,
    or not an integer."""


class ReadOnlyError(ShardStoreError, ValueError):
    """A write to a store opened read-only."""


class InnerStoreError(ShardStoreError, OSError):
    """The wrapped store failed; the original exception is the ``__cause__``."""


class ShardConflictError(ShardStoreError):
    """Other writers changed a shard during every attempt to commit an update to it
    (``write_attempts`` conditional writes failed; the update was not applied), or
    to read chunks of it by ranges located through its index."""


class PartialShardWriteError(ShardStoreError):
    """A write through a store whose writes are merged with other writers' object
    by object, later (a forked Icechunk session, merged with ``Session.merge``),
    that would change part of a shard and keep the rest as read: the merge could
    then replace another writer's chunks of that shard with the old ones. Refused
    before anything is written; such writes must replace whole shards."""


class StaleArrayError(ShardStoreError):
    """A write through array metadata that another process has replaced since this
    store read it, in a way that moves the array's chunks (a resize that renumbered
    a neuroglancer-format array): the write was not made. Whole-chunk writes and
    deletes re-route themselves; a byte-range write says this. Re-open the array."""


class SyncCallError(ShardStoreError, RuntimeError):
    """A synchronous store call (``get_sync``, ``set_sync``, ...) that cannot be
    served: made inside a running event loop, it would wait for work queued on
    that same loop, which is blocked until the call returns."""


class BatchCommitError(ShardStoreError):
    """Some shards buffered in a ``store.batch()`` could not be committed.

    ``message`` names them; ``failed`` maps each such shard key to its error; every
    other shard of the batch was committed. The first error is the ``__cause__``.
    """

    def __init__(self, message: str, failed: dict[str, BaseException]) -> None:
        super().__init__(message)
        self.failed = failed

    def __reduce__(self) -> tuple[type[BatchCommitError], tuple[str, dict[str, BaseException]]]:
        """Pickled whole, so that it crosses from a worker process to its caller."""
        return type(self), (str(self), self.failed)


class StrategyFallbackWarning(UserWarning):
    """``write_strategy="append"`` on an inner store that cannot append (anything
    but local files): its shards are rewritten whole instead."""


class PipelineChoiceWarning(UserWarning):
    """Arrays on a ShardingStore are served by another codec pipeline than
    shardstore's, the one zarr's ``codec_pipeline.path`` names: one chunk at a time,
    several times slower. Said once per process, naming the two settings that keep
    that pipeline for every other array."""


class UnshardedArrayWarning(UserWarning):
    """A new array stays unsharded although the store was given ``chunks_per_shard``:
    a sequence of another rank than the array's (once per rank and store)."""


class ShardingPassthroughWarning(UserWarning):
    """An array the user asked to shard by path is passed through as it is: it uses
    a sharding codec whose inner chunks shardstore cannot serve (the message says why)."""


class ConcurrentWriterWarning(UserWarning):
    """Another process wrote a shard between our read and our write on a store that
    offers no conditional writes: the update is retried, but such stores are for
    one writer per shard (the message names the shard)."""
