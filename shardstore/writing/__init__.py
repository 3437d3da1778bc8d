"""The write path: chunk updates become shard commits (one in flight per shard,
concurrent updates merged; ``batch()`` holds them first).

May import: ``errors``, ``formats``, ``addressing``, ``inner``, ``sync_bridge``,
``tasks``; never the store, the read path or the tools."""
