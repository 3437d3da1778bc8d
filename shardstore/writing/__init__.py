"""The write path: chunk updates become shard commits (one in flight per shard,
concurrent updates merged; ``batch()`` holds them first)."""
