"""Neuroglancer precomputed data, a wing on top of the store: its sharded directories
as key-value stores of chunk ids, its volumes, and its tools.

- ``store``: :class:`PrecomputedShardedStore`, a directory of shard files as a
  ``MutableMapping[int, bytes]``, read and written through the store's own read
  path and shard updates;
- ``volume``: :class:`PrecomputedVolume` and :class:`PrecomputedScale`, volumes
  (an ``info`` file and its scales);
- ``tools``: ``info``, ``ls``, ``verify`` and the leftovers of precomputed data,
  for the command line.

May import everything below the store (formats, inner stores, reading, writing,
maintenance's common pieces); nothing below imports this package.
"""
