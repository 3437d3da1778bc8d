"""Helpers for tests and benchmarks (need the ``test`` extra): local object-store servers
behind a counting proxy. May import nothing of shardstore but each other."""
