"""The read path: chunk bytes from cached shards, whole-shard fetches, or index-
located ranges; concurrent ``get()``s gathered into one batch."""
