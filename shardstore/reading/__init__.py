"""The read path: chunk bytes from cached shards, whole-shard fetches, or ranges
located by the parts of shard indices (``indices``: one cache of index parts for
every format, asked of the shard's format; for a read of many chunks, a shard at
a time: ``spans``); concurrent ``get()``s gathered into
one batch; and the one retry of a read that met a changed shard (``stale``). It
reads any shard that ``refs`` describes: a zarr array's, or a shard file of the
neuroglancer key-value store.

May import: ``errors``, ``formats`` (the interface), ``inner``, ``options``,
``tasks``; never the write path, the metadata, the store or the tools."""
