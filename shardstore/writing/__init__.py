"""The write path: chunk updates become shard commits (one in flight per shard,
concurrent updates merged; ``batch()`` holds them first).

May import: ``errors``, ``choices``, ``formats`` (the interface), ``addressing``,
``inner``, ``sync_bridge``, ``tasks``; never the read path, the store or the tools.
Reads see what a ``batch()`` holds because the store consults it (``pending``)."""
