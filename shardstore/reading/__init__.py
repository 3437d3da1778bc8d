"""The read path: chunk bytes from cached shards, whole-shard fetches, or index-
located ranges; concurrent ``get()``s gathered into one batch; and the one retry of
a read that met a changed shard (``stale``).

May import: ``errors``, ``formats`` (the neuroglancer wing's ranged reader among
them), ``addressing``, ``inner``, ``options``, ``tasks``; never the store, the
write path or the tools."""
